// Activation checkpointing per unit, against the same training without it: bitwise equal losses and
// parameters (fp32, dropout on inside the checkpointed blocks) under every strategy with gradient
// accumulation, the same collectives under ZeRO-3, at most half the activation peak, the same
// result under bf16; and the checkpoint function's edges.
#include "base/memory.h"
#include "mixed_precision/autocast.h"
#include "sharding/activation_checkpoint.h"
#include "support/harness.h"
#include "support/scoped_env.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace accel::test {
namespace {

using comm::Collective;
using zero::ShardingSpec;

// x + fc2(dropout(gelu(fc1(x)))): the dropout mask must be redrawn identically by the recompute.
struct DropBlockImpl : torch::nn::Module {
  DropBlockImpl(int64_t d, int64_t hidden, double p) : p(p) {
    fc1 = register_module("fc1", torch::nn::Linear(d, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, d));
  }
  at::Tensor forward(at::Tensor x) {
    ++calls;
    return x + fc2->forward(at::dropout(at::gelu(fc1->forward(x)), p, is_training()));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  double p;
  int calls = 0;
};

// in -> n blocks (units) -> head; `in` and `head` are the root unit.
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t n_blocks, int64_t d, int64_t hidden, bool checkpoint_units, double p = 0.25) {
    in = register_module("in", torch::nn::Linear(5, d));
    for (int64_t i = 0; i < n_blocks; ++i)
      blocks.push_back(
          accel::unit(register_module("b" + std::to_string(i), std::make_shared<DropBlockImpl>(d, hidden, p)),
                      accel::UnitOptions{.checkpoint = checkpoint_units}));
    head = register_module("head", torch::nn::Linear(d, 3));
  }
  at::Tensor forward(at::Tensor x) {
    x = in->forward(x);
    for (auto& b : blocks) x = b(x);
    return head->forward(x);
  }
  int block_calls() const {
    int n = 0;
    for (const auto& b : blocks) n += b->calls;
    return n;
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  std::vector<accel::Unit<DropBlockImpl>> blocks;
};

enum class Ckpt { None, PerUnit, Spec };
const char* name(Ckpt c) { return c == Ckpt::None ? "none" : c == Ckpt::PerUnit ? "per-unit" : "spec"; }

struct TrainRun {
  std::vector<at::Tensor> losses;
  std::vector<at::Tensor> state;  // flat shards and masters (prepared) or parameters (not prepared)
  int block_calls = 0;
};

struct TrainSetup {
  std::optional<ShardingSpec> spec;  // nullopt: the model is not prepared (plain libtorch training, local)
  int steps = 3, accum = 2;
  int64_t blocks = 3, d = 8, hidden = 16;
  std::optional<c10::ScalarType> autocast;  // bf16 autocast on the CPU around the forward
  c10::ScalarType input_dtype = at::kFloat;
};

TrainRun train_ckpt(const TrainSetup& s, Ckpt ckpt) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  at::manual_seed(1234);
  auto net = std::make_shared<NetImpl>(s.blocks, s.d, s.hidden, ckpt == Ckpt::PerUnit);
  net->to(test_device());
  // Every micro-batch up front, so that only the model draws from the RNG while training.
  const int64_t rows = 4 * N;
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int i = 0; i < s.steps * s.accum; ++i)
    batches.emplace_back(at::randn({rows, 5}).to(test_device()), at::randn({rows, 3}).to(test_device()));
  auto user_opt = make_optimizer(OptKind::AdamW, *net);
  std::optional<zero::EngineAndOptimizer> p;
  if (s.spec) {
    ShardingSpec spec = *s.spec;
    spec.activation_checkpointing = ckpt == Ckpt::Spec;
    p.emplace(zero::prepare(net, *user_opt, spec, world));
  }
  at::manual_seed(77 + r);  // dropout differs per rank, the same across the runs compared
  TrainRun out;
  for (int step = 0; step < s.steps; ++step) {
    for (int m = 0; m < s.accum; ++m) {
      auto [x, y] = batches[step * s.accum + m];
      x = x.narrow(0, r * 4, 4).to(s.input_dtype);
      y = y.narrow(0, r * 4, 4);
      at::Tensor loss;
      {
        std::optional<mixed_precision::AutocastScope> ac;
        if (s.autocast) ac.emplace(test_device().type(), *s.autocast);
        loss = at::mse_loss(net->forward(x).to(at::kFloat), y) / s.accum;
      }
      out.losses.push_back(loss.detach().clone());
      if (!p) {
        loss.backward();
      } else if (m + 1 < s.accum) {
        zero::Engine::NoSync ns(*p->engine);
        p->engine->backward(loss);
      } else {
        p->engine->backward(loss);
      }
    }
    (p ? *p->optimizer : *user_opt).step();
    (p ? *p->optimizer : *user_opt).zero_grad();
  }
  if (p) {
    for (const auto& f : p->engine->flats()) {
      out.state.push_back(f.flat_param->shard().clone());
      if (f.master.defined()) out.state.push_back(f.master.detach().clone());
    }
  } else {
    for (const auto& t : net->parameters()) out.state.push_back(t.detach().clone());
  }
  out.block_calls = net->block_calls();
  return out;
}

