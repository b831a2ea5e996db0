// Parity, the spine: every strategy x world size x accumulation x optimizer trains to the same
// parameters as a single-process libtorch reference on the same global batch, and each rank's
// parameter and gradient shards equal the reference's slices.
#include "kernels/cpu_gemm.h"
#include "support/harness.h"
#include "support/scoped_env.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace accel::test {
namespace {

using zero::ShardingSpec;

struct StrategyCase {
  std::string name;
  std::function<ShardingSpec()> make;
  int group = 0;         // shard groups of this many ranks (ShardingSpec::shard_group_size): worlds it divides only
  bool by_node = false;  // shard groups are the ranks of a node (HYBRID_SHARD, HYBRID_SHARD_ZERO2)
  bool fits(int world) const { return group == 0 || world % group == 0; }
};

ShardingSpec in_groups(ShardingSpec s, int ranks) {
  s.shard_group_size = ranks;  // blocks of consecutive ranks, replicated across the blocks
  return s;
}

ShardingSpec with_bucket(ShardingSpec s, std::int64_t bytes) {
  s.bucket_bytes = bytes;  // 0: one collective per flat parameter
  return s;
}

// Each named strategy also varies a knob (bucket size, reshard_after_forward) to cover more paths.
std::vector<StrategyCase> strategies() {
  return {
      {"DDP", [] { return ShardingSpec::ddp(); }},  // one fused bucket (staging path)
      {"NO_SHARD", [] { return with_bucket(ShardingSpec::fsdp("NO_SHARD"), 0); }},
      {"ZeRO1", [] { return ShardingSpec::zero(1); }},
      {"ZeRO2", [] { return with_bucket(ShardingSpec::zero(2), 0); }},
      {"SHARD_GRAD_OP", [] { return with_bucket(ShardingSpec::fsdp("SHARD_GRAD_OP"), 300); }},
      {"ZeRO3",
       [] {
         auto s = ShardingSpec::zero(3);
         s.reshard_after_forward = false;
         return s;
       }},
      {"FULL_SHARD", [] { return with_bucket(ShardingSpec::fsdp("FULL_SHARD"), 0); }},
      {"HYBRID_SHARD", [] { return with_bucket(ShardingSpec::fsdp("HYBRID_SHARD"), 0); }, 0, true},
      // FSDP2's HSDP / DeepSpeed's MiCS (ZeRO-3 in blocks of 2 ranks), and ZeRO-2 in blocks of 2: at 4
      // ranks two copies average their shards' gradients.
      {"HybridGroupsOf2", [] { return in_groups(ShardingSpec::zero(3), 2); }, 2},
      {"HybridZeRO2GroupsOf2", [] { return in_groups(with_bucket(ShardingSpec::zero(2), 300), 2); }, 2},
      // Groups of one rank (dp_shard_size 1, mics_shard_size 1): every rank a whole copy, averaged across
      // the copies with no collective inside a group.
      {"ZeRO3GroupsOf1", [] { return in_groups(ShardingSpec::zero(3), 1); }, 1},
      // FSDP's HYBRID_SHARD_ZERO2: ZeRO-2 inside each node (across simulated nodes in sharding_*2nodes*).
      {"HYBRID_SHARD_ZERO2", [] { return ShardingSpec::fsdp(zero::kHybridShardZero2); }, 0, true},
  };
}

// How the micro-steps before the last of an accumulation window run: unreduced (NoSync), or each
// reducing and adding to what is pending (MoreMicroSteps: DeepSpeed's ZeRO-2/3, sync_each_batch).
enum class Accumulate { NoSync, EachMicroStepReduces };

// The reductions (all-reduce and reduce-scatter calls) the engine's groups have issued so far.
std::uint64_t reductions(zero::Engine& e) {
  std::uint64_t calls = 0;
  std::vector<comm::Communicator*> seen;
  for (auto* g : {e.shard_group().get(), e.replicate_group().get()})
    if (g && std::find(seen.begin(), seen.end(), g) == seen.end()) {
      seen.push_back(g);
      calls += g->counters()[comm::Collective::AllReduce].calls + g->counters()[comm::Collective::ReduceScatter].calls;
    }
  return calls;
}

// Trains `steps` steps both ways; returns the worst relative errors (parameters, gradient shards).
void run_parity(const StrategyCase& sc, ModelKind mk, OptKind ok, int accum, c10::ScalarType dtype, double tol,
                const std::vector<int64_t>& widths = {6, 10, 10, 3}, int64_t G = 12,
                Accumulate how = Accumulate::NoSync) {
  SCOPED_TRACE(::testing::Message() << sc.name << " " << name(mk) << " " << name(ok) << " accum " << accum << " "
                                    << c10::toString(dtype)
                                    << (how == Accumulate::NoSync ? "" : " each micro-step reducing"));
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  if (!sc.fits(N)) return;  // (the TEST_Ps skip it; the loops over every strategy pass over it)
  const int64_t local = G / N;
  const int steps = 5;

  Model ref = make_model(mk, dtype, widths);
  auto ref_opt = make_optimizer(ok, *ref.module);
  Model mdl = make_model(mk, dtype, widths);
  auto user_opt = make_optimizer(ok, *mdl.module);
  auto prepared = zero::prepare(mdl.module, *user_opt, sc.make(), world);
  auto& engine = *prepared.engine;
  auto& opt = *prepared.optimizer;
  if (sc.group > 0) {  // blocks of consecutive ranks, and the ranks at the same place in every block
    ASSERT_EQ(engine.shard_group()->size(), sc.group);
    EXPECT_EQ(engine.shard_group()->rank(), r % sc.group);
    if (N > sc.group) {
      ASSERT_TRUE(engine.replicate_group());
      EXPECT_EQ(engine.replicate_group()->size(), N / sc.group);
      EXPECT_EQ(engine.replicate_group()->rank(), r / sc.group);
    } else {
      EXPECT_FALSE(engine.replicate_group()) << "one block holds every rank: nothing to replicate";
    }
  }
  if (sc.by_node) {  // the ranks of this node, and this local rank on every node
    const comm::Topology& topo = world->topology();
    ASSERT_EQ(engine.shard_group()->size(), topo.local_world_size);
    EXPECT_EQ(engine.shard_group()->rank(), topo.local_rank);
    const int nodes = N / topo.local_world_size;
    if (nodes > 1) {
      ASSERT_TRUE(engine.replicate_group());
      EXPECT_EQ(engine.replicate_group()->size(), nodes);
    } else {  // (one node: a replicate group of one rank, or none)
      EXPECT_TRUE(!engine.replicate_group() || engine.replicate_group()->size() == 1);
    }
  }

  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < accum; ++m) {
      auto [x, y] = make_batch(mk, dtype, step, m, G, widths.front(), widths.back());
      (ref.loss(x, y) / accum).backward();
      at::Tensor xl = x.narrow(0, r * local, local), yl = y.narrow(0, r * local, local);
      if (m + 1 < accum && how == Accumulate::NoSync) {
        zero::Engine::NoSync ns(engine);
        const std::uint64_t before = reductions(engine);
        engine.backward(mdl.loss(xl, yl) / accum);
        EXPECT_EQ(reductions(engine), before) << "a reduction under NoSync";
      } else if (m + 1 < accum) {
        zero::Engine::MoreMicroSteps more(engine);
        const std::uint64_t before = reductions(engine);
        engine.backward(mdl.loss(xl, yl) / accum);
        if (N > 1 && !engine.plan().passthrough)
          EXPECT_GT(reductions(engine), before) << "micro-step " << m << " did not reduce";
      } else {
        engine.backward(mdl.loss(xl, yl) / accum);
      }
    }
    if (step == steps - 1) {
      // Gradient shards (what this rank's optimizer steps on) against the reference's slices.
      auto ref_grads = grads_by_name(*ref.module);
      if (engine.plan().passthrough)  // a world of one: the parameters keep autograd's own gradients
        for (auto& [n, p] : params_by_name(*mdl.module)) EXPECT_LE(rel_err(p.grad(), ref_grads.at(n)), tol) << n;
      for (const auto& f : engine.flats()) {
        if (!f.master.defined()) continue;
        at::Tensor want = flatten_like(*f.flat_param, ref_grads);
        if (engine.spec().shards_optimizer()) want = own_slice(*f.flat_param, want);
        ASSERT_TRUE(f.master.grad().defined()) << f.flat_param->name();
        EXPECT_LE(rel_err(f.master.grad(), want), tol)
            << "gradient shard of " << f.flat_param->name() << " on rank " << r;
      }
    }
    ref_opt->step();
    ref_opt->zero_grad();
    opt.step();
    opt.zero_grad();
  }
  if (sc.group == 1) {  // nothing reduced inside a group of one: the copies average across groups only
    const auto& c = engine.shard_group()->counters();
    EXPECT_EQ(c[comm::Collective::ReduceScatter].calls + c[comm::Collective::AllReduce].calls, 0u);
  }
  // Parameter shards against the reference's slices, and the full parameters where they are kept.
  auto ref_params = params_by_name(*ref.module);
  for (const auto& f : engine.flats())
    EXPECT_LE(rel_err(f.flat_param->shard(), own_slice(*f.flat_param, flatten_like(*f.flat_param, ref_params))), tol)
        << "parameter shard of " << f.flat_param->name() << " on rank " << r;
  if (!engine.spec().shards_parameters())
    for (auto& [n, p] : params_by_name(*mdl.module)) EXPECT_LE(rel_err(p, ref_params.at(n)), tol) << n;
  // A forward after training (gathering every unit) gives the reference's loss.
  auto [x, y] = make_batch(mk, dtype, 99, 0, G, widths.front(), widths.back());
  at::Tensor xl = x.narrow(0, r * local, local), yl = y.narrow(0, r * local, local);
  EXPECT_LE(rel_err(mdl.loss(xl, yl).detach(), ref.loss(xl, yl).detach()), tol);
}

