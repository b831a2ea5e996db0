// ShardingSpec::step_in_backward: each master's step posted as its gradient is final, during backward,
// gives the bits of the step taken in optimizer.step(), for every sharded strategy and the fused
// optimizers; what it cannot serve (replicated optimizer state, other optimizers, clipping after it, a
// second backward before the step) is refused by name.
#include "optim/fused_step.h"
#include "support/harness.h"
#include "zero/step_worker.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace accel::test {
namespace {

using zero::ShardingSpec;

// bf16 parameters over fp32 masters of their own: the masters are stepped on the host in either mode.
std::shared_ptr<MLPImpl> bf16_mlp() {
  at::manual_seed(5);
  auto m = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 16, 16, 3});
  m->to(test_device(), at::kBFloat16);
  return m;
}

std::unique_ptr<torch::optim::Optimizer> optimizer_of(int kind, torch::nn::Module& m) {
  if (kind == 0) return std::make_unique<torch::optim::AdamW>(m.parameters(), torch::optim::AdamWOptions(1e-2));
  return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
}

ShardingSpec with_bf16(ShardingSpec s, bool in_backward) {
  s.master_dtype = at::kFloat;
  s.step_in_backward = in_backward;
  return s;
}

struct Result {
  std::vector<at::Tensor> masters, states;
  std::vector<double> losses;
};

// accum > 1: each step's window has that many micro-batches, those before the last reducing and adding
// up (Engine::MoreMicroSteps), with no step in their backward.
Result train_steps(const ShardingSpec& spec, int kind, std::shared_ptr<comm::Communicator> world, int accum = 1) {
  auto mdl = bf16_mlp();
  auto user = optimizer_of(kind, *mdl);
  auto p = zero::prepare(mdl, *user, spec, world);
  const int N = world->size(), r = world->rank();
  Result out;
  std::size_t optimized = 0;
  for (const auto& f : p.engine->flats()) optimized += f.group >= 0 ? 1 : 0;
  for (int step = 0; step < 3; ++step) {
    for (int m = 0; m + 1 < accum; ++m) {
      auto [x, y] = make_batch(ModelKind::MLP, at::kBFloat16, step, m);
      const int64_t local = x.size(0) / N;
      zero::Engine::MoreMicroSteps more(*p.engine);
      p.engine->backward(at::mse_loss(mdl->forward(x.narrow(0, r * local, local)), y.narrow(0, r * local, local)) /
                         accum);
      EXPECT_TRUE(p.engine->stepped_in_backward().empty()) << "a step before the window's last micro-step";
    }
    auto [x, y] = make_batch(ModelKind::MLP, at::kBFloat16, step, accum - 1);
    const int64_t local = x.size(0) / N;
    at::Tensor loss = at::mse_loss(mdl->forward(x.narrow(0, r * local, local)), y.narrow(0, r * local, local));
    out.losses.push_back(loss.item<double>());
    p.engine->backward(loss / accum);
    // In this mode every master was stepped during the backward that just returned, and those steps are
    // done: the masters read now are the ones after the step. (After micro-steps that reduced too: each
    // reduced gradient is added to the pending one as its bucket finishes, and the sum is stepped.)
    const bool stepped = spec.step_in_backward;
    EXPECT_EQ(p.engine->stepped_in_backward().size(), stepped ? optimized : 0u) << "step " << step;
    std::vector<at::Tensor> seen;
    for (const auto& f : p.engine->flats())
      if (f.group >= 0) seen.push_back(f.master.clone());
    p.optimizer->step();
    if (stepped) {
      std::size_t k = 0;
      for (const auto& f : p.engine->flats())
        if (f.group >= 0) EXPECT_TRUE(at::equal(seen[k++], f.master)) << "a step still running after backward returned";
    }
    EXPECT_TRUE(p.engine->stepped_in_backward().empty());
    p.optimizer->zero_grad();
  }
  for (const auto& f : p.engine->flats()) {
    if (f.group < 0) continue;
    out.masters.push_back(f.master.clone());
    auto it = p.optimizer->state().find(f.master.unsafeGetTensorImpl());
    if (it == p.optimizer->state().end()) continue;
    if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      out.states.push_back(a->exp_avg().clone());
      out.states.push_back(a->exp_avg_sq().clone());
      out.states.push_back(at::full({1}, static_cast<double>(a->step()), at::kDouble));
    } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      out.states.push_back(s->momentum_buffer().clone());
    }
  }
  return out;
}

TEST(EngineStepInBackward, GivesTheBitsOfTheStepInStep) {
  auto world = test::world();
  // Each step starts late: one that backward did not wait for would show in the masters read after it.
  zero::StepWorker::delay_tasks_for_tests(5);
  struct Undelay {
    ~Undelay() { zero::StepWorker::delay_tasks_for_tests(0); }
  } undelay;
  const std::vector<std::pair<std::string, ShardingSpec>> specs = {
      {"ZeRO1", ShardingSpec::zero(1)},
      {"ZeRO2", ShardingSpec::zero(2)},
      {"ZeRO3", ShardingSpec::zero(3)},
      {"HYBRID_SHARD", ShardingSpec::fsdp("HYBRID_SHARD")},
  };
  for (const auto& [name, spec] : specs)
    for (int kind : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << name << (kind == 0 ? " AdamW" : " SGD"));
      const Result want = train_steps(with_bf16(spec, false), kind, world);
      const Result got = train_steps(with_bf16(spec, true), kind, world);
      ASSERT_EQ(got.masters.size(), want.masters.size());
      ASSERT_FALSE(want.masters.empty());
      for (std::size_t i = 0; i < want.masters.size(); ++i)
        EXPECT_TRUE(at::equal(got.masters[i], want.masters[i])) << i;
      ASSERT_EQ(got.states.size(), want.states.size());
      ASSERT_FALSE(want.states.empty());
      for (std::size_t i = 0; i < want.states.size(); ++i) EXPECT_TRUE(at::equal(got.states[i], want.states[i])) << i;
      EXPECT_EQ(got.losses, want.losses);
      // Not vacuous: the training moved the masters.
      EXPECT_NE(want.losses.front(), want.losses.back());
    }
}

