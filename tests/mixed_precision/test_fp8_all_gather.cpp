// The fp8 all-gather of ZeRO-3 units through the engine (ShardingSpec::fp8_all_gather): the units
// gather half the bytes of bf16 (the communicator's counters), and what each rank computes with is,
// parameter by parameter, the whole fp32 master quantized to e4m3 with the parameter's own
// tensorwise scale (448 / amax) and dequantized to bf16 — computed here independently from the
// gathered masters with plain ATen casts.
#include "support/models.h"
#include "support/scoped_env.h"
#include "test_world.h"
#include "zero/sharded_optimizer.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <gtest/gtest.h>

namespace accel::test {
namespace {

struct Fp8Run {
  std::shared_ptr<MLPImpl> model;
  std::unique_ptr<torch::optim::AdamW> user;
  zero::EngineAndOptimizer p;
};

Fp8Run make_run(bool fp8) {
  Fp8Run r;
  at::manual_seed(7);
  r.model = std::make_shared<MLPImpl>(std::vector<int64_t>{8, 48, 40, 4});
  r.user = std::make_unique<torch::optim::AdamW>(r.model->parameters(), torch::optim::AdamWOptions(1e-2));
  zero::ShardingSpec spec = zero::ShardingSpec::zero(3);
  spec.param_dtype = at::kBFloat16;
  spec.reduce_dtype = at::kFloat;
  spec.master_dtype = at::kFloat;
  spec.fp8_all_gather = fp8;
  spec.reshard_after_forward = false;  // the units stay gathered after forward: their values can be read
  r.p = zero::prepare(r.model, *r.user, spec, world());
  return r;
}

at::Tensor batch(int seed, std::vector<int64_t> shape) {
  at::manual_seed(seed);
  return at::randn(shape);
}

void train_step(Fp8Run& r, int seed) {
  at::Tensor x = batch(seed, {6, 8}), y = batch(seed + 1, {6, 4});
  at::Tensor loss = at::mse_loss(r.model->forward(x.to(at::kBFloat16)).to(at::kFloat), y);
  r.p.engine->backward(loss);
  r.p.optimizer->step();
  r.p.optimizer->zero_grad();
}

// e4m3 with a tensorwise scale, by hand: q = e4m3(clamp(x * s, -448, 448)), back = float(q) / s.
at::Tensor fp8_round_trip(const at::Tensor& x) {
  const double amax = x.abs().max().item<double>();
  const float s = amax == 0 ? 1.0f : static_cast<float>(448.0 / amax);
  at::Tensor q = (x * s).clamp(-448, 448).to(at::kFloat8_e4m3fn);
  return q.to(at::kFloat) / s;
}

TEST(EngineFp8AllGather, HalfTheBytesOfBf16AndEachParameterIsItsMasterThroughE4m3) {
  // Private shards, all-gathered around each use: what this test counts (node-shared parameters,
  // the default on one node, gather nothing).
  test::ScopedEnv private_shards("ACCEL_NODE_SHARED_PARAMS", "0");
  const int n = world()->size();
  std::uint64_t bytes[2] = {0, 0};
  for (bool fp8 : {false, true}) {
    Fp8Run r = make_run(fp8);
    for (int s = 0; s < 3; ++s) train_step(r, 100 + 2 * s);  // masters that moved away from their init
    auto& g = *r.p.engine->gather_group();
    const auto c0 = g.counters();
    at::Tensor x = batch(200, {6, 8}), y = batch(201, {6, 4});
    at::Tensor out = r.model->forward(x.to(at::kBFloat16));
    bytes[fp8] =
        g.counters()[comm::Collective::AllGather].bytes_received - c0[comm::Collective::AllGather].bytes_received;

    // Each unit's parameters (gathered now) against its masters, gathered here in fp32.
    int checked = 0;
    for (const auto& f : r.p.engine->flats()) {
      if (f.unit == 0) continue;  // the root unit stays gathered in bf16 (it is not a sharded unit)
      at::Tensor full = at::empty({f.flat_param->layout().padded()}, at::TensorOptions().dtype(at::kFloat));
      if (n > 1)
        r.p.engine->gather_group()->all_gather(f.master, full);
      else
        full.copy_(f.master);
      for (std::size_t i = 0; i < f.flat_param->params().size(); ++i) {
        const at::Tensor& p = f.flat_param->params()[i];
        at::Tensor master = full.narrow(0, f.flat_param->layout().offset(i), p.numel());
        // One rank holds whole parameters and gathers nothing: fp8 is used only where bytes move.
        at::Tensor want = (fp8 && n > 1 ? fp8_round_trip(master) : master).to(at::kBFloat16);
        EXPECT_TRUE(at::equal(p.reshape({-1}), want))
            << f.flat_param->names()[i] << " (fp8 " << fp8 << "): max diff "
            << (p.reshape({-1}).to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
        if (fp8 && n > 1)  // e4m3 really changed something (3 mantissa bits against bf16's 7)
          EXPECT_FALSE(at::equal(p.reshape({-1}), master.to(at::kBFloat16))) << f.flat_param->names()[i];
        ++checked;
      }
    }
    EXPECT_EQ(checked, 6);  // three Linear units, weight and bias each
    at::Tensor loss = at::mse_loss(out.to(at::kFloat), y);
    r.p.engine->backward(loss);
    r.p.optimizer->step();
    r.p.optimizer->zero_grad();
  }
  if (n == 1) {
    EXPECT_EQ(bytes[0], 0u);
    EXPECT_EQ(bytes[1], 0u);
  } else {
    // Every unit's padded buffer once: 2 bytes per element in bf16, 1 in fp8.
    EXPECT_GT(bytes[0], 0u);
    EXPECT_EQ(bytes[1] * 2, bytes[0]);
  }
}

// While units hold fp8-gathered (dequantized) values, Engine::whole_values(Compute), which full
// checkpoints, save_model and get_state_dict read, gives the exact compute values: the bf16 shards,
// gathered (not the e4m3 round trip sitting in the gathered buffer).
TEST(EngineFp8AllGather, WholeValuesAreExactWhileUnitsHoldFp8) {
  const int n = world()->size();
  Fp8Run r = make_run(true);
  for (int s = 0; s < 2; ++s) train_step(r, 500 + 2 * s);
  at::Tensor out = r.model->forward(batch(600, {6, 8}).to(at::kBFloat16));  // units stay gathered (fp8)
  int checked = 0;
  for (const auto& f : r.p.engine->flats()) {
    if (f.unit == 0) continue;
    ASSERT_TRUE(f.flat_param->gathered());
    at::Tensor exact = at::empty({f.flat_param->layout().padded()}, f.flat_param->shard().options());
    if (n > 1)
      r.p.engine->gather_group()->all_gather(f.flat_param->shard(), exact);
    else
      exact.copy_(f.flat_param->shard());
    const at::Tensor got = r.p.engine->whole_values(f, zero::Engine::Source::Compute);
    EXPECT_TRUE(at::equal(got, exact)) << f.flat_param->name();
    if (n > 1)  // ... and the gathered buffer really holds something else (the e4m3 round trip)
      EXPECT_FALSE(at::equal(f.flat_param->full(), exact)) << f.flat_param->name();
    ++checked;
  }
  EXPECT_EQ(checked, 3);  // three Linear units
  r.p.engine->backward(at::mse_loss(out.to(at::kFloat), batch(601, {6, 4})));
  r.p.optimizer->step();
  r.p.optimizer->zero_grad();
}

TEST(EngineFp8AllGather, TrainsLikeBf16WithinE4m3Precision) {
  // Ten steps of the MLP with and without the fp8 gather: the losses stay close (fp8 weights in
  // compute perturb each weight by at most 2^-4 of its value, relative), yet are not identical
  // where the gather is used.
  std::vector<double> loss[2];
  for (bool fp8 : {false, true}) {
    Fp8Run r = make_run(fp8);
    for (int s = 0; s < 10; ++s) {
      at::Tensor x = batch(300 + s, {6, 8}), y = batch(400 + s, {6, 4});
      at::Tensor l = at::mse_loss(r.model->forward(x.to(at::kBFloat16)).to(at::kFloat), y);
      loss[fp8].push_back(l.item<double>());
      r.p.engine->backward(l);
      r.p.optimizer->step();
      r.p.optimizer->zero_grad();
    }
  }
  bool differs = false;
  for (std::size_t s = 0; s < loss[0].size(); ++s) {
    EXPECT_NEAR(loss[1][s], loss[0][s], 0.05 * loss[0][s]) << "step " << s;
    differs = differs || loss[1][s] != loss[0][s];
  }
  EXPECT_EQ(differs, world()->size() > 1);
}

}  // namespace
}  // namespace accel::test
