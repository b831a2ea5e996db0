// accel::optim (internal) — torch::optim's per-parameter state, made as torch makes it, for the fused
// steps (fused_step.cpp on the CPU, multi_tensor_step.cpp on a device): both step torch's own state
// objects, so a checkpoint or a later torch::optim step sees what torch would have made.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <memory>

namespace accel::optim::detail {

// The Adam/AdamW state of `p` in `opt`, created on first use as torch creates it (step 0, zero
// moments shaped like p, the max of the squares with amsgrad).
template <class State>
State& adam_state(torch::optim::Optimizer& opt, const at::Tensor& p, bool amsgrad) {
  auto& slot = opt.state()[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto st = std::make_unique<State>();
    st->step(0);
    st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    if (amsgrad) st->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(st);
  }
  return static_cast<State&>(*slot);
}

}  // namespace accel::optim::detail
