// accel::nn::cross_entropy — the mean cross entropy of a language model's logits, computed in fp32 from
// logits in their own dtype (bf16, fp16 or fp32; fp64 stays fp64), so that nobody needs an fp32 copy of
// the logits first. On CUDA (a build with accel's kernels, kernels/cross_entropy.h) it is one kernel
// forward and one backward: the loss reads the logits twice and keeps them (not an fp32 log_softmax as
// large again), and backward writes the gradient once, in the logits' dtype. Elsewhere it is ATen's
// composite: the logits in fp32, log_softmax, nll_loss. Both give log_softmax's numbers (the fused
// rows' sums in an order of their own) and nll_loss's mean over the targets that are not ignore_index.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace accel::nn {

// logits [..., V] (floating), targets [...] (integer, as many as the logits' rows, each in [0, V) or
// ignore_index): the mean of -log softmax(logits)[target] over the targets that are not ignore_index,
// as a 0-dim fp32 tensor (fp64 for fp64 logits). A target outside [0, V) is nll_loss's error on the
// CPU (on CUDA its device-side assert, which ends the process's CUDA context) and a nan loss on the
// fused path (which does not read the targets on the host). The fused path has no double backward
// (create_graph throws).
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, std::int64_t ignore_index = -100);

// The same loss through ATen's composite path on any device: what cross_entropy does where it is not fused.
at::Tensor cross_entropy_composite(const at::Tensor& logits, const at::Tensor& targets,
                                   std::int64_t ignore_index = -100);

// Whether cross_entropy(logits, ...) takes the fused kernels: CUDA logits in fp32, fp16 or bf16, in a
// build with them.
bool fused_cross_entropy(const at::Tensor& logits);

}  // namespace accel::nn
