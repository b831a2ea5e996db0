// accel::optim — fused CPU optimizer steps on flat fp32 memory: Adam, AdamW and SGD in one pass over
// parameter, gradient and state, vectorized (at::vec) and split across threads (at::parallel_for).
//
// Each element goes through exactly the operations torch::optim applies to it, in the same order and
// rounding, so a fused step equals torch::optim's step bit for bit on the same inputs, for every
// option (tests/optim/test_fused_step.cpp checks each combination at 1-3 threads and under each
// ATEN_CPU_CAPABILITY). That takes matching ATen on this machine, not just the formula: the kernels
// use FMA exactly where ATen's do (they follow ATen's own CPU capability: none under DEFAULT), and
// Adam's square root is the one ATen takes, MKL's vmsSqrt where libtorch has MKL (not always
// correctly rounded, so the sqrt instruction would differ by an ulp on ~1 element in 6).
// Because every element is computed on its own, a step over a slice of a tensor gives the same bits
// as the step over the whole: offloaded sub-groups, shards and the unsharded reference all agree.
//
// Layering: below zero/ (which calls it for every CPU step) and offload/ (which calls the span
// functions on buffers read from disk); depends on ATen only.
#pragma once

#include <cstdint>
#include <typeinfo>

namespace at {
class Tensor;
}
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

// One step on n contiguous floats, split across at::parallel_for's threads (run serially when called
// inside a parallel region). step: this update's step number (1 for the first, as torch's state
// counts after incrementing). max_exp_avg_sq may be null unless amsgrad. exp_avg and exp_avg_sq start
// at zero on the first step (the caller zero-fills them, as torch creates them).
void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
               std::int64_t n, std::int64_t step, const AdamHyper& h);

// torch::optim::SGDOptions.
struct SgdHyper {
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

// One step on n contiguous floats (threads as adam_step). momentum_buffer: null when momentum == 0;
// first: this step fills the buffer (torch: buf = d_p.clone(); its old contents are not read),
// otherwise buf = buf * momentum + (1 - dampening) * d_p.
void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, bool first, const SgdHyper& h);

// Steps `opt` in place exactly as its own step() would — same state objects (created on the first
// step as torch creates them, keyed by the parameter's TensorImpl), same step counters, parameters
// without a gradient skipped, each param group with its own options, version counters bumped — when
// it is exactly a torch::optim::Adam, AdamW or SGD (not a subclass) whose parameters with gradients
// are all contiguous CPU float32, as are their gradients and existing state. Returns false, having
// changed nothing, otherwise (another type, another dtype or device, sparse or strided tensors, or
// amsgrad switched on over state made without it): the caller then calls the optimizer's own step.
// Parameters on a device (CUDA) take PyTorch's fused multi-tensor kernels instead
// (multi_tensor_step.h: torch::optim's state, PyTorch's fused arithmetic), counted the same.
bool fused_step(torch::optim::Optimizer& opt);
// The same for a subclass of `type` (one of those three) whose step arithmetic is the base's own:
// zero/'s sharded optimizers derive from the user's optimizer type only to bracket its step.
bool fused_step_as(torch::optim::Optimizer& opt, const std::type_info& type);
// The same step for one of opt's parameters alone (CPU float32 with its gradient): its state, its step
// counter and its param group's options, as fused_step_as would step it among the others (every
// element is computed on its own, so stepping the parameters one at a time gives the same bits).
// False, having changed nothing, where fused_step_as would not take the CPU kernels for it. Not
// counted in fused_steps(). zero/ steps a shard this way as soon as its gradient is final
// (ShardingSpec::step_in_backward).
bool fused_step_param(torch::optim::Optimizer& opt, const std::type_info& type, const at::Tensor& param);
// Steps taken through the fused kernels in this process (fused_step / fused_step_as returning true):
// what tests and benchmarks check to know the fast path ran.
std::uint64_t fused_steps();

}  // namespace accel::optim
