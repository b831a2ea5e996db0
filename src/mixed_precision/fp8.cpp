#include "mixed_precision/fp8.h"
#include "base/env.h"
#include "base/error.h"

#include "comm/communicator.h"
#include "kernels/fp8_cast.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#if ACCEL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace accel::mixed_precision {

namespace {
// torchao's EPS: a positive amax below it is raised to it, so fp8_max / amax stays finite in fp32.
constexpr double kMinAmax = 1e-12;

void check_margin(int margin) {
  if (margin < 0) throw accel::InvalidArgumentError(fmt::format("fp8: margin must be >= 0, got {}", margin));
}

at::Tensor as_scalar_scale(const at::Tensor& scale, const at::Device& device) {
  if (!scale.defined() || scale.numel() != 1)
    throw accel::InvalidArgumentError("fp8: the scale must be a 1-element tensor");
  return scale.reshape({}).to(device, at::kFloat);
}
// A tensorwise scale as 0-dim, an axiswise one ([R, 1] / [1, C]) as it is, to broadcast over x.
at::Tensor broadcast_scale(const at::Tensor& scale, const at::Tensor& x) {
  if (scale.defined() && scale.numel() != 1) {
    const bool rows = scale.dim() == 2 && x.dim() == 2 && scale.size(1) == 1 && scale.size(0) == x.size(0);
    const bool cols = scale.dim() == 2 && x.dim() == 2 && scale.size(0) == 1 && scale.size(1) == x.size(1);
    if (!rows && !cols)
      throw accel::InvalidArgumentError("fp8: an axiswise scale must be [rows, 1] or [1, columns] of a 2-D tensor");
    return scale.to(x.device(), at::kFloat);
  }
  return as_scalar_scale(scale, x.device());
}

kernels::fp8::InDtype kernel_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat  ? kernels::fp8::InDtype::Float32
         : x.scalar_type() == at::kHalf ? kernels::fp8::InDtype::Float16
                                        : kernels::fp8::InDtype::BFloat16;
}
kernels::fp8::OutFormat kernel_format(Fp8Format f) {
  return f == Fp8Format::E4M3 ? kernels::fp8::OutFormat::E4M3 : kernels::fp8::OutFormat::E5M2;
}

// ACCEL_FP8_COLWISE: single or chunked (checked).
[[maybe_unused]] std::string column_cast_mode() {
  std::string m = env::get("ACCEL_FP8_COLWISE");
  if (m != "single" && m != "chunked")
    throw accel::InvalidArgumentError("ACCEL_FP8_COLWISE must be single or chunked, got '" + m + "'");
  return m;
}

#if ACCEL_WITH_CUDA_KERNELS
// The row-major [rows, cols] bytes `data` (a CUDA tensor, contiguous) transposed by the tiled kernel:
// the same values as a column-major [rows, cols] tensor.
at::Tensor transposed_on_device(const at::Tensor& data) {
  const c10::cuda::CUDAGuard guard(data.device());
  at::Tensor t = at::empty({data.size(1), data.size(0)}, data.options());
  kernels::fp8::transpose_bytes(static_cast<const std::uint8_t*>(data.const_data_ptr()), data.size(0), data.size(1),
                                static_cast<std::uint8_t*>(t.mutable_data_ptr()),
                                c10::cuda::getCurrentCUDAStream(data.device().index()).stream());
  return t.t();
}
#endif

// The fused tensorwise casts of a 2-D x (or of gelu(x)) into the layouts asked for (fused_fp8_casts(x)
// holds): one cast kernel writing both.
Fp8Layouts fused_quantize_2d(const at::Tensor& x_in, Fp8Format f, unsigned layouts, int margin, bool gelu,
                             bool column_sums) {
#if ACCEL_WITH_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const std::int64_t rows = x.size(0), cols = x.size(1);
  const auto fopts = x.options().dtype(at::kFloat);
  const auto qopts = x.options().dtype(fp8_dtype(f));
  at::Tensor out = layouts & kRowMajor ? at::empty({rows, cols}, qopts) : at::Tensor();
  at::Tensor out_t = layouts & kColumnMajor ? at::empty({cols, rows}, qopts) : at::Tensor();
  at::Tensor scale = at::empty({}, fopts), inverse = at::empty({}, fopts);
  at::Tensor amax_bits = at::empty({1}, x.options().dtype(at::kInt));
  // (column sums with the tiled cast: each tile's in a scratch, then added up)
  at::Tensor partial = column_sums && out_t.defined() ? at::empty({(rows + 31) / 32, cols}, fopts) : at::Tensor();
  void* stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  kernels::fp8::quantize_tensorwise_2d(x.const_data_ptr(), kernel_dtype(x), rows, cols, kernel_format(f), margin,
                                       reinterpret_cast<std::uint32_t*>(amax_bits.mutable_data_ptr()),
                                       out.defined() ? static_cast<std::uint8_t*>(out.mutable_data_ptr()) : nullptr,
                                       out_t.defined() ? static_cast<std::uint8_t*>(out_t.mutable_data_ptr()) : nullptr,
                                       scale.mutable_data_ptr<float>(), inverse.mutable_data_ptr<float>(), stream, gelu,
                                       partial.defined() ? partial.mutable_data_ptr<float>() : nullptr);
  Fp8Layouts r;
  if (partial.defined()) {  // (else quantize_dynamic_2d sums them itself)
    r.column_sums = at::empty({cols}, fopts);
    kernels::fp8::sum_column_partials(partial.const_data_ptr<float>(), rows, cols,
                                      r.column_sums.mutable_data_ptr<float>(), stream);
  }
  if (out.defined()) r.row_major = Fp8Tensor{out, scale, f, inverse};
  if (out_t.defined()) r.column_major = Fp8Tensor{out_t.t(), scale, f, inverse};
  return r;
#else
  (void)x_in, (void)f, (void)layouts, (void)margin, (void)gelu, (void)column_sums;
  throw accel::LogicError("fp8: fused casts called in a build without them");
#endif
}

