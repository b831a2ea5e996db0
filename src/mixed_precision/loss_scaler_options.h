// accel::mixed_precision::LossScalerOptions — DeepSpeed's fp16 block with its defaults. Torch-free:
// the config (accel::LossScalerConfig is this type) reads it, the LossScaler (loss_scaler.h) runs it.
#pragma once

namespace accel::mixed_precision {

struct LossScalerOptions {
  double loss_scale = 0;                // > 0: a static scale (update() never changes it); 0: dynamic
  int initial_scale_power = 16;         // dynamic: the first scale is 2^initial_scale_power
  int loss_scale_window = 1000;         // clean steps since the last overflow before the scale doubles
  int hysteresis = 2;                   // DeepSpeed's delayed_shift: overflows tolerated before halving
  bool consecutive_hysteresis = false;  // a clean step refills the hysteresis (else only a doubling does)
  double min_loss_scale = 1;            // the scale never goes below; an overflow at this scale is an error
};

}  // namespace accel::mixed_precision