void expect_bitwise(const TrainRun& want, const TrainRun& got) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (std::size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_TRUE(at::equal(want.losses[i], got.losses[i]))
        << "loss " << i << ": " << want.losses[i].item<double>() << " vs " << got.losses[i].item<double>();
  ASSERT_EQ(want.state.size(), got.state.size());
  for (std::size_t i = 0; i < want.state.size(); ++i)
    EXPECT_TRUE(at::equal(want.state[i], got.state[i]))
        << "tensor " << i << " differs by " << (want.state[i] - got.state[i]).abs().max().item<double>();
}

std::vector<std::pair<std::string, std::optional<ShardingSpec>>> ckpt_strategies() {
  auto zero3 = ShardingSpec::zero(3);
  zero3.reshard_after_forward = false;
  auto full = ShardingSpec::fsdp("FULL_SHARD");
  full.bucket_bytes = 0;
  return {{"not prepared", std::nullopt},
          {"NO_SHARD/DDP", ShardingSpec::ddp()},
          {"ZeRO1", ShardingSpec::zero(1)},
          {"ZeRO2", ShardingSpec::zero(2)},
          {"SHARD_GRAD_OP", ShardingSpec::fsdp("SHARD_GRAD_OP")},
          {"ZeRO3 (no reshard)", zero3},
          {"FULL_SHARD", full},
          {"HYBRID_SHARD", ShardingSpec::fsdp("HYBRID_SHARD")}};
}

TEST(ActivationCheckpoint, TrainingIsBitwiseEqualWithDropoutUnderEveryStrategy) {
  for (const auto& [sname, spec] : ckpt_strategies()) {
    TrainSetup s;
    s.spec = spec;
    const TrainRun ref = train_ckpt(s, Ckpt::None);
    EXPECT_EQ(ref.block_calls, s.steps * s.accum * s.blocks);
    for (Ckpt c : {Ckpt::PerUnit, Ckpt::Spec}) {
      if (!spec && c == Ckpt::Spec) continue;  // the spec switch needs an engine
      SCOPED_TRACE(sname + " " + name(c));
      const TrainRun got = train_ckpt(s, c);
      // Every block forward ran twice: checkpointing was on.
      EXPECT_EQ(got.block_calls, 2 * ref.block_calls);
      expect_bitwise(ref, got);
    }
  }
}

// The GPT example's attention fused (at::scaled_dot_product_attention) or written out, in float64
// under ZeRO-3 with dropout in the blocks: the fused one follows the written-out one to rounding,
// and activation checkpointing recomputes it bitwise.
struct GptRun {
  std::vector<double> losses;
  std::vector<at::Tensor> state;
};
GptRun train_gpt(examples::Attention attention, bool checkpoint) {
  auto world = test::world();
  const int r = world->rank();
  at::manual_seed(99);
  auto gpt = std::make_shared<GPTImpl>(examples::GPTConfig{13, 16, 4, 2, 8, false, 0.1, attention});
  gpt->to(test_device(), at::kDouble);
  auto opt = make_optimizer(OptKind::AdamW, *gpt);
  ShardingSpec spec = ShardingSpec::zero(3);
  spec.activation_checkpointing = checkpoint;
  auto p = zero::prepare(gpt, *opt, spec, world);
  at::manual_seed(5 + r);  // tokens and dropout per rank, the same across the runs compared
  GptRun out;
  for (int step = 0; step < 3; ++step) {
    const at::Tensor tokens = at::randint(13, {2, 8}, at::kLong).to(test_device());
    const at::Tensor loss = lm_loss(gpt->forward(tokens), tokens.roll(-1, 1));
    out.losses.push_back(loss.item<double>());
    p.engine->backward(loss);
    p.optimizer->step();
    p.optimizer->zero_grad();
  }
  for (const auto& f : p.engine->flats()) out.state.push_back(f.flat_param->shard().clone());
  return out;
}