// Accumulation whose micro-steps reduce (Engine::MoreMicroSteps): no step starts in their backward (a
// step there would take a part of the window's gradient, and the next micro-step's backward would be
// refused); the window's last backward steps the sums, to the bits of the step in step().
TEST(EngineStepInBackward, MicroStepsThatReduceStepInTheLastOnly) {
  auto world = test::world();
  for (const auto& [name, spec] : std::vector<std::pair<std::string, ShardingSpec>>{{"ZeRO2", ShardingSpec::zero(2)},
                                                                                    {"ZeRO3", ShardingSpec::zero(3)}}) {
    SCOPED_TRACE(name);
    const Result want = train_steps(with_bf16(spec, false), 0, world, 3);
    const Result got = train_steps(with_bf16(spec, true), 0, world, 3);
    ASSERT_EQ(got.masters.size(), want.masters.size());
    for (std::size_t i = 0; i < want.masters.size(); ++i) EXPECT_TRUE(at::equal(got.masters[i], want.masters[i])) << i;
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_NE(want.losses.front(), want.losses.back());
  }
}

TEST(EngineStepInBackward, WhatItCannotServeIsRefused) {
  auto world = test::world();
  {  // replicated optimizer state
    auto mdl = bf16_mlp();
    auto user = optimizer_of(0, *mdl);
    ShardingSpec ddp = with_bf16(ShardingSpec::ddp(), true);
    if (world->size() > 1) EXPECT_THROW(zero::prepare(mdl, *user, ddp, world), accel::InvalidArgumentError);
  }
  {  // an optimizer without fused kernels
    auto mdl = bf16_mlp();
    torch::optim::RMSprop user(mdl->parameters(), torch::optim::RMSpropOptions(1e-2));
    EXPECT_THROW(zero::prepare(mdl, user, with_bf16(ShardingSpec::zero(2), true), world), accel::InvalidArgumentError);
  }
  {  // clipping after the step was taken; a second backward before optimizer.step()
    auto mdl = bf16_mlp();
    auto user = optimizer_of(0, *mdl);
    auto p = zero::prepare(mdl, *user, with_bf16(ShardingSpec::zero(3), true), world);
    auto [x, y] = make_batch(ModelKind::MLP, at::kBFloat16, 0, 0);
    p.engine->backward(at::mse_loss(mdl->forward(x), y));
    EXPECT_THROW(p.engine->clip_grad_norm(1.0), accel::LogicError);
    EXPECT_THROW(p.engine->backward(at::mse_loss(mdl->forward(x), y)), accel::LogicError);
    p.optimizer->step();  // then training goes on
    p.optimizer->zero_grad();
    p.engine->backward(at::mse_loss(mdl->forward(x), y));
    EXPECT_THROW(p.optimizer->step([&] { return at::mse_loss(mdl->forward(x), y); }), accel::InvalidArgumentError)
        << "a closure's backward would step the shards, then step() again";
    p.optimizer->step();
  }
}

// A step in backward that fails (here: amsgrad switched on over state made without it, which the fused
// kernels do not take) fails the optimizer's step with its error, and drops that window's gradients:
// the next backward starts from none and steps in backward again. (One rank: at more, a failed step
// ends the job.)
TEST(EngineStepInBackward, AFailedStepFailsTheOptimizerStep) {
  auto world = test::world();
  if (world->size() != 1) GTEST_SKIP() << "a failed step ends a job of more than one rank";
  auto mdl = bf16_mlp();
  auto user = optimizer_of(0, *mdl);
  auto p = zero::prepare(mdl, *user, with_bf16(ShardingSpec::zero(2), true), world);
  std::size_t optimized = 0;
  for (const auto& f : p.engine->flats()) optimized += f.group >= 0 ? 1 : 0;
  auto [x, y] = make_batch(ModelKind::MLP, at::kBFloat16, 0, 0);
  auto& options = static_cast<torch::optim::AdamWOptions&>(p.optimizer->param_groups()[0].options());
  p.engine->backward(at::mse_loss(mdl->forward(x), y));
  p.optimizer->step();
  p.optimizer->zero_grad();
  options.amsgrad(true);
  p.engine->backward(at::mse_loss(mdl->forward(x), y));
  EXPECT_THROW(p.optimizer->step(), accel::LogicError);
  options.amsgrad(false);
  p.optimizer->zero_grad();
  p.engine->backward(at::mse_loss(mdl->forward(x), y));
  EXPECT_EQ(p.engine->stepped_in_backward().size(), optimized) << "the failed window's gradients were kept";
  p.optimizer->step();
}

}  // namespace
}  // namespace accel::test
