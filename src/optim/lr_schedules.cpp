// DeepSpeed's learning-rate schedules over torch::optim (lr_schedules.h).
#include "optim/lr_schedules.h"

#include "base/error.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace accel::optim {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw accel::InvalidArgumentError(what);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// IterationSchedule

std::vector<double> IterationSchedule::get_lrs() { return lr_at(static_cast<std::int64_t>(step_count_)); }

std::size_t IterationSchedule::groups() const { return optimizer_.param_groups().size(); }

void IterationSchedule::set_steps(std::int64_t steps) {
  require(steps >= 0, fmt::format("set_steps({}): expected >= 0", steps));
  step_count_ = static_cast<unsigned>(steps);
  apply_iteration(steps - 1);
}

void IterationSchedule::apply(const std::vector<double>& lrs) {
  auto& gs = optimizer_.param_groups();
  for (std::size_t g = 0; g < gs.size(); ++g) gs[g].options().set_lr(lrs.at(g));
}

std::vector<double> IterationSchedule::per_group(const std::vector<double>& values, const char* name) const {
  if (values.size() == 1) return std::vector<double>(groups(), values[0]);
  require(values.size() == groups(), fmt::format("{}: {} values for {} param groups; give one value, or one per group",
                                                 name, values.size(), groups()));
  return values;
}

// ---------------------------------------------------------------------------------------------------
// WarmupLR, WarmupDecayLR

namespace {
double first_lr(const torch::optim::Optimizer& optimizer) {
  require(!optimizer.param_groups().empty(), "the optimizer has no param groups");
  return optimizer.param_groups()[0].options().get_lr();
}
}  // namespace

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, const WarmupOptions& options)
    : WarmupLR(optimizer, options, first_lr(optimizer)) {}

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, const WarmupOptions& o, double default_max_lr)
    : IterationSchedule(optimizer),
      min_(per_group(o.warmup_min_lr, "warmup_min_lr")),
      max_(per_group(o.warmup_max_lr.empty() ? std::vector<double>{default_max_lr} : o.warmup_max_lr, "warmup_max_lr")),
      warmup_steps_(o.warmup_num_steps == 0 ? 0 : std::max<std::int64_t>(2, o.warmup_num_steps)),
      type_(o.warmup_type) {
  require(o.warmup_num_steps >= 0, fmt::format("warmup_num_steps {}: expected >= 0", o.warmup_num_steps));
  apply(lr_at(-1));
}

double WarmupLR::warmup_gamma(std::int64_t i) const {
  if (type_ == WarmupType::Log)
    return std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(warmup_steps_));
  return static_cast<double>(i) / static_cast<double>(warmup_steps_);
}

double WarmupLR::gamma(std::int64_t i) const { return i < warmup_steps_ ? warmup_gamma(i) : 1.0; }

std::vector<double> WarmupLR::lr_at(std::int64_t i) const {
  if (i < 0 && warmup_steps_ > 0) return min_;  // (no warmup: the first step runs at iteration 0's value)
  if (i < 0) return lr_at(0);
  const double g = gamma(i);
  std::vector<double> lrs(min_.size());
  for (std::size_t k = 0; k < lrs.size(); ++k) lrs[k] = min_[k] + (max_[k] - min_[k]) * g;
  return lrs;
}

namespace {
torch::optim::Optimizer& with_total(torch::optim::Optimizer& optimizer, std::int64_t total_num_steps) {
  require(total_num_steps >= 1, fmt::format("total_num_steps {}: expected >= 1", total_num_steps));
  return optimizer;  // (checked before WarmupLR sets the optimizer's learning rates)
}
}  // namespace

WarmupDecayLR::WarmupDecayLR(torch::optim::Optimizer& optimizer, std::int64_t total_num_steps,
                             const WarmupOptions& options)
    : WarmupLR(with_total(optimizer, total_num_steps), options, 0.001), total_(total_num_steps) {}