TEST(ActivationCheckpoint, GptAttentionFusedFollowsWrittenOutAndRecomputesBitwise) {
  using examples::Attention;
  const GptRun eager = train_gpt(Attention::Eager, false), fused = train_gpt(Attention::Sdpa, false);
  ASSERT_EQ(eager.losses.size(), fused.losses.size());
  for (std::size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(fused.losses[i], eager.losses[i], 1e-12 * std::abs(eager.losses[i])) << "step " << i;
  ASSERT_EQ(eager.state.size(), fused.state.size());
  for (std::size_t i = 0; i < eager.state.size(); ++i)
    EXPECT_LE((fused.state[i] - eager.state[i]).abs().max().item<double>(), 1e-12) << "shard " << i;
  // Checkpointed: the recompute runs the same fused kernel on the same inputs.
  const GptRun fused_ckpt = train_gpt(Attention::Sdpa, true);
  EXPECT_EQ(fused_ckpt.losses, fused.losses);
  for (std::size_t i = 0; i < fused.state.size(); ++i)
    EXPECT_TRUE(at::equal(fused_ckpt.state[i], fused.state[i])) << "shard " << i;
}

TEST(ActivationCheckpoint, SameResultUnderBf16) {
  TrainSetup autocast;
  autocast.spec = ShardingSpec::ddp();
  autocast.autocast = at::kBFloat16;
  TrainSetup bf16;
  auto full = ShardingSpec::fsdp("FULL_SHARD");
  full.param_dtype = at::kBFloat16;
  bf16.spec = full;
  bf16.input_dtype = at::kBFloat16;
  for (const auto& [sname, s] :
       {std::pair{"bf16 autocast, DDP", autocast}, std::pair{"bf16 params, FULL_SHARD", bf16}}) {
    SCOPED_TRACE(sname);
    const TrainRun ref = train_ckpt(s, Ckpt::None);
    const TrainRun got = train_ckpt(s, Ckpt::PerUnit);
    EXPECT_EQ(got.block_calls, 2 * ref.block_calls);
    expect_bitwise(ref, got);
  }
}

// ZeRO-3 with checkpointing issues exactly the collectives of ZeRO-3 without: the recompute runs in
// backward on the parameters the unit's pre-backward hook gathers anyway (it fires on the
// checkpoint's outputs before the checkpoint node runs). Per micro-step that is one all-gather per
// flat parameter of the units in forward, and with reshard_after_forward one more in backward
// (without it the units stay gathered from forward until their gradients are reduced); the root unit
// is gathered once after each step. Here: 3 units of 2 flats each, so 12 all-gathers per micro-step
// with reshard_after_forward, 6 without, with or without checkpointing.
TEST(ActivationCheckpoint, Zero3CollectivesAreTheSameAsWithout) {
  // Private shards, all-gathered around each use: what this test counts (node-shared parameters,
  // the default on one node, gather nothing).
  test::ScopedEnv private_shards("ACCEL_NODE_SHARED_PARAMS", "0");
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (bool reshard : {true, false}) {
    std::vector<std::vector<std::uint64_t>> counts[2];  // per checkpointing, per micro-step and step: ag, rs, ar
    for (int ck = 0; ck < 2; ++ck) {
      SCOPED_TRACE(::testing::Message() << "reshard " << reshard << " checkpoint " << ck);
      at::manual_seed(1234);
      auto net = std::make_shared<NetImpl>(3, 8, 16, ck == 1);
      net->to(test_device());
      auto user_opt = make_optimizer(OptKind::AdamW, *net);
      auto spec = ShardingSpec::zero(3);
      spec.reshard_after_forward = reshard;
      spec.bucket_bytes = 0;
      auto p = zero::prepare(net, *user_opt, spec, world);
      std::uint64_t unit_flats = 0;
      for (std::size_t u = 1; u < p.engine->units().size(); ++u) unit_flats += p.engine->units()[u].flats.size();
      ASSERT_EQ(p.engine->units().size(), 4u);
      const std::uint64_t flats = p.engine->flats().size();
      auto& gather = *p.engine->gather_group();
      auto& shard = *p.engine->shard_group();
      auto snap = [&] {
        comm::Counters g = gather.counters(), s = shard.counters();
        std::uint64_t ag = g[Collective::AllGather].calls + (&gather != &shard ? s[Collective::AllGather].calls : 0);
        return std::vector<std::uint64_t>{ag, s[Collective::ReduceScatter].calls, s[Collective::AllReduce].calls};
      };
      auto delta = [](std::vector<std::uint64_t> a, const std::vector<std::uint64_t>& b) {
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] - a[i];
        return a;
      };
      for (int step = 0; step < 2; ++step) {
        for (int m = 0; m < 2; ++m) {
          at::manual_seed(10 + step * 2 + m);
          at::Tensor x = at::randn({4 * N, 5}).narrow(0, r * 4, 4).to(test_device()),
                     y = at::randn({4 * N, 3}).narrow(0, r * 4, 4).to(test_device());
          auto before = snap();
          {
            std::optional<zero::Engine::NoSync> ns;
            if (m == 0) ns.emplace(*p.engine);
            p.engine->backward(at::mse_loss(net->forward(x), y));
          }
          auto d = delta(before, snap());
          const std::uint64_t want_ag = N > 1 ? unit_flats * (reshard ? 2 : 1) : 0;
          EXPECT_EQ(d[0], want_ag) << "all-gathers, micro-step " << m;
          // Gradients: one reduce-scatter per flat parameter on the sync micro-step only.
          EXPECT_EQ(d[1], N > 1 && m == 1 ? flats : 0) << "reduce-scatters, micro-step " << m;
          counts[ck].push_back(d);
        }
        auto before = snap();
        p.optimizer->step();
        p.optimizer->zero_grad();
        auto d = delta(before, snap());
        EXPECT_EQ(d[0], N > 1 ? flats - unit_flats : 0) << "all-gathers, step (the root unit)";
        counts[ck].push_back(d);
      }
      EXPECT_EQ(net->block_calls(), (ck ? 2 : 1) * 3 * 4);
    }
    EXPECT_EQ(counts[0], counts[1]) << "reshard " << reshard;
  }
}

