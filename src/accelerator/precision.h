// How `mixed_precision` becomes the engine's dtypes, and the fp16 half of an optimizer step.
//
//   mixed_precision | compute (params, gathers) | gradient reduction | master + optimizer | at the step
//   no              | the model's dtype         | the model's dtype  | the model's dtype  | -
//   bf16            | bf16                      | fp32               | fp32 (bf16: option)| -
//   fp16            | fp16                      | fp32               | fp32               | loss scaling
//   fp8             | bf16; Float8Linear layers | fp32               | fp32               | -
//                   | matmul in e4m3/e5m2; sharded units gathered as e4m3 bytes
// A dtype the config sets itself wins: DeepSpeed's communication_data_type (reduction) and
// bf16.bf16_master_weights_and_grads (bf16 masters).
#pragma once

#include "accelerator/config.h"
#include "mixed_precision/loss_scaler.h"
#include "zero/engine.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <string>

namespace accel {

// Fills cfg.spec's unset dtypes (and fp8_all_gather) from cfg.mixed_precision, as in the table.
// Throws ConfigError for a combination that cannot work (bf16 masters without bf16 compute).
void apply_precision_policy(AcceleratorConfig& cfg);

// The lower-precision dtype autocast uses for this config: bf16 for bf16 and fp8, fp16 for fp16;
// nullopt for fp32.
std::optional<c10::ScalarType> autocast_dtype(MixedPrecision p);

// A dtype as configs write it: fp32, fp64, fp16, bf16 (else libtorch's name).
const char* dtype_label(c10::ScalarType t);

// fp16 loss scaling over a prepared engine (DeepSpeed's semantics, mixed_precision/loss_scaler.h):
//   backward:          loss * scale()
//   clip_grad_norm_:   unscale(max_norm): checks overflow on every rank, unscales, clips
//   optimizer step:    finish_step(clip): unscale (if not yet), update the scale; true = skip
class LossScaling {
 public:
  LossScaling(const LossScalerConfig& config, std::shared_ptr<zero::Engine> engine, c10::Device device);

  double scale() const { return scaler_.scale(); }
  at::Tensor scale_loss(const at::Tensor& loss) const;  // loss * scale()
  // Once per step (later calls return the first result): collective. Whether any rank's gradients
  // overflowed (one all-reduce); if not, they are divided by the scale the backward used and, with
  // max_norm, clipped in the same pass (one more all-reduce where gradients are sharded). Returns
  // the global norm of the unscaled gradients, inf on overflow (the gradients are then untouched).
  // norm_type other than 2: unscaled first, then measured and clipped by the engine in that norm.
  double unscale(std::optional<double> max_norm, double norm_type = 2.0);
  // At the optimizer step (collective): unscale(clip) unless done, then clip to `clip` if it was
  // done without; updates the scale; returns true when the step must be skipped (overflow).
  bool finish_step(std::optional<double> clip);
  // A new backward begins: an unscale() not followed by a step is forgotten.
  void new_backward() { checked_ = overflow_ = clipped_ = false; }

  const mixed_precision::LossScaler& scaler() const { return scaler_; }
  // The scaler's state as one line of text (checkpoints), and back.
  std::string state_text() const;
  void load_state_text(const std::string& text);  // throws std::invalid_argument for a bad line

 private:
  mixed_precision::LossScaler scaler_;
  std::shared_ptr<zero::Engine> engine_;
  c10::Device device_;
  bool checked_ = false, overflow_ = false, clipped_ = false;
  double norm_ = 0;
};

}  // namespace accel