// The fused casts on x's device and current stream (fused_fp8_casts(x) holds): tensorwise without a
// dim, else axiswise along it (a 2-D x); column_major (dim 0 only): the cast writes the column-major
// layout itself.
Fp8Tensor fused_quantize(const at::Tensor& x_in, std::optional<std::int64_t> dim, Fp8Format f, int margin,
                         bool pow2_scales, bool column_major = false) {
#if ACCEL_WITH_CUDA_KERNELS
  if (column_major && (!dim || *dim != 0)) throw accel::LogicError("fp8: only the per-column cast writes column-major");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const auto fopts = x.options().dtype(at::kFloat);
  at::Tensor out = column_major ? at::empty({x.size(1), x.size(0)}, x.options().dtype(fp8_dtype(f)))
                                : at::empty(x.sizes(), x.options().dtype(fp8_dtype(f)));
  const std::vector<std::int64_t> shape = !dim        ? std::vector<std::int64_t>{}
                                          : *dim == 1 ? std::vector<std::int64_t>{x.size(0), 1}
                                                      : std::vector<std::int64_t>{1, x.size(1)};
  at::Tensor scale = at::empty(shape, fopts), inverse = at::empty(shape, fopts);
  auto* q = static_cast<std::uint8_t*>(out.mutable_data_ptr());
  void* stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  if (!dim) {
    at::Tensor amax_bits = at::empty({1}, x.options().dtype(at::kInt));
    kernels::fp8::quantize_tensorwise(x.const_data_ptr(), kernel_dtype(x), x.numel(), kernel_format(f), margin,
                                      reinterpret_cast<std::uint32_t*>(amax_bits.mutable_data_ptr()), q,
                                      scale.mutable_data_ptr<float>(), inverse.mutable_data_ptr<float>(), stream);
  } else {
    // Per column: one kernel a 32 columns (single), or the rows split among blocks too (chunked).
    at::Tensor column_amax;
    if (*dim == 0 && column_cast_mode() == "chunked") column_amax = at::empty({x.size(1)}, x.options().dtype(at::kInt));
    kernels::fp8::quantize_axiswise(
        x.const_data_ptr(), kernel_dtype(x), x.size(0), x.size(1), static_cast<int>(*dim), kernel_format(f), margin,
        pow2_scales, column_amax.defined() ? reinterpret_cast<std::uint32_t*>(column_amax.mutable_data_ptr()) : nullptr,
        q, column_major, scale.mutable_data_ptr<float>(), inverse.mutable_data_ptr<float>(), stream);
  }
  return Fp8Tensor{column_major ? out.t() : out, scale, f, inverse};
#else
  (void)x_in, (void)dim, (void)f, (void)margin, (void)pow2_scales, (void)column_major;
  throw accel::LogicError("fp8: fused casts called in a build without them");
#endif
}
}  // namespace

bool fused_fp8_casts(const at::Tensor& x) {
  const auto t = x.scalar_type();
  return kernels::fp8::available() && x.is_cuda() && x.numel() > 0 &&
         (t == at::kFloat || t == at::kHalf || t == at::kBFloat16);
}

