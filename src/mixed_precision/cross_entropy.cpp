#include "mixed_precision/cross_entropy.h"
#include "base/error.h"
#include "kernels/cross_entropy.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#if ACCEL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace accel::nn {

namespace {

// logits as rows [N, V] and targets as [N] int64 on the logits' device, after checking their shapes.
std::pair<at::Tensor, at::Tensor> as_rows(const at::Tensor& logits, const at::Tensor& targets) {
  if (!logits.defined() || logits.dim() < 1 || !at::isFloatingType(logits.scalar_type()))
    throw accel::InvalidArgumentError("cross_entropy: expected floating logits [..., vocab]");
  if (!targets.defined() || at::isFloatingType(targets.scalar_type()) || targets.is_complex() ||
      targets.scalar_type() == at::kBool)
    throw accel::InvalidArgumentError("cross_entropy: expected integer targets");
  const std::int64_t vocab = logits.size(-1);
  if (vocab < 1) throw accel::InvalidArgumentError("cross_entropy: the logits' last dimension (vocab) is 0");
  const at::Tensor rows = logits.reshape({-1, vocab});
  if (targets.numel() != rows.size(0))
    throw accel::InvalidArgumentError(
        fmt::format("cross_entropy: {} targets for {} rows of logits (logits [..., vocab] with [...] targets)",
                    targets.numel(), rows.size(0)));
  return {rows, targets.reshape({-1}).to(logits.device(), at::kLong)};
}

#if ACCEL_WITH_CUDA_KERNELS
kernels::loss::InDtype loss_kernel_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat  ? kernels::loss::InDtype::Float32
         : x.scalar_type() == at::kHalf ? kernels::loss::InDtype::Float16
                                        : kernels::loss::InDtype::BFloat16;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The fused loss over contiguous rows [N, V] and int64 targets [N] on one CUDA device. Saves the logits
// themselves (their dtype), the targets and two floats a row for backward.
struct CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            std::int64_t ignore_index) {
    const c10::cuda::CUDAGuard guard(logits.device());
    const std::int64_t rows = logits.size(0), vocab = logits.size(1);
    const auto fopts = logits.options().dtype(at::kFloat);
    at::Tensor row_max = at::empty({rows}, fopts), row_logsum = at::empty({rows}, fopts);
    at::Tensor row_loss = at::empty({rows}, fopts);
    kernels::loss::cross_entropy_forward(
        logits.const_data_ptr(), loss_kernel_dtype(logits), rows, vocab, targets.const_data_ptr<std::int64_t>(),
        ignore_index, row_max.mutable_data_ptr<float>(), row_logsum.mutable_data_ptr<float>(),
        row_loss.mutable_data_ptr<float>(), c10::cuda::getCurrentCUDAStream(logits.device().index()).stream());
    // nll_loss's mean: the sum over the rows over the count of targets that are not ignore_index (0 / 0
    // = nan when every one is, as nll_loss gives it).
    const at::Tensor count = at::ne(targets, ignore_index).sum(at::kFloat);
    // (Inputs, so that either one modified in place before backward is an error, as under nll_loss for
    // the targets: a loader writing the next batch into the same buffer.)
    ctx->save_for_backward({logits, targets});
    ctx->saved_data["row_max"] = row_max;
    ctx->saved_data["row_logsum"] = row_logsum;
    ctx->saved_data["count"] = count;
    ctx->saved_data["ignore_index"] = ignore_index;
    return row_loss.sum() / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (at::GradMode::is_enabled())
      throw accel::InvalidArgumentError(
          "cross_entropy: the fused loss has no double backward (create_graph); use cross_entropy_composite");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &targets = saved[1];
    const at::Tensor row_max = ctx->saved_data["row_max"].toTensor(),
                     row_logsum = ctx->saved_data["row_logsum"].toTensor(), count = ctx->saved_data["count"].toTensor();
    const c10::cuda::CUDAGuard guard(logits.device());
    // (nll_loss's backward: -upstream / count at each target)
    const at::Tensor w = (grad_outputs[0].to(at::kFloat) / count).contiguous();
    at::Tensor grad = at::empty(logits.sizes(), logits.options());
    kernels::loss::cross_entropy_backward(
        logits.const_data_ptr(), loss_kernel_dtype(logits), logits.size(0), logits.size(1),
        targets.const_data_ptr<std::int64_t>(), ctx->saved_data["ignore_index"].toInt(),
        row_max.const_data_ptr<float>(), row_logsum.const_data_ptr<float>(), w.const_data_ptr<float>(),
        grad.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream(logits.device().index()).stream());
    return {grad, at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

bool fused_cross_entropy(const at::Tensor& logits) {
  const auto t = logits.scalar_type();
  return kernels::loss::available() && logits.is_cuda() && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16);
}

at::Tensor cross_entropy_composite(const at::Tensor& logits, const at::Tensor& targets, std::int64_t ignore_index) {
  const auto [rows, t] = as_rows(logits, targets);
  const at::Tensor x = rows.scalar_type() == at::kDouble ? rows : rows.to(at::kFloat);
  return at::nll_loss(at::log_softmax(x, -1), t, /*weight=*/{}, at::Reduction::Mean, ignore_index);
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, std::int64_t ignore_index) {
  if (!fused_cross_entropy(logits)) return cross_entropy_composite(logits, targets, ignore_index);
#if ACCEL_WITH_CUDA_KERNELS
  const auto [rows, t] = as_rows(logits, targets);
  return CrossEntropyFunction::apply(rows.contiguous(), t.contiguous(), ignore_index);
#else
  throw accel::LogicError("cross_entropy: fused kernels called in a build without them");
#endif
}

}  // namespace accel::nn
