// DeepSpeed's five learning-rate schedules (optim/lr_schedules.h) against their closed forms, worked
// out by hand from DeepSpeed's definitions (deepspeed/runtime/lr_schedules.py): the value at
// construction (iteration -1), after each step(), per param group, and past the schedule's end.
#include "optim/lr_schedules.h"

#include "base/error.h"

#include <ATen/ops/zeros.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

namespace accel::optim {
namespace {

std::vector<at::Tensor> one_param() { return {at::zeros({2})}; }

double lr_of(const torch::optim::Optimizer& o, std::size_t group = 0) {
  return o.param_groups().at(group).options().get_lr();
}

// The learning rate after `steps` calls of step().
template <class S>
double after(S& s, torch::optim::Optimizer& o, int steps) {
  for (int k = 0; k < steps; ++k) s.step();
  return lr_of(o);
}

TEST(LrSchedules, WarmupLRLogRisesToItsMaximumAndStays) {
  torch::optim::AdamW opt(one_param(), torch::optim::AdamWOptions(0.5));
  WarmupLR s(opt, {.warmup_min_lr = {0.01}, .warmup_max_lr = {0.1}, .warmup_num_steps = 10});
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.01);          // construction: the minimum
  EXPECT_NEAR(after(s, opt, 1), 0.01, 1e-15);  // iteration 0: ln(1) = 0
  // iteration 4: 0.01 + 0.09 * ln 5 / ln 10 = 0.01 + 0.09 * 0.6989700043
  EXPECT_NEAR(after(s, opt, 4), 0.0729073004, 1e-10);
  // iteration 9: 0.01 + 0.09 * ln 10 / ln 10
  EXPECT_NEAR(after(s, opt, 5), 0.1, 1e-15);
  EXPECT_DOUBLE_EQ(after(s, opt, 20), 0.1);
  EXPECT_EQ(s.iteration(), 29);
}

TEST(LrSchedules, WarmupLRLinearAndTheOptimizersLearningRateAsItsMaximum) {
  torch::optim::SGD opt(one_param(), torch::optim::SGDOptions(0.2));
  WarmupLR s(opt, {.warmup_num_steps = 4, .warmup_type = WarmupType::Linear});  // max: the optimizer's 0.2
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.0);
  EXPECT_DOUBLE_EQ(after(s, opt, 1), 0.0);   // i = 0
  EXPECT_DOUBLE_EQ(after(s, opt, 1), 0.05);  // i = 1: 1/4
  EXPECT_DOUBLE_EQ(after(s, opt, 2), 0.15);  // i = 3: 3/4
  EXPECT_DOUBLE_EQ(after(s, opt, 1), 0.2);   // i = 4: done
  // warmup_num_steps 1 warms up over 2 steps, as DeepSpeed's max(2, n); 0 (accel's) not at all.
  torch::optim::SGD one(one_param(), torch::optim::SGDOptions(0.2));
  WarmupLR s1(one, {.warmup_num_steps = 1, .warmup_type = WarmupType::Linear});
  EXPECT_DOUBLE_EQ(after(s1, one, 2), 0.1);  // i = 1: 1/2
  torch::optim::SGD none(one_param(), torch::optim::SGDOptions(0.2));
  WarmupLR s0(none, {.warmup_num_steps = 0});
  EXPECT_DOUBLE_EQ(lr_of(none), 0.2);  // no warmup: the first step runs at the peak
  EXPECT_DOUBLE_EQ(after(s0, none, 1), 0.2);
}

TEST(LrSchedules, WarmupDecayLRFallsInAStraightLineToZero) {
  torch::optim::AdamW opt(one_param(), torch::optim::AdamWOptions(0.5));
  WarmupDecayLR s(opt, 20, {.warmup_num_steps = 10, .warmup_type = WarmupType::Linear});  // max: DeepSpeed's 0.001
  EXPECT_DOUBLE_EQ(after(s, opt, 6), 0.0005);                                             // i = 5: 5/10
  EXPECT_DOUBLE_EQ(after(s, opt, 5), 0.001);                                              // i = 10: (20 - 10) / 10
  EXPECT_DOUBLE_EQ(after(s, opt, 5), 0.0005);                                             // i = 15: (20 - 15) / 10
  EXPECT_DOUBLE_EQ(after(s, opt, 5), 0.0);                                                // i = 20
  EXPECT_DOUBLE_EQ(after(s, opt, 5), 0.0);                                                // after: 0, not negative
  EXPECT_THROW(WarmupDecayLR(opt, 0, {}), accel::InvalidArgumentError);
}

