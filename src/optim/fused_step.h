// accel::optim — fused CPU optimizer steps on flat fp32 memory: Adam, AdamW and SGD in one pass over
// parameter, gradient and state, vectorized (at::vec) and split across threads (at::parallel_for).
//
// Each element goes through exactly the operations torch::optim applies to it, in the same order and
// rounding, so a fused step equals torch::optim's step bit for bit on the same inputs (the tests check
// this on random shards for every option combination; where that is impossible the function's comment
// says which operation differs and by how much). Because every element is computed on its own, a step
// over a slice of a tensor gives the same bits as the step over the whole: offloaded sub-groups,
// shards and the unsharded reference all agree.
//
// Layering: below zero/ (which calls it for every CPU step) and offload/ (which calls the span
// functions on buffers read from disk); depends on ATen only.
#pragma once

#include <cstdint>

namespace torch::optim {
class Optimizer;
}

namespace accel::optim {

// torch::optim::AdamOptions / AdamWOptions. decoupled_weight_decay: AdamW (param *= 1 - lr * wd
// before the update), else Adam (grad += wd * param).
struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool amsgrad = false;
  bool decoupled_weight_decay = false;
};

// One step on n contiguous floats. step: this update's step number (1 for the first, as torch's state
// counts after incrementing). max_exp_avg_sq may be null unless amsgrad. exp_avg and exp_avg_sq start
// at zero on the first step (the caller zero-fills them, as torch creates them).
void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
               std::int64_t n, std::int64_t step, const AdamHyper& h);

// torch::optim::SGDOptions.
struct SgdHyper {
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

// One step on n contiguous floats. momentum_buffer: null when momentum == 0; first: this step
// creates the buffer (torch: buf = d_p), otherwise buf = buf * momentum + (1 - dampening) * d_p.
void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, bool first,
              const SgdHyper& h);

// Steps `opt` in place exactly as its own step() would — same state objects (created on the first
// step as torch creates them), same step counters — when it is a torch::optim::Adam, AdamW or SGD whose
// parameters with gradients are all contiguous CPU float32 (gradients too). Returns false, having
// changed nothing, otherwise (another type, another dtype or device, sparse gradients): the caller
// then calls the optimizer's own step.
bool fused_step(torch::optim::Optimizer& opt);

}  // namespace accel::optim
