// accel::sharding::checkpoint — activation checkpointing: run a forward without keeping its
// activations and recompute it during backward (libtorch C++ has no torch.utils.checkpoint).
//
//   outs = checkpoint(fn, inputs, params);
//
// Forward: fn(inputs) runs under NoGradGuard; the outputs get one autograd node whose inputs are
// `inputs` and `params`. Kept for backward: the inputs (detached), the RNG states (the CPU default
// generator, and the CUDA generator of each CUDA device the inputs and params are on) and the autocast
// state (CPU and CUDA: enabled, dtype, cache). Nothing fn allocates survives the forward except its outputs.
//
// Backward: restores the RNG and autocast states of the forward, re-runs fn with grad on detached
// copies of the inputs (allocations charged to memory::Category::Activations), and computes the
// gradients of the inputs and of `params` with torch::autograd::grad. The node returns both: the
// parameters' gradients then reach their AccumulateGrad nodes in the outer backward, exactly as
// without checkpointing (.grad accumulates, post-accumulate-grad hooks fire, in the outer graph task
// whose end-of-backward callbacks the engine relies on). The RNG states are put back as found, so the
// training run draws the same random numbers as one without checkpointing (dropout stays bitwise equal).
//
// `params` are the tensors fn reads that need gradients besides its inputs (the module's parameters).
// Backward refuses (std::runtime_error) a recomputed graph that reaches a leaf requiring grad which is
// neither: its gradient would be lost. Outputs that do not require grad and undefined output gradients
// are skipped; inputs that do not require grad get none.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace accel::sharding {

using CheckpointFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// `name` appears in errors (the module's type). Without grad mode, or when nothing requires grad, it
// is fn(inputs).
std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params, const std::string& name = "checkpoint");

}  // namespace accel::sharding