class Parity : public ::testing::TestWithParam<std::tuple<int, ModelKind>> {};

TEST_P(Parity, Float64MatchesReference) {
  const StrategyCase sc = strategies()[std::get<0>(GetParam())];
  if (!sc.fits(world()->size())) GTEST_SKIP() << "shard groups of " << sc.group << " ranks";
  for (int accum : {1, 3})
    for (OptKind ok : {OptKind::AdamW, OptKind::SGD})
      run_parity(sc, std::get<1>(GetParam()), ok, accum, at::kDouble, 1e-10);
}

TEST_P(Parity, Float32MatchesReference) {
  const StrategyCase sc = strategies()[std::get<0>(GetParam())];
  if (!sc.fits(world()->size())) GTEST_SKIP() << "shard groups of " << sc.group << " ranks";
  run_parity(sc, std::get<1>(GetParam()), OptKind::AdamW, 2, at::kFloat, 1e-5);
}

// Accumulation whose micro-steps each reduce and add to what is pending (Engine::MoreMicroSteps, which
// Accelerate's sync_each_batch and DeepSpeed's ZeRO-2/3 take) trains as the reference does, as NoSync
// does, for every strategy: the window's gradient is the sum of the micro-steps' averages instead of the
// average of their sums, the same to float64 rounding. Each micro-step's reductions are counted.
TEST(AccumulationParity, EachMicroStepReducingMatchesTheReference) {
  for (const auto& sc : strategies())
    for (ModelKind mk : {ModelKind::MLP, ModelKind::GPT})
      run_parity(sc, mk, OptKind::AdamW, 3, at::kDouble, 1e-10, {6, 10, 10, 3}, 12, Accumulate::EachMicroStepReduces);
}