TEST(LrSchedules, WarmupCosineLRScalesTheGroupsLearningRate) {
  torch::optim::AdamW opt(one_param(), torch::optim::AdamWOptions(0.2));
  WarmupCosineLR s(
      opt, 20,
      {.warmup_min_ratio = 0.1, .warmup_num_steps = 4, .cos_min_ratio = 0.01, .warmup_type = WarmupType::Linear});
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.0);               // 0 before the first step, as DeepSpeed's
  EXPECT_DOUBLE_EQ(after(s, opt, 3), 0.2 * 0.55);  // i = 2: 0.1 + 2/4 * 0.9
  // i = 4: 1 of 16 steps of the cosine: 0.01 + 0.99 * (1 + cos(pi/16)) / 2 = 0.01 + 0.99 * 0.9903926402
  EXPECT_NEAR(after(s, opt, 2), 0.2 * 0.9904887138, 1e-10);
  // i = 11: halfway (8 of 16): 0.01 + 0.99 / 2
  EXPECT_NEAR(after(s, opt, 7), 0.2 * 0.505, 1e-12);
  EXPECT_NEAR(after(s, opt, 8), 0.2 * 0.01, 1e-15);   // i = 19: the end
  EXPECT_NEAR(after(s, opt, 10), 0.2 * 0.01, 1e-15);  // and after it
  // Without warmup the first step runs at the cosine's start, the second 1 of 20 steps down it.
  torch::optim::AdamW cold(one_param(), torch::optim::AdamWOptions(0.2));
  WarmupCosineLR c(cold, 20, {.warmup_num_steps = 0, .cos_min_ratio = 0.0});
  EXPECT_DOUBLE_EQ(lr_of(cold), 0.2);
  EXPECT_NEAR(after(c, cold, 1), 0.2 * (1 + std::cos(M_PI / 20)) / 2, 1e-15);
}

TEST(LrSchedules, LRRangeTestGrowsContinuouslyOrInStairs) {
  torch::optim::SGD opt(one_param(), torch::optim::SGDOptions(0.5));
  LRRangeTest s(opt, {.lr_range_test_min_lr = {0.01}, .lr_range_test_step_size = 4, .lr_range_test_step_rate = 0.5});
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.01);
  EXPECT_DOUBLE_EQ(after(s, opt, 7), 0.01 * (1 + 0.5 * 7.0 / 4));  // i = 6
  torch::optim::SGD stairs(one_param(), torch::optim::SGDOptions(0.5));
  LRRangeTest t(stairs, {.lr_range_test_min_lr = {0.01},
                         .lr_range_test_step_size = 4,
                         .lr_range_test_step_rate = 0.5,
                         .lr_range_test_staircase = true});
  EXPECT_DOUBLE_EQ(after(t, stairs, 3), 0.01);   // i = 2: floor(3/4) = 0
  EXPECT_DOUBLE_EQ(after(t, stairs, 4), 0.015);  // i = 6: floor(7/4) = 1
  EXPECT_DOUBLE_EQ(after(t, stairs, 1), 0.02);   // i = 7: floor(8/4) = 2
}

double beta1_of(const torch::optim::Adam& o) {
  return std::get<0>(static_cast<const torch::optim::AdamOptions&>(o.param_groups()[0].options()).betas());
}
double beta2_of(const torch::optim::Adam& o) {
  return std::get<1>(static_cast<const torch::optim::AdamOptions&>(o.param_groups()[0].options()).betas());
}

