// accel::optim learning-rate schedules — DeepSpeed's five (WarmupLR, WarmupDecayLR, WarmupCosineLR,
// OneCycle, LRRangeTest), as torch::optim::LRScheduler over any libtorch optimizer, so that the
// "scheduler" block of a DeepSpeed config does in accel what it does in DeepSpeed (from_config.h).
//
// Each is a closed form of the iteration i (DeepSpeed's last_batch_iteration): i = -1 at construction,
// which sets the optimizer's learning rates to the schedule's start, and the k-th step() applies i = k-1.
// So, as in DeepSpeed, the first optimizer step runs at the start value, and the learning rate is a
// pure function of the number of step() calls (AcceleratedScheduler::fast_forward resumes it exactly).
// lr_at(i) gives the value for each param group without touching the optimizer.
//
// Defaults are DeepSpeed's constructors' (deepspeed/runtime/lr_schedules.py), its quirks included:
//   * the warmup lasts max(2, warmup_num_steps) steps, and "log" warmup is ln(i + 1) / ln(steps);
//     warmup_num_steps 0 (accel's, for "auto" from a program without warmup; DeepSpeed refuses 0)
//     means none: the first step already runs at the peak (the cosine's start);
//   * WarmupLR's warmup_max_lr defaults to the first group's learning rate, WarmupDecayLR's to 0.001;
//   * OneCycle with cycle_momentum sets Adam's betas to (momentum, 0.99) (beta2 too), and turns the
//     momentum cycle off for an optimizer without betas (SGD, RMSprop, Adagrad; cycles_momentum()).
// total_num_steps below the warmup is allowed (make_scheduler warns, as DeepSpeed does).
#pragma once

#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <string>
#include <vector>

namespace accel::optim {

// The schedules' common frame: lr_at(i) for each group; construction applies lr_at(-1).
class IterationSchedule : public torch::optim::LRScheduler {
 public:
  explicit IterationSchedule(torch::optim::Optimizer& optimizer) : LRScheduler(optimizer), optimizer_(optimizer) {}
  // The learning rate of each param group at iteration i (-1: before the first step()).
  virtual std::vector<double> lr_at(std::int64_t i) const = 0;
  // The iteration the optimizer's learning rates now belong to (-1 until the first step()).
  std::int64_t iteration() const { return static_cast<std::int64_t>(step_count_) - 1; }
  // As if exactly `steps` step() calls had been made since construction, earlier or later than now
  // (a checkpoint loaded after the schedule went past it).
  void set_steps(std::int64_t steps);

 protected:
  std::vector<double> get_lrs() override;  // lr_at(step_count_): step() then counts one more
  // Sets what iteration i sets: each group's learning rate (OneCycle: and the betas).
  virtual void apply_iteration(std::int64_t i) { apply(lr_at(i)); }
  // Sets each group's learning rate (the constructors' lr_at(-1)).
  void apply(const std::vector<double>& lrs);
  // A value per group: one value for all, or one each (DeepSpeed's "float or list").
  std::vector<double> per_group(const std::vector<double>& values, const char* name) const;
  std::size_t groups() const;

  torch::optim::Optimizer& optimizer_;
};

enum class WarmupType { Log, Linear };

struct WarmupOptions {
  std::vector<double> warmup_min_lr{0.0};  // one value, or one per group
  std::vector<double> warmup_max_lr;       // empty: WarmupLR the first group's lr, WarmupDecayLR 0.001
  std::int64_t warmup_num_steps = 1000;    // >= 0 (0: none)
  WarmupType warmup_type = WarmupType::Log;
};

// lr = min + (max - min) * gamma(i); gamma rises over the warmup, then stays at 1.
class WarmupLR : public IterationSchedule {
 public:
  WarmupLR(torch::optim::Optimizer& optimizer, const WarmupOptions& options);
  std::vector<double> lr_at(std::int64_t i) const override;

