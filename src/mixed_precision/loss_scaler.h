// accel::mixed_precision::LossScaler — fp16 loss scaling with DeepSpeed's semantics and defaults
// (deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale; the ZeRO paths use it,
// hysteresis included), plus the two collective helpers of an fp16 optimizer step:
// found_inf_across_ranks (every rank agrees on overflow) and unscale_and_clip (unscale fused with
// global-norm clipping, one pass over the gradients).
//
// One fp16 step:   loss * scaler.scale() -> backward -> reduce gradients
//                  overflow = found_inf_across_ranks(shard grads, shard group)
//                  if (scaler.update(overflow)) skip the step (every rank: the flag is agreed)
//                  else { unscale_and_clip(shard grads, scale used for this backward, max_norm, group); step }
// Note the order, as in DeepSpeed's ZeRO step: update() runs before unscaling, so remember the scale
// the backward used (scaler.scale() before update()) and unscale by that one.
//
// No dependence on the accelerator: the config's accel::LossScalerConfig is LossScalerOptions.
#pragma once

#include "base/error.h"

#include "mixed_precision/loss_scaler_options.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::comm {
class Communicator;
}

namespace accel::mixed_precision {

// Thrown by LossScaler::update() on an overflow when the scale is already at min_loss_scale
// (DeepSpeed: "Current loss scale already at minimum - cannot decrease scale anymore").
class LossScaleAtMinimumError : public accel::RuntimeError {
 public:
  using accel::RuntimeError::RuntimeError;
};

class LossScaler {
 public:
  // Validates the options (std::invalid_argument naming the field): loss_scale finite and >= 0; when
  // dynamic, initial_scale_power in [0, 126], loss_scale_window >= 1, hysteresis >= 1,
  // min_loss_scale finite and > 0.
  explicit LossScaler(LossScalerOptions options = {});

  const LossScalerOptions& options() const { return opts_; }
  bool dynamic() const { return opts_.loss_scale <= 0; }
  // The scale to multiply the loss by for the next backward.
  double scale() const { return cur_scale_; }

  // Records one optimizer step's overflow flag (the same on every rank: see found_inf_across_ranks)
  // and returns whether that step must be skipped (== overflow; a static scaler also skips on
  // overflow, as DeepSpeed's ZeRO step does). DeepSpeed's update rule, exactly:
  //   overflow: if hysteresis == 1 or cur_hysteresis == 1: scale = max(scale / 2, min_loss_scale)
  //             (throws LossScaleAtMinimumError instead when scale == min_loss_scale already);
  //             else cur_hysteresis -= 1.   last_overflow_iter = iter.
  //   clean:    if consecutive_hysteresis: cur_hysteresis = hysteresis.
  //             stable = iter - last_overflow_iter - 1; if stable > 0 and stable % window == 0:
  //             scale *= 2 (and, without consecutive_hysteresis, cur_hysteresis = hysteresis).
  //   iter += 1.
  // cur_hysteresis is not refilled by the halving itself: after the first halving, each further
  // overflow halves again until a doubling (or, with consecutive_hysteresis, a clean step) refills it.
  bool update(bool overflow);

  // State, for logs, tests and checkpoints (DeepSpeed saves the scaler object whole).
  struct State {
    double cur_scale = 1;
    std::int64_t cur_iter = 0;
    std::int64_t last_overflow_iter = -1;
    int cur_hysteresis = 1;
    std::int64_t consecutive_overflows = 0;  // overflowing update()s since the last clean one
    std::int64_t skipped_steps = 0;          // every overflowing update() so far
  };
  State state() const;
  void load_state(const State& s);

 private:
  LossScalerOptions opts_;
  double cur_scale_ = 1;
  std::int64_t cur_iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
  int cur_hysteresis_ = 1;
  std::int64_t consecutive_overflows_ = 0;
  std::int64_t skipped_steps_ = 0;
};

// True on every rank when any rank's gradients hold an inf or nan. Each rank checks its own
// (shard) gradients locally; then ONE all-reduce (max) of a 1-element flag over `group`. Collective:
// every rank of `group` must call it. Undefined tensors in `grads` are skipped. The flag lives on
// `device` (default: the first defined gradient's device, else CPU); pass it when a rank may hold no
// gradients, so that every rank picks the same backend. Blocking (reads the flag back).
bool found_inf_across_ranks(const std::vector<at::Tensor>& grads, comm::Communicator& group,
                            std::optional<c10::Device> device = std::nullopt);
// The local half: does any of these tensors hold an inf or nan (no communication).
bool has_inf_or_nan(const std::vector<at::Tensor>& grads);

// Fused unscale + global-norm clip, in place. The L2 norm of the *scaled* gradients is computed
// across the ranks holding disjoint pieces of them: per-tensor sums of squares (in fp64) are added
// locally and ONE all-reduce (sum) over `shard_group` adds the ranks' partial sums; pass nullptr when
// the gradients are replicated (DDP, NO_SHARD), so the local norm is already the global norm. Under
// HYBRID_SHARD pass the shard (node-local) group only: the replicas hold identical shards.
// Then norm = sqrt(sum) / scale, and one multiplier  1/scale * min(1, max_norm / (norm + 1e-6))  is
// applied in a single pass over every gradient (torch::nn::utils::clip_grad_norm_'s coefficient, and
// DeepSpeed's unscale_and_clip_grads combined scale). No max_norm: unscale only (the norm is still
// computed and returned; with shard_group, still one all-reduce, so call it on every rank).
// Returns the global norm of the unscaled gradients (inf/nan when the gradients hold one: check for
// overflow first). Undefined tensors are skipped. scale must be > 0.
double unscale_and_clip(std::vector<at::Tensor>& grads, double scale, std::optional<double> max_norm,
                        comm::Communicator* shard_group);

}  // namespace accel::mixed_precision
