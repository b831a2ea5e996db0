// accel::mixed_precision fp8 — tensorwise dynamic scaling, saturating casts, and the fp8 all-gather
// codec for ZeRO-3 / FULL_SHARD units.
//
// Formats: e4m3 (at::kFloat8_e4m3fn, max 448: weights and activations) and e5m2 (at::kFloat8_e5m2,
// max 57344: gradients) — the "HYBRID" recipe of TransformerEngine / torchao's tensorwise default.
//
// Scaling (torchao's "dynamic tensorwise"): amax = max|x|, scale = fp8_max / amax * 2^-margin, stored
// as a 0-dim fp32 tensor (no host sync), with the convention q = fp8(x * scale), x ~= float(q) / scale.
// (at::_scaled_mm takes the inverse, 1/scale, as its scale_a / scale_b.)
//
// Saturation is explicit: quantize clamps x * scale to [-max, max] before the cast, so finite inputs
// never become inf/nan (a plain cast of a value above max gives nan for e4m3fn and inf for e5m2).
// Non-finite inputs, documented behaviour:
//   * quantize with a given scale: +-inf saturates to +-max; nan stays nan.
//   * dynamic scaling (amax taken from the tensor itself): an inf or nan anywhere makes amax
//     non-finite and the scale nan, so EVERY element quantizes to nan. The overflow is not hidden
//     behind a saturated value: the loss goes nan, where the fp16 loss scaler's found_inf or the user
//     sees it.
//   * amax == 0 (an all-zero tensor): scale 1.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <vector>

namespace accel::comm {
class Communicator;
class Work;
}  // namespace accel::comm

namespace accel::mixed_precision {

enum class Fp8Format { E4M3, E5M2 };

at::ScalarType fp8_dtype(Fp8Format f);  // kFloat8_e4m3fn, kFloat8_e5m2
double fp8_max(Fp8Format f);            // 448, 57344
const char* to_string(Fp8Format f);     // "e4m3", "e5m2"

// max|x| as a 0-dim fp32 tensor on x's device (0 for an empty tensor; nan/inf propagate).
at::Tensor abs_max(const at::Tensor& x);
// fp8_max / amax * 2^-margin as a 0-dim (or same-shaped, for a vector of amaxes) fp32 tensor,
// computed in fp64; amax == 0 -> 1; a non-finite amax -> nan (see the header comment).
at::Tensor scale_from_amax(const at::Tensor& amax, Fp8Format f, int margin = 0);
double scale_from_amax(double amax, Fp8Format f, int margin = 0);

// fp8(clamp(x * scale, -max, max)): x any floating dtype (computed in fp32), scale a 0-dim fp32
// tensor (or a double). Returns a tensor of fp8_dtype(f) with x's shape, contiguous.
at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, Fp8Format f);
at::Tensor quantize(const at::Tensor& x, double scale, Fp8Format f);
// float(q) / scale, in `dtype` (computed in fp32).
at::Tensor dequantize(const at::Tensor& q, const at::Tensor& scale, at::ScalarType dtype = at::kFloat);
at::Tensor dequantize(const at::Tensor& q, double scale, at::ScalarType dtype = at::kFloat);

// An fp8 tensor with its scale (x ~= float(data) / scale): tensorwise, or axiswise for a 2-D tensor
// (torchao's rowwise recipe: [R, 1], a scale per row, or [1, C], a scale per column).
struct Fp8Tensor {
  at::Tensor data;   // fp8_dtype(format)
  at::Tensor scale;  // 0-dim fp32, or [R, 1] / [1, C] fp32 (axiswise)
  Fp8Format format = Fp8Format::E4M3;
  at::Tensor inverse = at::Tensor();  // 1 / scale where the quantizer computed it (the fused casts), else undefined

  at::Tensor dequantize(at::ScalarType dtype = at::kFloat) const;
  at::Tensor inv_scale() const;  // 1 / scale: what at::_scaled_mm takes (`inverse` when there is one)
};

// ---- layouts for the fp8 products ----------------------------------------------------------------
//
// at::_scaled_mm (cuBLASLt) takes its first operand row-major and its second column-major. An fp8
// operand in another layout is copied into that one by the product, through ATen's strided copy: for
// Float8Linear's backward, grad_output and the input, each as large as an activation. So each operand
// is quantized straight into the layout of the product that reads it. Column-major: data [R, C] with
// strides {1, R}, the transpose of a contiguous [C, R]; the values and scale do not change.
enum Fp8Layout : unsigned { kRowMajor = 1u, kColumnMajor = 2u };
bool is_column_major(const at::Tensor& t);  // a 2-D t whose t() is contiguous

