#include "mixed_precision/loss_scaler.h"
#include "base/error.h"

#include "comm/communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

namespace accel::mixed_precision {

namespace {

void require(bool ok, const std::string& field, const std::string& rule, double value) {
  if (ok) return;
  throw accel::InvalidArgumentError(
      fmt::format("loss scaler: {} = {:g} is invalid: it must be {}", field, value, rule));
}

// The device for a 1-element flag or norm: the caller's choice, else the first defined tensor's.
c10::Device pick_device(const std::vector<at::Tensor>& ts, std::optional<c10::Device> device) {
  if (device) return *device;
  for (const auto& t : ts)
    if (t.defined()) return t.device();
  return c10::Device(c10::kCPU);
}

}  // namespace

LossScaler::LossScaler(LossScalerOptions options) : opts_(options) {
  require(std::isfinite(opts_.loss_scale) && opts_.loss_scale >= 0, "loss_scale",
          "finite and >= 0 (0 selects dynamic scaling)", opts_.loss_scale);
  if (dynamic()) {
    require(opts_.initial_scale_power >= 0 && opts_.initial_scale_power <= 126, "initial_scale_power", "in [0, 126]",
            opts_.initial_scale_power);
    require(opts_.loss_scale_window >= 1, "loss_scale_window", ">= 1", opts_.loss_scale_window);
    require(opts_.hysteresis >= 1, "hysteresis", ">= 1", opts_.hysteresis);
    require(std::isfinite(opts_.min_loss_scale) && opts_.min_loss_scale > 0, "min_loss_scale", "finite and > 0",
            opts_.min_loss_scale);
    cur_scale_ = std::ldexp(1.0, opts_.initial_scale_power);
    cur_hysteresis_ = opts_.hysteresis;
  } else {
    cur_scale_ = opts_.loss_scale;
    cur_hysteresis_ = 1;
  }
}

bool LossScaler::update(bool overflow) {
  if (overflow) {
    ++skipped_steps_;
    ++consecutive_overflows_;
  } else {
    consecutive_overflows_ = 0;
  }
  if (!dynamic()) {
    ++cur_iter_;
    return overflow;
  }
  if (overflow) {
    if (opts_.hysteresis == 1 || cur_hysteresis_ == 1) {
      if (cur_scale_ == opts_.min_loss_scale) {
        throw LossScaleAtMinimumError(fmt::format(
            "fp16 loss scale already at its minimum: {} consecutive optimizer step(s) overflowed (inf/nan gradients), "
            "the last one at the minimum scale {:g} (min_loss_scale), so the scale cannot be lowered further "
            "(DeepSpeed: \"Current loss scale already at minimum\"). What to change: lower min_loss_scale in the fp16 "
            "config (e.g. {:g}); or train in bf16 (mixed_precision: bf16), which needs no loss scaling; check the "
            "model and data for inf/nan (an inf/nan loss overflows at every scale); or lower the learning rate if the "
            "loss diverged.",
            consecutive_overflows_, cur_scale_, cur_scale_ / 4));
      }
      cur_scale_ = std::max(cur_scale_ / 2.0, opts_.min_loss_scale);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (opts_.consecutive_hysteresis) cur_hysteresis_ = opts_.hysteresis;
    const std::int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
    if (stable > 0 && stable % opts_.loss_scale_window == 0) {
      if (!opts_.consecutive_hysteresis) cur_hysteresis_ = opts_.hysteresis;
      cur_scale_ *= 2.0;
    }
  }
  ++cur_iter_;
  return overflow;
}

LossScaler::State LossScaler::state() const {
  return State{cur_scale_, cur_iter_, last_overflow_iter_, cur_hysteresis_, consecutive_overflows_, skipped_steps_};
}

void LossScaler::load_state(const State& s) {
  if (!(std::isfinite(s.cur_scale) && s.cur_scale > 0))
    throw accel::InvalidArgumentError("loss scaler: load_state: cur_scale must be finite and > 0");
  if (s.cur_hysteresis < 1) throw accel::InvalidArgumentError("loss scaler: load_state: cur_hysteresis must be >= 1");
  cur_scale_ = s.cur_scale;
  cur_iter_ = s.cur_iter;
  last_overflow_iter_ = s.last_overflow_iter;
  cur_hysteresis_ = s.cur_hysteresis;
  consecutive_overflows_ = s.consecutive_overflows;
  skipped_steps_ = s.skipped_steps;
}

namespace {
// 1-element float flag on `device`: 1 when any tensor holds an inf or nan. No host sync.
at::Tensor local_nonfinite_flag(const std::vector<at::Tensor>& grads, c10::Device device) {
  at::Tensor flag = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    if (!at::isFloatingType(g.scalar_type()) && !at::isComplexType(g.scalar_type())) continue;
    at::Tensor bad = at::logical_not(at::isfinite(g)).any().to(at::kFloat).reshape({1});
    flag = at::maximum(flag, bad.to(device));
  }
  return flag;
}
}  // namespace

bool has_inf_or_nan(const std::vector<at::Tensor>& grads) {
  return local_nonfinite_flag(grads, pick_device(grads, std::nullopt)).item<float>() > 0;
}

bool found_inf_across_ranks(const std::vector<at::Tensor>& grads, comm::Communicator& group,
                            std::optional<c10::Device> device) {
  at::Tensor flag = local_nonfinite_flag(grads, pick_device(grads, device)).contiguous();
  group.all_reduce(flag, {comm::ReduceOp::Max});
  return flag.item<float>() > 0;
}

double unscale_and_clip(std::vector<at::Tensor>& grads, double scale, std::optional<double> max_norm,
                        comm::Communicator* shard_group) {
  if (!(std::isfinite(scale) && scale > 0))
    throw accel::InvalidArgumentError(fmt::format("unscale_and_clip: scale must be finite and > 0, got {:f}", scale));
  if (max_norm && !(*max_norm > 0))
    throw accel::InvalidArgumentError(fmt::format("unscale_and_clip: max_norm must be > 0, got {:f}", *max_norm));
  std::vector<at::Tensor> defined;
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) defined.push_back(g);
  const c10::Device device = pick_device(defined, std::nullopt);
  // Sum of squares of the scaled gradients, in fp64 (fp16 squares overflow; fp32 sums lose digits).
  at::Tensor sumsq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& g : defined) {
    at::Tensor n = at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kDouble);
    sumsq = sumsq + (n * n).reshape({1}).to(device);
  }
  if (shard_group != nullptr && shard_group->size() > 1) shard_group->all_reduce(sumsq, {comm::ReduceOp::Sum});
  const double norm = std::sqrt(sumsq.item<double>()) / scale;
  double coef = 1.0;
  if (max_norm) coef = std::min(1.0, *max_norm / (norm + 1e-6));
  const double multiplier = coef / scale;
  // One pass over each gradient. 16-bit gradients are multiplied in fp32 and rounded once: ATen's
  // CPU kernels round a scalar multiplier to the tensor's dtype first, and 1/scale is subnormal in
  // fp16 (2^-16 for the default scale), which would cost up to a few % of accuracy.
  if (multiplier != 1.0)
    for (auto& g : defined) {
      if (g.scalar_type() == at::kHalf || g.scalar_type() == at::kBFloat16)
        g.copy_(g.to(at::kFloat).mul_(multiplier));
      else
        g.mul_(multiplier);
    }
  return norm;
}

}  // namespace accel::mixed_precision