// The activation peak of a step (forward and backward) with >= 4 checkpointed blocks is at most half
// the peak without: only the blocks' inputs are kept, and one block's activations are live again
// while it is recomputed.
TEST(ActivationCheckpoint, HalvesTheActivationPeak) {
  if (!test_device().is_cpu()) GTEST_SKIP() << "counts the CPU allocator's activations";
  memory::install_counting_allocator();
  auto world = test::world();
  const int r = world->rank();
  std::int64_t peak[2] = {0, 0};
  for (int ck = 0; ck < 2; ++ck) {
    at::manual_seed(1234);
    auto net = std::make_shared<NetImpl>(6, 32, 256, ck == 1);
    auto user_opt = make_optimizer(OptKind::SGD, *net);
    auto p = zero::prepare(net, *user_opt, ShardingSpec::zero(3), world);
    at::manual_seed(5 + r);
    at::Tensor x = at::randn({64, 5}), y = at::randn({64, 3});
    p.engine->backward(at::mse_loss(net->forward(x), y));  // warm up (the first step allocates state)
    p.optimizer->step();
    p.optimizer->zero_grad();
    memory::reset_peaks();
    const auto before = memory::snapshot()[memory::Category::Activations];
    p.engine->backward(at::mse_loss(net->forward(x), y));
    peak[ck] = memory::snapshot()[memory::Category::Activations].peak - before.current;
    p.optimizer->step();
    p.optimizer->zero_grad();
  }
  EXPECT_GT(peak[0], 0);
  EXPECT_GT(peak[1], 0);
  EXPECT_LE(2 * peak[1], peak[0]) << "activation peak with checkpointing " << peak[1] << " B, without " << peak[0]
                                  << " B";
}

