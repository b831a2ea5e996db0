// accel::kernels cross entropy on CUDA — the loss of a language model's logits [rows, vocab] computed in
// fp32 straight from their own dtype (bf16, fp16 or fp32), one kernel forward and one backward, instead
// of the composite path's fp32 copy of the logits, log_softmax (an fp32 output as large as the
// logits, kept for backward), nll_loss and their backwards (a dense fp32 gradient twice over). Raw
// pointers, no ATen: plain C++, the kernels (cross_entropy.cu) compiled by nvcc;
// mixed_precision/cross_entropy.cpp wraps them for tensors. Built where fp8_cast.h's kernels are
// (ACCEL_WITH_CUDA_KERNELS); `available()` says so.
//
// The numbers are log_softmax's and nll_loss's on the device, step for step: per row max = max(x),
// logsum = log(sum(exp(x - max))), each log-probability out = x - max - logsum, the row's loss -out[t];
// backward, with w = upstream / count (the mean's), each element (i == t ? -w : 0) + exp(out) * w, in
// fp32, then rounded to the logits' dtype. Only the order of each row's sum is the kernels' own.
#pragma once

#include <cstdint>

namespace accel::kernels::loss {

enum class InDtype { Float32 = 0, Float16 = 1, BFloat16 = 2 };

// Whether this build has the kernels (false: every launch below throws).
bool available();

// Per row r of the row-major, contiguous logits [rows, vocab] (vocab >= 1): row_max[r], row_logsum[r]
// and loss[r] = -out[r, t] (fp32) with t = targets[r] (int64); a row whose target is ignore_index gets
// loss 0, one whose target is outside [0, vocab) a nan loss. One kernel on `stream` (a cudaStream_t), a
// block a row.
void cross_entropy_forward(const void* logits, InDtype dtype, std::int64_t rows, std::int64_t vocab,
                           const std::int64_t* targets, std::int64_t ignore_index, float* row_max, float* row_logsum,
                           float* loss, void* stream);

// grad [rows, vocab] (the logits' dtype, contiguous) = the gradient of the mean loss times the upstream
// gradient: w = *grad_scale (one float of device memory: upstream / count), each element (i == t ? -w :
// 0) + exp(out) * w, out from forward's row_max and row_logsum; a row whose target is ignore_index gets
// w = 0 (zeros), one outside [0, vocab) nans. One kernel, a block a row.
void cross_entropy_backward(const void* logits, InDtype dtype, std::int64_t rows, std::int64_t vocab,
                            const std::int64_t* targets, std::int64_t ignore_index, const float* row_max,
                            const float* row_logsum, const float* grad_scale, void* grad, void* stream);

}  // namespace accel::kernels::loss