// Dynamic tensorwise quantization: scale from this tensor's own amax. On a CUDA device, for fp32, fp16
// and bf16, through the fused kernels (kernels/fp8_cast.h: two launches, no host synchronization) where
// the build has them; elsewhere through the composite path below. The same bits either way.
Fp8Tensor quantize_dynamic(const at::Tensor& x, Fp8Format f, int margin = 0);
// Dynamic axiswise quantization of a 2-D x (torchao's rowwise recipe): the amax over `dim`, so one scale
// per row for dim 1 ([R, 1]) or per column for dim 0 ([1, C]); an outlier then coarsens its own row or
// column only. The dim reduced is the matmul's inner one. Fused on CUDA as quantize_dynamic (one launch).
// pow2_scales: each scale rounded down to a power of two, 2^floor(log2(scale)) computed in fp32 as
// torchao does (round_scales_to_power_of_2, on in its rowwise recipe): the scaling is then exact.
// layout: kRowMajor or kColumnMajor (above; on CUDA a per-column cast (dim 0) writes the column-major
// layout itself, a per-row one is cast, then transposed by the tiled kernel).
Fp8Tensor quantize_dynamic_axiswise(const at::Tensor& x, std::int64_t dim, Fp8Format f, int margin = 0,
                                    bool pow2_scales = false, Fp8Layout layout = kRowMajor);
// The composite ATen path of the two (abs_max or amax, scale_from_amax, quantize: about a dozen small
// kernels on a device): what the CPU runs, and the reference the fused kernels are tested against.
Fp8Tensor quantize_dynamic_composite(const at::Tensor& x, Fp8Format f, int margin = 0);
Fp8Tensor quantize_dynamic_axiswise_composite(const at::Tensor& x, std::int64_t dim, Fp8Format f, int margin = 0,
                                              bool pow2_scales = false);
// Whether quantize_dynamic(x, ...) takes the fused kernels for this tensor.
bool fused_fp8_casts(const at::Tensor& x);

// One dynamic tensorwise quantization of a 2-D x (quantize_dynamic's numbers) in the layouts asked for
// (kRowMajor, kColumnMajor or both; the other's data undefined). On CUDA both come from one cast
// kernel writing the two layouts (kernels/fp8_cast.h); elsewhere the column-major copy is the
// row-major data transposed. gelu_first: of at::gelu(x) (exact), the same bytes; on CUDA the casts
// compute it on the way and it is never written. column_sums: also the sums of the columns of the
// values quantized, in fp32 ([cols]; a linear layer's bias gradient from its output gradient): where
// the cast writes the column-major layout on CUDA, it sums as it reads (each 32-row tile in order, then
// the tiles in order; another order than at::sum's, so other roundings); elsewhere
// x.sum(0, kFloat), at::sum's bits.
struct Fp8Layouts {
  Fp8Tensor row_major, column_major;
  at::Tensor column_sums;  // (with column_sums)
};
Fp8Layouts quantize_dynamic_2d(const at::Tensor& x, Fp8Format f, unsigned layouts, int margin = 0,
                               bool gelu_first = false, bool column_sums = false);
// The same values in the other layout: `t` column-major (t itself when it already is; a tiled
// transpose kernel on CUDA).
Fp8Tensor column_major(const Fp8Tensor& t);

// ---- fp8 all-gather codec (ZeRO-3 / FULL_SHARD units) -------------------------------------------
//
// After the optimizer step, per step (every rank, same unit order):
//   at::Tensor scales = agree_scales(local_amaxes(master_shards), group, Fp8Format::E4M3);  // ONE all-reduce
//   per unit u: Fp8Tensor full = all_gather_fp8(master_shards[u], scales[u], E4M3, group);
//               params = full.dequantize(compute dtype)  (or hand full to Float8Linear as its weight)
// Every rank quantizes its shard with the same per-unit scale (the max over ranks of the shard amaxes
// = the amax of the whole unit), so the gathered bytes are exactly quantize(full unit, scale): the
// result equals the unsharded quantize -> dequantize. The gather moves 1 byte per element: half of a
// bf16 gather.

// max|shard| of each tensor, as a 1-D fp32 tensor [shards.size()] (an empty/undefined shard: 0). On
// the first defined shard's device (CPU when none).
at::Tensor local_amaxes(const std::vector<at::Tensor>& shards);
// ONE all-reduce (max) of the per-unit amaxes over `group` (a copy: local_amaxes is not modified),
// then scale_from_amax: a 1-D fp32 tensor of per-unit scales, identical on every rank. Collective.
at::Tensor agree_scales(const at::Tensor& local_amaxes, comm::Communicator& group, Fp8Format f, int margin = 0);

// Quantizes this rank's shard (k elements, any shape: flattened) with the agreed `scale` (0-dim or
// 1-element fp32) and all-gathers it: returns the full unit (group.size() * k fp8 elements, rank r's
// at [r*k, (r+1)*k)) with that scale. Collective; blocking.
Fp8Tensor all_gather_fp8(const at::Tensor& shard, const at::Tensor& scale, Fp8Format f, comm::Communicator& group);
// The same, asynchronous, into `out` (fp8_dtype(f), group.size() * shard.numel() elements,
// contiguous, caller-owned; it must stay alive until the Work completes). The shard is quantized
// before this returns.
std::shared_ptr<comm::Work> all_gather_fp8_async(const at::Tensor& shard, const at::Tensor& scale, Fp8Format f,
                                                 comm::Communicator& group, const at::Tensor& out);

}  // namespace accel::mixed_precision