double WarmupDecayLR::gamma(std::int64_t i) const {
  if (i < warmup_steps_) return warmup_gamma(i);
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_ - warmup_steps_));
  return std::max(0.0, static_cast<double>(total_ - i) / span);
}

// ---------------------------------------------------------------------------------------------------
// WarmupCosineLR

WarmupCosineLR::WarmupCosineLR(torch::optim::Optimizer& optimizer, std::int64_t total_num_steps,
                               const WarmupCosineOptions& o)
    : IterationSchedule(optimizer),
      total_(total_num_steps),
      warmup_steps_(o.warmup_num_steps == 0 ? 0 : std::max<std::int64_t>(2, o.warmup_num_steps)),
      o_(o) {
  require(total_num_steps >= 1, fmt::format("total_num_steps {}: expected >= 1", total_num_steps));
  require(o.warmup_num_steps >= 0, fmt::format("warmup_num_steps {}: expected >= 0", o.warmup_num_steps));
  for (auto& g : optimizer.param_groups()) base_.push_back(g.options().get_lr());
  apply(lr_at(-1));
}

double WarmupCosineLR::ratio(std::int64_t i) const {
  if (i < 0) return warmup_steps_ > 0 ? 0.0 : 1.0;  // (no warmup: the first step runs at the cosine's start)
  if (i < warmup_steps_) {
    const double g = o_.warmup_type == WarmupType::Log
                         ? std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(warmup_steps_))
                         : static_cast<double>(i) / static_cast<double>(warmup_steps_);
    return o_.warmup_min_ratio + g * (1.0 - o_.warmup_min_ratio);
  }
  const double past = static_cast<double>(i - warmup_steps_ + 1);
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_ - warmup_steps_));
  const double progress = std::min(1.0, past / span);
  return std::max(0.0, o_.cos_min_ratio + (1.0 - o_.cos_min_ratio) * (1.0 + std::cos(M_PI * progress)) / 2.0);
}

std::vector<double> WarmupCosineLR::lr_at(std::int64_t i) const {
  const double r = ratio(i);
  std::vector<double> lrs(base_.size());
  for (std::size_t k = 0; k < lrs.size(); ++k) lrs[k] = base_[k] * r;
  return lrs;
}

// ---------------------------------------------------------------------------------------------------
// LRRangeTest

LRRangeTest::LRRangeTest(torch::optim::Optimizer& optimizer, const LRRangeTestOptions& o)
    : IterationSchedule(optimizer), min_(per_group(o.lr_range_test_min_lr, "lr_range_test_min_lr")), o_(o) {
  require(o.lr_range_test_step_size >= 1,
          fmt::format("lr_range_test_step_size {}: expected >= 1", o.lr_range_test_step_size));
  apply(min_);
}

std::vector<double> LRRangeTest::lr_at(std::int64_t i) const {
  if (i < 0) return min_;
  double interval = static_cast<double>(i + 1) / static_cast<double>(o_.lr_range_test_step_size);
  if (o_.lr_range_test_staircase) interval = std::floor(interval);
  std::vector<double> lrs(min_.size());
  for (std::size_t k = 0; k < lrs.size(); ++k) lrs[k] = min_[k] * (1.0 + o_.lr_range_test_step_rate * interval);
  return lrs;
}

// ---------------------------------------------------------------------------------------------------
// OneCycle

namespace {
bool has_betas(const torch::optim::Optimizer& opt) {
  const auto& d = opt.defaults();
  return dynamic_cast<const torch::optim::AdamOptions*>(&d) || dynamic_cast<const torch::optim::AdamWOptions*>(&d);
}
}  // namespace