at::ScalarType fp8_dtype(Fp8Format f) { return f == Fp8Format::E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2; }
double fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0 : 57344.0; }
const char* to_string(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

at::Tensor abs_max(const at::Tensor& x) {
  if (x.numel() == 0) return at::zeros({}, x.options().dtype(at::kFloat));
  // max|x| without materializing |x|; nan propagates (an inf-norm of a tensor holding nan is nan). An
  // fp64 x reduces in its own dtype (the norm refuses a narrowing dtype), then rounds to fp32.
  const double inf = std::numeric_limits<double>::infinity();
  if (x.scalar_type() == at::kDouble) return at::linalg_vector_norm(x, inf, c10::nullopt, false).to(at::kFloat);
  return at::linalg_vector_norm(x, inf, c10::nullopt, false, at::kFloat);
}

at::Tensor scale_from_amax(const at::Tensor& amax_t, Fp8Format f, int margin) {
  check_margin(margin);
  at::Tensor a = amax_t.to(at::kDouble);
  at::Tensor s = (fp8_max(f) * std::ldexp(1.0, -margin)) / a.clamp_min(kMinAmax);
  s = at::where(a == 0, at::ones_like(s), s);
  s = at::where(at::isfinite(a), s, at::full_like(s, std::numeric_limits<double>::quiet_NaN()));
  return s.to(at::kFloat);
}

double scale_from_amax(double a, Fp8Format f, int margin) {
  check_margin(margin);
  if (!std::isfinite(a)) return std::numeric_limits<double>::quiet_NaN();
  if (a == 0) return 1.0;
  // Rounded to fp32 like the tensor version, so both give the same scale.
  return static_cast<double>(static_cast<float>(fp8_max(f) * std::ldexp(1.0, -margin) / std::max(a, kMinAmax)));
}

at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, Fp8Format f) {
  if (!at::isFloatingType(x.scalar_type()))
    throw accel::InvalidArgumentError("fp8 quantize: expected a floating tensor");
  const double m = fp8_max(f);
  at::Tensor y = at::mul(x.to(at::kFloat), broadcast_scale(scale, x));
  y.clamp_(-m, m);  // explicit saturation: finite values never become inf/nan; +-inf -> +-max; nan stays
  return y.to(fp8_dtype(f)).contiguous();
}

at::Tensor quantize(const at::Tensor& x, double scale, Fp8Format f) {
  return quantize(x, at::full({}, scale, x.options().dtype(at::kFloat)), f);
}

at::Tensor dequantize(const at::Tensor& q, const at::Tensor& scale, at::ScalarType dtype) {
  return at::div(q.to(at::kFloat), broadcast_scale(scale, q)).to(dtype);
}

at::Tensor dequantize(const at::Tensor& q, double scale, at::ScalarType dtype) {
  return dequantize(q, at::full({}, scale, q.options().dtype(at::kFloat)), dtype);
}

at::Tensor Fp8Tensor::dequantize(at::ScalarType dtype) const { return mixed_precision::dequantize(data, scale, dtype); }

at::Tensor Fp8Tensor::inv_scale() const { return inverse.defined() ? inverse : at::reciprocal(scale.to(at::kFloat)); }

Fp8Tensor quantize_dynamic_composite(const at::Tensor& x, Fp8Format f, int margin) {
  at::Tensor s = scale_from_amax(abs_max(x), f, margin);
  return Fp8Tensor{quantize(x, s, f), s, f};
}

Fp8Tensor quantize_dynamic(const at::Tensor& x, Fp8Format f, int margin) {
  check_margin(margin);
  if (fused_fp8_casts(x)) return fused_quantize(x, std::nullopt, f, margin, false);
  return quantize_dynamic_composite(x, f, margin);
}

namespace {
void check_axiswise(const at::Tensor& x, std::int64_t dim) {
  if (x.dim() != 2 || (dim != 0 && dim != 1))
    throw accel::InvalidArgumentError("fp8 axiswise quantize: expected a 2-D tensor and dim 0 or 1");
}
}  // namespace

Fp8Tensor quantize_dynamic_axiswise_composite(const at::Tensor& x, std::int64_t dim, Fp8Format f, int margin,
                                              bool pow2_scales) {
  check_axiswise(x, dim);
  if (x.numel() == 0) return quantize_dynamic_composite(x, f, margin);
  at::Tensor s = scale_from_amax(x.abs().amax({dim}, /*keepdim=*/true).to(at::kFloat), f, margin);
  if (pow2_scales) s = at::exp2(at::floor(at::log2(s)));  // (fp32, torchao's _round_scale_down_to_power_of_2)
  return Fp8Tensor{quantize(x, s, f), s, f};
}

Fp8Tensor quantize_dynamic_axiswise(const at::Tensor& x, std::int64_t dim, Fp8Format f, int margin, bool pow2_scales,
                                    Fp8Layout layout) {
  check_axiswise(x, dim);
  check_margin(margin);
  if (layout != kRowMajor && layout != kColumnMajor)
    throw accel::InvalidArgumentError("fp8 axiswise quantize: the layout is kRowMajor or kColumnMajor");
  if (fused_fp8_casts(x) && dim == 0 && layout == kColumnMajor)  // (the per-column cast writes that layout)
    return fused_quantize(x, dim, f, margin, pow2_scales, /*column_major=*/true);
  Fp8Tensor q = fused_fp8_casts(x) ? fused_quantize(x, dim, f, margin, pow2_scales)
                                   : quantize_dynamic_axiswise_composite(x, dim, f, margin, pow2_scales);
  return layout == kColumnMajor ? column_major(q) : q;
}