// A unit holding a unit: in -> outer(inner block, then fc) -> head.
struct OuterImpl : torch::nn::Module {
  OuterImpl(bool checkpoint_inner) {
    inner = accel::unit(register_module("inner", std::make_shared<DropBlockImpl>(8, 16, 0.25)),
                        accel::UnitOptions{.checkpoint = checkpoint_inner});
    fc = register_module("fc", torch::nn::Linear(8, 8));
  }
  at::Tensor forward(at::Tensor x) { return x + fc->forward(at::gelu(inner(x))); }
  accel::Unit<DropBlockImpl> inner;
  torch::nn::Linear fc{nullptr};
};
struct NestedNetImpl : torch::nn::Module {
  NestedNetImpl(bool checkpoint_outer, bool checkpoint_inner) {
    in = register_module("in", torch::nn::Linear(5, 8));
    outer = accel::unit(register_module("outer", std::make_shared<OuterImpl>(checkpoint_inner)),
                        accel::UnitOptions{.checkpoint = checkpoint_outer});
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(at::Tensor x) { return head->forward(outer(in->forward(x))); }
  torch::nn::Linear in{nullptr}, head{nullptr};
  accel::Unit<OuterImpl> outer;
};

// Nested units: the spec-wide switch checkpoints the outermost one only (the inner block runs twice
// per micro-step, not three times), with the results of training without checkpointing, bitwise;
// marking units inside one another for checkpointing is refused by name when the model is prepared.
TEST(ActivationCheckpoint, NestedUnitsTheSwitchTakesTheOutermostAndNestedMarksAreRefused) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (auto [sname, base] :
       std::vector<std::pair<std::string, ShardingSpec>>{{"ZeRO3", ShardingSpec::zero(3)},
                                                         {"FULL_SHARD", ShardingSpec::fsdp("FULL_SHARD")},
                                                         {"DDP", ShardingSpec::ddp()}}) {
    SCOPED_TRACE(sname);
    std::vector<at::Tensor> results[2];
    int inner_calls[2] = {0, 0};
    for (int ck = 0; ck < 2; ++ck) {
      at::manual_seed(1234);
      auto net = std::make_shared<NestedNetImpl>(false, false);
      net->to(test_device());
      auto user_opt = make_optimizer(OptKind::AdamW, *net);
      ShardingSpec spec = base;
      spec.activation_checkpointing = ck == 1;
      auto p = zero::prepare(net, *user_opt, spec, world);
      ASSERT_EQ(p.engine->units().size(), 3u);  // root, outer, outer.inner
      at::manual_seed(77 + r);
      for (int step = 0; step < 2; ++step) {
        at::Tensor x = at::randn({4 * N, 5}).narrow(0, r * 4, 4).to(test_device());
        at::Tensor y = at::randn({4 * N, 3}).narrow(0, r * 4, 4).to(test_device());
        at::Tensor loss = at::mse_loss(net->forward(x), y);
        results[ck].push_back(loss.detach().clone());
        p.engine->backward(loss);
        p.optimizer->step();
        p.optimizer->zero_grad();
      }
      for (const auto& f : p.engine->flats()) results[ck].push_back(f.flat_param->shard().clone());
      inner_calls[ck] = net->outer->inner->calls;
    }
    EXPECT_EQ(inner_calls[0], 2);
    EXPECT_EQ(inner_calls[1], 4) << "the inner unit ran " << inner_calls[1] << " times in 2 steps";
    ASSERT_EQ(results[0].size(), results[1].size());
    for (std::size_t i = 0; i < results[0].size(); ++i) EXPECT_TRUE(at::equal(results[0][i], results[1][i])) << i;
  }
  for (const auto& [outer, spec_wide] : {std::pair{true, false}, std::pair{false, true}}) {
    auto net = std::make_shared<NestedNetImpl>(outer, true);
    auto user_opt = make_optimizer(OptKind::SGD, *net);
    ShardingSpec spec = ShardingSpec::zero(3);
    spec.activation_checkpointing = spec_wide;
    try {
      zero::prepare(net, *user_opt, spec, world);
      ADD_FAILURE() << "nested checkpointed units were accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("unit 'outer.inner' is checkpointed inside unit 'outer'"), std::string::npos)
          << e.what();
    }
  }
}

// --- the checkpoint function's edges -------------------------------------------------------------