// Products large enough for oneDNN's matmul (ACCEL_CPU_GEMM=onednn sends float32 products of >= 2^20
// multiply-adds there once an engine is built, the reference's too: the switch is process-wide):
// ZeRO-3 and FULL_SHARD still follow the single-process reference, and oneDNN really ran.
TEST(OneDnnParity, LargeProductsThroughOneDnnFollowTheReference) {
  if (!test_device().is_cpu()) GTEST_SKIP() << "a CPU matmul path";
  if (!cpu_gemm::onednn_available()) GTEST_SKIP() << "this libtorch has no oneDNN matmul";
  const cpu_gemm::Path before = cpu_gemm::installed();
  {
    ScopedEnv gemm("ACCEL_CPU_GEMM", "onednn");
    const std::uint64_t calls = cpu_gemm::onednn_calls();
    // 96 rows over 1-4 ranks (at least 24 each: oneDNN takes no dimension under 16) through 256 -> 512:
    // 24 x 256 x 512 = 3.1M multiply-adds per rank. SGD: linear in the gradients, so the reduction order
    // shows at rounding level (AdamW's normalization would magnify it in the near-zero gradients): the
    // worst relative error measured at 2 and 4 ranks was 4.5e-7, hence 2e-6.
    const std::vector<int64_t> widths{256, 512, 512, 16};
    for (const auto& sc : strategies())
      if (sc.name == "ZeRO3" || sc.name == "FULL_SHARD")
        run_parity(sc, ModelKind::MLP, OptKind::SGD, 2, at::kFloat, 2e-6, widths, 96);
    EXPECT_GT(cpu_gemm::onednn_calls(), calls) << "no product went through oneDNN";
  }
  cpu_gemm::install(before);  // (process-wide: the tests after this one keep the path they had)
}

INSTANTIATE_TEST_SUITE_P(Strategies, Parity,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(strategies().size())),
                                            ::testing::Values(ModelKind::MLP, ModelKind::GPT)),
                         [](const auto& info) {
                           return strategies()[std::get<0>(info.param)].name + "_" + name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace accel::test
