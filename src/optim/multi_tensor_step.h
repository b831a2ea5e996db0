// accel::optim — the optimizer step on a device: torch::optim's Adam, AdamW and SGD through PyTorch's
// fused multi-tensor kernels (at::_fused_adam_, at::_fused_adamw_, at::_fused_sgd_: what
// torch.optim's fused=True runs), a few launches per parameter group instead of a dozen small kernels
// per parameter. The state stays torch::optim's own (the same state objects, step counters and
// moment tensors), so checkpoints, offload and a later step through torch::optim see nothing
// different. The arithmetic is PyTorch's fused one: equal to torch.optim's fused=True bit for bit,
// and to torch::optim's own step to float32 rounding (not bit for bit).
//
// fused_step_as (fused_step.h) takes it for parameters on a CUDA device; the CPU keeps its own fused
// kernels, which are torch::optim's bit for bit.
#pragma once

#include <typeinfo>

namespace torch::optim {
class Optimizer;
}

namespace accel::optim {

// Steps `opt` (exactly a torch::optim::Adam, AdamW or SGD, or a subclass with the base's arithmetic:
// `type`) when every parameter with a gradient, its gradient and its existing state are contiguous
// float32 on one device that is not the CPU (any_device: the CPU too, for tests; PyTorch has CPU
// kernels of these ops). Returns false, having changed nothing, otherwise.
bool multi_tensor_step(torch::optim::Optimizer& opt, const std::type_info& type, bool any_device = false);

}  // namespace accel::optim