OneCycle::OneCycle(torch::optim::Optimizer& optimizer, const OneCycleOptions& o)
    : IterationSchedule(optimizer),
      o_(o),
      first_(static_cast<double>(o.cycle_first_step_size)),
      second_(static_cast<double>(o.cycle_second_step_size < 0 ? o.cycle_first_step_size : o.cycle_second_step_size)),
      total_(first_ + second_),
      second_stairs_(o.cycle_second_stair_count < 0 ? o.cycle_first_stair_count : o.cycle_second_stair_count),
      momentum_(o.cycle_momentum) {
  require(o.cycle_first_step_size >= 1,
          fmt::format("cycle_first_step_size {}: expected >= 1", o.cycle_first_step_size));
  require(second_ >= 1, fmt::format("cycle_second_step_size {}: expected >= 1", second_));
  require(o.cycle_first_stair_count >= 0 && second_stairs_ >= 0, "cycle stair counts: expected >= 0");
  require(o.decay_step_size >= 0, fmt::format("decay_step_size {}: expected >= 0", o.decay_step_size));
  if (momentum_ && !has_betas(optimizer)) momentum_ = false;
  apply(lr_at(-1));
  if (momentum_) set_momentum(o_.cycle_min_mom);  // (DeepSpeed starts the momentum at its minimum)
}

double OneCycle::scale(std::int64_t i) const {
  const double bi = static_cast<double>(i + 1);
  const double cycle = std::floor(1.0 + bi / total_);
  const double x = 1.0 + bi / total_ - cycle;
  const double step_ratio = first_ / total_;
  double s;
  std::int64_t stairs;
  if (x <= step_ratio) {
    s = x / step_ratio;
    stairs = o_.cycle_first_stair_count;
  } else {
    s = (x - 1.0) / (step_ratio - 1.0);
    stairs = second_stairs_;
  }
  if (stairs > 0) {  // flat across each stair, counted from the integer position in the cycle
    const double at = std::fmod(bi, total_);
    const double position = at <= first_ ? at * static_cast<double>(stairs) / first_
                                         : (total_ - at) * static_cast<double>(stairs) / second_;
    s = std::floor(position) / static_cast<double>(stairs);
  }
  return s;
}

std::vector<double> OneCycle::lr_at(std::int64_t i) const {
  double lr;
  if (i < 0) {
    lr = o_.cycle_min_lr;
  } else if (static_cast<double>(i) < total_) {
    lr = o_.cycle_min_lr + (o_.cycle_max_lr - o_.cycle_min_lr) * scale(i);
  } else if (o_.decay_step_size == 0 || o_.decay_lr_rate == 0) {
    lr = o_.cycle_min_lr;
  } else {
    const double interval = (static_cast<double>(i) - total_ + 1.0) / static_cast<double>(o_.decay_step_size);
    lr = o_.cycle_min_lr / (1.0 + o_.decay_lr_rate * interval);
  }
  return std::vector<double>(groups(), lr);
}

double OneCycle::momentum_at(std::int64_t i) const {
  if (i < 0) return o_.cycle_min_mom;
  if (static_cast<double>(i) < total_) return o_.cycle_max_mom - (o_.cycle_max_mom - o_.cycle_min_mom) * scale(i);
  if (o_.decay_step_size == 0 || o_.decay_mom_rate == 0) return o_.cycle_max_mom;
  const double interval = (static_cast<double>(i) - total_ + 1.0) / static_cast<double>(o_.decay_step_size);
  return o_.cycle_max_mom * (1.0 + o_.decay_mom_rate * interval);
}

void OneCycle::set_momentum(double beta1) {
  for (auto& g : optimizer_.param_groups()) {
    auto& opts = g.options();
    if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&opts))
      a->betas(std::make_tuple(beta1, 0.99));
    else if (auto* w = dynamic_cast<torch::optim::AdamWOptions*>(&opts))
      w->betas(std::make_tuple(beta1, 0.99));
  }
}

void OneCycle::apply_iteration(std::int64_t i) {
  apply(lr_at(i));
  if (momentum_) set_momentum(momentum_at(i));
}

std::vector<double> OneCycle::get_lrs() {
  const auto i = static_cast<std::int64_t>(step_count_);
  if (momentum_) set_momentum(momentum_at(i));
  return lr_at(i);
}

// ---------------------------------------------------------------------------------------------------

std::vector<double> ConstantLR::lr_at(std::int64_t) const { return get_current_lrs(); }

}  // namespace accel::optim
