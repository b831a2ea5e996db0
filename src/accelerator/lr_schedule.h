// accel::CosineSchedule — linear warmup then cosine decay, as an LR scheduler over any libtorch
// optimizer (libtorch ships only StepLR and ReduceLROnPlateau).
//
// After s optimizer steps each group's lr is base * f(s), base being the group's lr at construction:
//   f(s) = s / warmup                                         for s < warmup
//   f(s) = r + (1 - r) * 0.5 * (1 + cos(pi * p)),  p = (s - warmup) / (total - warmup) (clamped to 1)
// with r = min_lr_ratio. The constructor sets lr = base * f(0); each step() applies f(steps + 1)
// (an optim::IterationSchedule with lr_at(i) = base * f(i + 1): set_steps rewinds it too).
#pragma once

#include "base/error.h"
#include "optim/lr_schedules.h"

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel {

class CosineSchedule : public optim::IterationSchedule {
 public:
  CosineSchedule(torch::optim::Optimizer& optimizer, std::int64_t total_steps, std::int64_t warmup_steps = 0,
                 double min_lr_ratio = 0.0)
      : IterationSchedule(optimizer), total_(total_steps), warmup_(warmup_steps), min_ratio_(min_lr_ratio) {
    if (total_steps < 1 || warmup_steps < 0 || warmup_steps > total_steps || min_lr_ratio < 0 || min_lr_ratio > 1)
      throw accel::InvalidArgumentError(
          "CosineSchedule: need total_steps >= 1, 0 <= warmup_steps <= total_steps, "
          "0 <= min_lr_ratio <= 1 (got " +
          std::to_string(total_steps) + ", " + std::to_string(warmup_steps) + ", " + std::to_string(min_lr_ratio) +
          ")");
    base_ = get_current_lrs();
    const double f0 = factor(0);
    for (auto& g : optimizer.param_groups()) g.options().set_lr(g.options().get_lr() * f0);
  }

  double factor(std::int64_t s) const {
    if (s < warmup_) return static_cast<double>(s) / static_cast<double>(warmup_);
    const double span = static_cast<double>(std::max<std::int64_t>(total_ - warmup_, 1));
    const double p = std::min(1.0, static_cast<double>(s - warmup_) / span);
    return min_ratio_ + (1.0 - min_ratio_) * 0.5 * (1.0 + std::cos(M_PI * p));
  }

  std::vector<double> lr_at(std::int64_t i) const override {
    const double f = factor(i + 1);
    std::vector<double> lrs(base_.size());
    for (std::size_t k = 0; k < base_.size(); ++k) lrs[k] = base_[k] * f;
    return lrs;
  }

 private:
  std::int64_t total_, warmup_;
  double min_ratio_;
  std::vector<double> base_;
};

}  // namespace accel