bool is_column_major(const at::Tensor& t) { return t.dim() == 2 && t.t().is_contiguous(); }

Fp8Tensor column_major(const Fp8Tensor& t) {
  if (!t.data.defined() || t.data.dim() != 2)
    throw accel::InvalidArgumentError("fp8 column_major: expected a 2-D fp8 tensor");
  if (is_column_major(t.data)) return t;
  Fp8Tensor r = t;
#if ACCEL_WITH_CUDA_KERNELS
  if (kernels::fp8::available() && t.data.is_cuda() && t.data.is_contiguous() && t.data.numel() > 0) {
    r.data = transposed_on_device(t.data);
    return r;
  }
#endif
  r.data = t.data.t().contiguous().t();
  return r;
}

Fp8Layouts quantize_dynamic_2d(const at::Tensor& x, Fp8Format f, unsigned layouts, int margin, bool gelu_first,
                               bool column_sums) {
  if (x.dim() != 2) throw accel::InvalidArgumentError("fp8 quantize_dynamic_2d: expected a 2-D tensor");
  if (layouts == 0 || (layouts & ~(kRowMajor | kColumnMajor)) != 0)
    throw accel::InvalidArgumentError("fp8 quantize_dynamic_2d: layouts is kRowMajor, kColumnMajor or both");
  check_margin(margin);
  // (The column sums at::sum's wherever the tiled cast did not add them up as it read.)
  auto sums_of = [&](const at::Tensor& v) { return v.sum(0, /*keepdim=*/false, at::kFloat); };
  if (fused_fp8_casts(x) && ((layouts & kColumnMajor) || gelu_first)) {
    Fp8Layouts r = fused_quantize_2d(x, f, layouts, margin, gelu_first, column_sums);
    if (column_sums && !r.column_sums.defined()) r.column_sums = sums_of(gelu_first ? at::gelu(x) : x);
    return r;
  }
  Fp8Layouts r;
  const at::Tensor v = gelu_first ? at::gelu(x) : x;
  if (column_sums) r.column_sums = sums_of(v);
  const Fp8Tensor q = quantize_dynamic(v, f, margin);
  if (layouts & kRowMajor) r.row_major = q;
  if (layouts & kColumnMajor) r.column_major = column_major(q);
  return r;
}

at::Tensor local_amaxes(const std::vector<at::Tensor>& shards) {
  c10::Device device(c10::kCPU);
  for (const auto& s : shards)
    if (s.defined()) {
      device = s.device();
      break;
    }
  at::Tensor out =
      at::zeros({static_cast<std::int64_t>(shards.size())}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (std::size_t i = 0; i < shards.size(); ++i)
    if (shards[i].defined() && shards[i].numel() > 0) out[static_cast<std::int64_t>(i)].copy_(abs_max(shards[i]));
  return out;
}

at::Tensor agree_scales(const at::Tensor& local, comm::Communicator& group, Fp8Format f, int margin) {
  at::Tensor a = local.to(at::kFloat).reshape({-1}).clone();
  group.all_reduce(a, {comm::ReduceOp::Max});
  return scale_from_amax(a, f, margin);
}

comm::WorkPtr all_gather_fp8_async(const at::Tensor& shard, const at::Tensor& scale, Fp8Format f,
                                   comm::Communicator& group, const at::Tensor& out) {
  const std::int64_t k = shard.numel();
  if (!out.defined() || out.scalar_type() != fp8_dtype(f) || out.numel() != k * group.size() || !out.is_contiguous())
    throw accel::InvalidArgumentError(
        fmt::format("all_gather_fp8: out must be a contiguous {} tensor of group.size() * shard.numel() = {} elements",
                    to_string(f), k * group.size()));
  at::Tensor q = quantize(shard.reshape({-1}), scale, f);
  return group.all_gather_async(q, out.view({-1}));
}

Fp8Tensor all_gather_fp8(const at::Tensor& shard, const at::Tensor& scale, Fp8Format f, comm::Communicator& group) {
  at::Tensor out = at::empty({shard.numel() * group.size()}, shard.options().dtype(fp8_dtype(f)));
  all_gather_fp8_async(shard, scale, f, group, out)->wait();
  return Fp8Tensor{out, scale.reshape({}).to(shard.device(), at::kFloat), f};
}

}  // namespace accel::mixed_precision