TEST(ActivationCheckpointFunction, GradientsOfInputsAndParamsMatchAutograd) {
  at::manual_seed(3);
  at::Tensor w = at::randn({4, 4}).requires_grad_(true);
  at::Tensor a = at::randn({2, 4}).requires_grad_(true);
  at::Tensor b = at::randn({2, 4});  // needs no gradient
  auto fn = [&](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    at::Tensor h = at::matmul(in[0], w) + in[1];
    return {at::tanh(h), h.detach() * 2, at::relu(h)};  // the second output does not require grad
  };
  auto outs = sharding::checkpoint(fn, {a, b}, {w}, "test");
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_TRUE(outs[0].requires_grad());
  EXPECT_FALSE(outs[0].grad_fn() == nullptr);
  // Output 1 does not require grad in the recompute: it passes none. Output 2 gets no gradient (an
  // undefined grad_output).
  (outs[0].sum() + outs[1].sum()).backward();
  at::Tensor ga = a.grad().clone(), gw = w.grad().clone();
  a.mutable_grad() = at::Tensor();
  w.mutable_grad() = at::Tensor();
  auto plain = fn({a, b});
  EXPECT_FALSE(plain[1].requires_grad());
  (plain[0].sum() + plain[1].sum()).backward();
  EXPECT_TRUE(at::equal(ga, a.grad()));
  EXPECT_TRUE(at::equal(gw, w.grad()));
  EXPECT_FALSE(b.grad().defined());
}

TEST(ActivationCheckpointFunction, WithoutGradModeItIsThePlainCall) {
  at::Tensor w = at::randn({3}).requires_grad_(true);
  at::NoGradGuard no_grad;
  int calls = 0;
  auto outs = sharding::checkpoint(
      [&](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
        ++calls;
        return {in[0] * w};
      },
      {at::ones({3})}, {w});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(outs[0].requires_grad());
}

TEST(ActivationCheckpointFunction, RefusesALeafItCannotReturnAGradientFor) {
  at::Tensor w = at::randn({3}).requires_grad_(true), captured = at::randn({3}).requires_grad_(true);
  auto outs = sharding::checkpoint(
      [&](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> { return {in[0] * w * captured}; },
      {at::ones({3})}, {w}, "Captured");
  try {
    outs[0].sum().backward();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("activation checkpointing of Captured"), std::string::npos) << e.what();
  }
}

struct TwoArgImpl : torch::nn::Module {
  TwoArgImpl() { fc = register_module("fc", torch::nn::Linear(3, 3)); }
  // A non-tensor argument between tensors: captured by value, passed again to the recompute.
  at::Tensor forward(const at::Tensor& x, double scale, at::Tensor y) { return fc->forward(x) * scale + y; }
  torch::nn::Linear fc{nullptr};
};
struct PairImpl : torch::nn::Module {
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor x) { return {x, x}; }
};

TEST(ActivationCheckpointUnit, SplitsTensorArgumentsFromOthers) {
  at::manual_seed(4);
  auto m = std::make_shared<TwoArgImpl>();
  auto plain = accel::unit(m);
  at::Tensor x = at::randn({2, 3}).requires_grad_(true), y = at::randn({2, 3}).requires_grad_(true);
  plain(x, 0.5, y).pow(2).sum().backward();
  at::Tensor gx = x.grad().clone(), gy = y.grad().clone(), gw = m->fc->weight.grad().clone();
  x.mutable_grad() = y.mutable_grad() = m->fc->weight.mutable_grad() = at::Tensor();
  auto ck = accel::unit(m, {.checkpoint = true});  // the same slot: now checkpointed
  EXPECT_TRUE(ck.checkpointed());
  EXPECT_TRUE(plain.checkpointed());
  at::Tensor out = ck(x, 0.5, y);
  EXPECT_NE(out.grad_fn()->name().find("CheckpointFunction"), std::string::npos) << out.grad_fn()->name();
  out.pow(2).sum().backward();
  EXPECT_TRUE(at::equal(gx, x.grad()));
  EXPECT_TRUE(at::equal(gy, y.grad()));
  EXPECT_TRUE(at::equal(gw, m->fc->weight.grad()));
}

TEST(ActivationCheckpointUnit, RefusesOtherOutputTypes) {
  auto u = accel::unit(std::make_shared<PairImpl>(), {.checkpoint = true});
  EXPECT_THROW(u(at::ones({2}).requires_grad_(true)), std::logic_error);
  at::NoGradGuard no_grad;  // without grad there is nothing to checkpoint
  EXPECT_NO_THROW(u(at::ones({2})));
}

}  // namespace
}  // namespace accel::test