TEST(LrSchedules, OneCycleCyclesTheLearningRateUpAndMomentumDownThenDecays) {
  torch::optim::Adam opt(one_param(), torch::optim::AdamOptions(0.5));
  OneCycle s(opt, {.cycle_min_lr = 0.01,
                   .cycle_max_lr = 0.1,
                   .decay_lr_rate = 0.5,
                   .cycle_first_step_size = 4,
                   .cycle_second_step_size = 6,
                   .decay_step_size = 2,
                   .cycle_min_mom = 0.8,
                   .cycle_max_mom = 0.9,
                   .decay_mom_rate = 0.1});
  ASSERT_TRUE(s.cycles_momentum());
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.01);
  EXPECT_DOUBLE_EQ(beta1_of(opt), 0.8);
  EXPECT_DOUBLE_EQ(beta2_of(opt), 0.99);  // DeepSpeed's: beta2 becomes 0.99
  // i = 1: (i + 1) / 10 = 0.2 of the cycle, half of the first 0.4: scale 0.5
  EXPECT_NEAR(after(s, opt, 2), 0.055, 1e-15);
  EXPECT_NEAR(beta1_of(opt), 0.85, 1e-15);
  EXPECT_NEAR(after(s, opt, 2), 0.1, 1e-15);  // i = 3: the peak
  EXPECT_NEAR(beta1_of(opt), 0.8, 1e-15);
  // i = 6: 0.7 of the cycle: (0.7 - 1) / (0.4 - 1) = 0.5 on the way down
  EXPECT_NEAR(after(s, opt, 3), 0.055, 1e-15);
  EXPECT_NEAR(after(s, opt, 3), 0.01, 1e-15);  // i = 9: the cycle's end
  EXPECT_NEAR(beta1_of(opt), 0.9, 1e-15);
  // i = 13: 4 steps past the cycle, 2 decay intervals: 0.01 / (1 + 0.5 * 2); momentum 0.9 * (1 + 0.1 * 2)
  EXPECT_NEAR(after(s, opt, 4), 0.005, 1e-15);
  EXPECT_NEAR(beta1_of(opt), 1.08, 1e-15);
  EXPECT_NEAR(s.lr_at(13)[0], 0.005, 1e-15);
}

TEST(LrSchedules, OneCycleStairsHoldEachValueAndSgdKeepsItsMomentum) {
  torch::optim::SGD opt(one_param(), torch::optim::SGDOptions(0.5).momentum(0.7));
  OneCycle s(opt,
             {.cycle_min_lr = 0.01, .cycle_max_lr = 0.1, .cycle_first_step_size = 4, .cycle_first_stair_count = 2});
  EXPECT_FALSE(s.cycles_momentum());          // SGD has no betas: DeepSpeed turns the momentum cycle off
  EXPECT_DOUBLE_EQ(after(s, opt, 1), 0.01);   // i = 0: position 1 * 2 / 4 = 0.5, the first stair
  EXPECT_DOUBLE_EQ(after(s, opt, 1), 0.055);  // i = 1: position 1, the second stair
  EXPECT_DOUBLE_EQ(after(s, opt, 1), 0.055);  // i = 2: position 1.5, still
  EXPECT_DOUBLE_EQ(after(s, opt, 1), 0.1);    // i = 3: the peak
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::SGDOptions&>(opt.param_groups()[0].options()).momentum(), 0.7);
}

TEST(LrSchedules, ValuesPerGroupAndTheirCount) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(one_param());
  groups.emplace_back(one_param());
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(0.5));
  WarmupLR s(opt, {.warmup_min_lr = {0.0, 0.01},
                   .warmup_max_lr = {0.1, 0.2},
                   .warmup_num_steps = 4,
                   .warmup_type = WarmupType::Linear});
  EXPECT_DOUBLE_EQ(lr_of(opt, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_of(opt, 1), 0.01);
  for (int k = 0; k < 3; ++k) s.step();  // i = 2: half way
  EXPECT_DOUBLE_EQ(lr_of(opt, 0), 0.05);
  EXPECT_DOUBLE_EQ(lr_of(opt, 1), 0.105);
  EXPECT_THROW(WarmupLR(opt, {.warmup_min_lr = {0.0, 0.1, 0.2}}), accel::InvalidArgumentError);
}

TEST(LrSchedules, ConstantLRLeavesTheLearningRate) {
  torch::optim::SGD opt(one_param(), torch::optim::SGDOptions(0.3));
  ConstantLR s(opt);
  for (int k = 0; k < 5; ++k) s.step();
  EXPECT_DOUBLE_EQ(lr_of(opt), 0.3);
}

}  // namespace
}  // namespace accel::optim
