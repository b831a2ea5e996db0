// accel::kernels fp8 casts on CUDA — the amax, scale and cast in front of each fp8 product fused into
// two kernels (tensorwise) or one (axiswise), instead of the dozen small ATen kernels of the composite
// path (mixed_precision/fp8.h: abs_max, scale_from_amax, quantize). Raw pointers, no ATen: this header
// is plain C++ and the kernels (fp8_cast.cu) are compiled by nvcc; mixed_precision/fp8.cpp wraps them
// for tensors. Built when the CUDA toolkit is found (ACCEL_WITH_CUDA_KERNELS); `available()` says so.
//
// The numbers are the composite path's, bit for bit (tests/mixed_precision/test_fp8_cuda.cpp, a
// *_CUDA test): amax = max|x| (nan propagates), scale = fp32(fp8_max * 2^-margin / max(amax, 1e-12))
// computed in fp64 (amax 0 -> 1, non-finite -> nan), q = fp8(clamp(fp32(x) * scale, -max, max)) with
// c10's round-to-nearest-even conversion, inv_scale = 1 / scale in fp32.
#pragma once

#include <cstdint>

namespace accel::kernels::fp8 {

enum class InDtype { Float32 = 0, Float16 = 1, BFloat16 = 2 };
enum class OutFormat { E4M3 = 0, E5M2 = 1 };

// Whether this build has the kernels (false: every launch below throws).
bool available();

// Tensorwise, two kernels on `stream` (a cudaStream_t), no host synchronization:
//   amax_bits: one uint32 of device memory, scratch (zeroed here first);
//   x: n contiguous elements; out: n bytes; scale, inv_scale: one float each, written.
void quantize_tensorwise(const void* x, InDtype dtype, std::int64_t n, OutFormat fmt, int margin,
                         std::uint32_t* amax_bits, std::uint8_t* out, float* scale, float* inv_scale, void* stream);

// Tensorwise over a row-major [rows, cols] x, the cast writing the fp8 values row-major to `out` and
// their transpose ([cols, rows], row-major: x's values column-major) to `out_t`, in one pass through
// tiles of shared memory; either may be null, not both (out alone: quantize_tensorwise's flat cast).
// The operands of at::_scaled_mm in the layouts cuBLASLt takes (a row-major, b column-major), so that
// no product copies one. Two kernels, as quantize_tensorwise; the same bytes in both layouts.
// gelu: the values quantized are at::gelu(x) (exact, erf), computed on the way in its arithmetic and
// rounded to x's dtype as its output is, so the bytes and scale are those of quantizing at::gelu(x),
// which is never written (a GELU in front of a linear layer: Float8Linear's forward_gelu).
// column_partial (with out_t; null: none): scratch of ceil(rows / 32) x cols floats of device memory
// where the cast leaves each 32-row tile's column sums of the values it casts (fp32; a fixed order);
// sum_column_partials then adds them up, in order: the column sums of x without another read of it (a
// linear layer's bias gradient, from its output gradient's cast).
void quantize_tensorwise_2d(const void* x, InDtype dtype, std::int64_t rows, std::int64_t cols, OutFormat fmt,
                            int margin, std::uint32_t* amax_bits, std::uint8_t* out, std::uint8_t* out_t, float* scale,
                            float* inv_scale, void* stream, bool gelu = false, float* column_partial = nullptr);
// out [cols] (fp32, device memory) = the column sums that quantize_tensorwise_2d left in column_partial for
// a [rows, cols] x. One kernel: per column, 32 groups of consecutive tiles, then the groups in order.
void sum_column_partials(const float* column_partial, std::int64_t rows, std::int64_t cols, float* out, void* stream);

// out [cols, rows] = the transpose of the row-major [rows, cols] bytes `in` (tiles through shared memory,
// reads and writes along rows): an fp8 tensor into the other layout. One kernel.
void transpose_bytes(const std::uint8_t* in, std::int64_t rows, std::int64_t cols, std::uint8_t* out, void* stream);

// Axiswise over a row-major [rows, cols] x: dim 1 gives one scale per row (scale and inv_scale: rows
// floats), dim 0 one per column (cols floats); out: rows * cols bytes, row-major, or with
// out_column_major (dim 0 only) their transpose, [cols, rows] row-major: the values column-major, the
// second operand of at::_scaled_mm, written through tiles of shared memory by the cast itself. One
// kernel, a block per row or per 32 columns; for dim 0 with column_amax (cols uint32 of device memory,
// scratch, zeroed here) the rows are split among blocks too: two kernels, the same numbers (null: one
// kernel). pow2_scales: each scale rounded down to a power of two, 2^floor(log2(scale)) (torchao's
// rowwise).
void quantize_axiswise(const void* x, InDtype dtype, std::int64_t rows, std::int64_t cols, int dim, OutFormat fmt,
                       int margin, bool pow2_scales, std::uint32_t* column_amax, std::uint8_t* out,
                       bool out_column_major, float* scale, float* inv_scale, void* stream);

}  // namespace accel::kernels::fp8