 protected:
  WarmupLR(torch::optim::Optimizer& optimizer, const WarmupOptions& options, double default_max_lr);
  virtual double gamma(std::int64_t i) const;
  double warmup_gamma(std::int64_t i) const;  // i < warmup_steps_
  std::vector<double> min_, max_;
  std::int64_t warmup_steps_;  // max(2, warmup_num_steps), or 0
  WarmupType type_;
};

// WarmupLR, then down in a straight line to 0 at total_num_steps (and 0 after).
class WarmupDecayLR : public WarmupLR {
 public:
  WarmupDecayLR(torch::optim::Optimizer& optimizer, std::int64_t total_num_steps, const WarmupOptions& options);

 protected:
  double gamma(std::int64_t i) const override;
  std::int64_t total_;
};

struct WarmupCosineOptions {
  double warmup_min_ratio = 0.0;
  std::int64_t warmup_num_steps = 1000;  // >= 0 (0: none)
  double cos_min_ratio = 1e-4;
  WarmupType warmup_type = WarmupType::Log;
};

// lr = the group's lr at construction * ratio(i): warmup from warmup_min_ratio to 1, then a half
// cosine down to cos_min_ratio at total_num_steps (and there after). 0 before the first step()
// (1 without warmup).
class WarmupCosineLR : public IterationSchedule {
 public:
  WarmupCosineLR(torch::optim::Optimizer& optimizer, std::int64_t total_num_steps, const WarmupCosineOptions& options);
  std::vector<double> lr_at(std::int64_t i) const override;
  double ratio(std::int64_t i) const;

 private:
  std::vector<double> base_;
  std::int64_t total_, warmup_steps_;
  WarmupCosineOptions o_;
};

struct LRRangeTestOptions {
  std::vector<double> lr_range_test_min_lr{1e-3};  // one value, or one per group
  std::int64_t lr_range_test_step_size = 2000;     // >= 1
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// lr = min * (1 + rate * (i + 1) / step_size), the quotient floored with staircase.
class LRRangeTest : public IterationSchedule {
 public:
  LRRangeTest(torch::optim::Optimizer& optimizer, const LRRangeTestOptions& options);
  std::vector<double> lr_at(std::int64_t i) const override;

 private:
  std::vector<double> min_;
  LRRangeTestOptions o_;
};

struct OneCycleOptions {
  double cycle_min_lr = 0, cycle_max_lr = 0;  // required (DeepSpeed has no defaults either)
  double decay_lr_rate = 0;
  std::int64_t cycle_first_step_size = 2000;  // >= 1
  std::int64_t cycle_second_step_size = -1;   // -1: cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;
  std::int64_t cycle_second_stair_count = -1;  // -1: cycle_first_stair_count
  std::int64_t decay_step_size = 0;            // 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0;
};

// Up from cycle_min_lr to cycle_max_lr over the first half-cycle, down again over the second, then
// min / (1 + decay_lr_rate * (steps past the cycle) / decay_step_size). Momentum (Adam's beta1) moves
// the other way, from cycle_max_mom down and back, then max * (1 + decay_mom_rate * ...).
class OneCycle : public IterationSchedule {
 public:
  OneCycle(torch::optim::Optimizer& optimizer, const OneCycleOptions& options);
  std::vector<double> lr_at(std::int64_t i) const override;
  double momentum_at(std::int64_t i) const;  // beta1 at iteration i
  bool cycles_momentum() const { return momentum_; }

 protected:
  std::vector<double> get_lrs() override;  // also sets the betas
  void apply_iteration(std::int64_t i) override;

 private:
  double scale(std::int64_t i) const;  // 0 at the cycle's ends, 1 at its peak
  void set_momentum(double beta1);
  OneCycleOptions o_;
  double first_, second_, total_;
  std::int64_t second_stairs_;
  bool momentum_;
};

// No schedule: step() leaves the learning rates as they are (a config without a scheduler block).
class ConstantLR : public IterationSchedule {
 public:
  using IterationSchedule::IterationSchedule;
  std::vector<double> lr_at(std::int64_t i) const override;
};

}  // namespace accel::optim
