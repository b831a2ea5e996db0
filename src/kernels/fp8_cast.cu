// The fused fp8 casts (fp8_cast.h). Each thread reads whole 16-byte packs where x and out are aligned
// for it (a scalar loop otherwise, and for the tail).
//
// amax as bits: |x| is non-negative, so its fp32 bit patterns order as unsigned integers, +inf above every
// finite value and a nan (fabsf clears the sign: 0x7f800001 and up) above +inf. One unsigned max over
// the bits (warp shuffles, then atomicMax across blocks) is therefore max|x| with nan propagating, as
// at::linalg_vector_norm(x, inf) and at::amax give it.
#include "kernels/fp8_cast.h"

#include "base/error.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace accel::kernels::fp8 {
namespace {

constexpr double kMinAmax = 1e-12;  // fp8.cpp's (torchao's EPS)
constexpr int kThreads = 256;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(c10::Half v) { return static_cast<float>(v); }
__device__ __forceinline__ float to_f32(c10::BFloat16 v) { return static_cast<float>(v); }

__device__ __forceinline__ std::uint32_t abs_bits(float v) { return __float_as_uint(fabsf(v)); }

// An element as the cast reads it: fp32(x), or with kGelu fp32(T(gelu(x))), at::gelu's value (exact,
// erf) in at::gelu's arithmetic (GeluErfFunctor: fp32, x * 0.5 * (1 + erf(x * sqrt(1/2)))), rounded to
// x's dtype as at::gelu's output is: the bytes are then those of quantizing at::gelu(x).
template <bool kGelu, typename T>
__device__ __forceinline__ float load(T v) {
  if constexpr (kGelu) {
    constexpr float kAlpha = M_SQRT1_2;
    const float x = to_f32(v);
    const float g = x * 0.5f * (1.0f + ::erf(x * kAlpha));
    if constexpr (std::is_same_v<T, float>)
      return g;
    else
      return to_f32(T(g));
  } else {
    return to_f32(v);
  }
}

// scale_from_amax (fp8.cpp), in fp64 then rounded to fp32: qmax = fp8_max * 2^-margin.
__device__ __forceinline__ float scale_of(std::uint32_t amax_bits, double qmax) {
  const double a = static_cast<double>(__uint_as_float(amax_bits));
  if (!isfinite(a)) return __int_as_float(0x7fc00000);
  if (a == 0) return 1.0f;
  return static_cast<float>(qmax / fmax(a, kMinAmax));
}

// The scale rounded down to a power of two, 2^floor(log2(scale)) in fp32 as torchao computes it
// (round_scales_to_power_of_2); nan stays nan.
__device__ __forceinline__ float pow2_floor(float scale) { return exp2f(floorf(log2f(scale))); }

// An axis's scale from its amax, rounded down to a power of two under pow2.
__device__ __forceinline__ float axis_scale(std::uint32_t amax_bits, double qmax, bool pow2) {
  const float scale = scale_of(amax_bits, qmax);
  return pow2 ? pow2_floor(scale) : scale;
}

// fp8(clamp(fp32(x) * scale, -max, max)) with c10's conversion (round to nearest even). The clamp
// keeps a nan (comparisons with it are false), as at::clamp does.
template <OutFormat F>
__device__ __forceinline__ std::uint8_t cast(float v, float scale, float max) {
  float y = v * scale;
  y = y > max ? max : (y < -max ? -max : y);
  if constexpr (F == OutFormat::E4M3)
    return c10::Float8_e4m3fn(y).x;
  else
    return c10::Float8_e5m2(y).x;
}

template <OutFormat F>
constexpr float fp8_max() {
  return F == OutFormat::E4M3 ? 448.0f : 57344.0f;
}

// Block-wide unsigned max; every thread gets it. blockDim.x a multiple of 32, at most 1024.
__device__ std::uint32_t block_max(std::uint32_t m) {
  __shared__ std::uint32_t warps[32];
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, o));
  __syncthreads();  // (warps[] may still be read from an earlier call)
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = m;
  __syncthreads();
  m = threadIdx.x < (blockDim.x >> 5) ? warps[threadIdx.x] : 0u;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, o));
  if (threadIdx.x == 0) warps[0] = m;
  __syncthreads();
  return warps[0];
}

template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};
template <int N>
struct alignas(N) Bytes {
  std::uint8_t v[N];
};

template <typename T, bool kPacked, bool kGelu = false>
__global__ void amax_kernel(const T* __restrict__ x, std::int64_t n, std::uint32_t* __restrict__ amax_bits) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::uint32_t m = 0;
  std::int64_t done = 0;
  if constexpr (kPacked) {
    constexpr int kN = Pack<T>::kN;
    const std::int64_t packs = n / kN;
    const auto* p = reinterpret_cast<const Pack<T>*>(x);
    for (std::int64_t i = first; i < packs; i += stride) {
      const Pack<T> v = p[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) m = max(m, abs_bits(load<kGelu>(v.v[j])));
    }
    done = packs * kN;
  }
  for (std::int64_t i = done + first; i < n; i += stride) m = max(m, abs_bits(load<kGelu>(x[i])));
  m = block_max(m);
  if (threadIdx.x == 0 && m != 0) atomicMax(amax_bits, m);
}

template <typename T, OutFormat F, bool kPacked, bool kGelu = false>
__global__ void quantize_kernel(const T* __restrict__ x, std::int64_t n, const std::uint32_t* __restrict__ amax_bits,
                                double qmax, std::uint8_t* __restrict__ out, float* __restrict__ scale_out,
                                float* __restrict__ inv_out) {
  const float scale = scale_of(*amax_bits, qmax);
  constexpr float kMax = fp8_max<F>();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) {
    *scale_out = scale;
    *inv_out = 1.0f / scale;
  }
  std::int64_t done = 0;
  if constexpr (kPacked) {
    constexpr int kN = Pack<T>::kN;
    const std::int64_t packs = n / kN;
    const auto* p = reinterpret_cast<const Pack<T>*>(x);
    auto* q = reinterpret_cast<Bytes<kN>*>(out);
    for (std::int64_t i = first; i < packs; i += stride) {
      const Pack<T> v = p[i];
      Bytes<kN> b;
#pragma unroll
      for (int j = 0; j < kN; ++j) b.v[j] = cast<F>(load<kGelu>(v.v[j]), scale, kMax);
      q[i] = b;
    }
    done = packs * kN;
  }
  for (std::int64_t i = done + first; i < n; i += stride) out[i] = cast<F>(load<kGelu>(x[i]), scale, kMax);
}

// A [rows, cols] matrix in tiles of 32 x 32 elements, a block of 32 x 8 threads walking tiles b,
// b + gridDim.x, ... (numbered along the rows of tiles). Each warp reads (and writes to `out`) 32
// neighbouring elements of a row; the tile goes through shared memory, and the warps write the
// transposed tile to `out_t` along its rows, 32 neighbouring bytes each. kCast: x is T, cast to F with
// the tensor's scale (from amax_bits); otherwise x is already bytes (T = uint8), copied as they are.
// (The row's padding of 4 bytes puts the 32 bytes a warp reads down a column in 32 different banks.)
// col_partial (kCast; null: none): each tile's column sums of the values cast, in fp32, to
// col_partial[tile row][column] ([ceil(rows / 32), cols]): each thread sums its rows of the tile (ty,
// ty + 8, ty + 16, ty + 24) in order from 0, then the 8 threads of a column are added in order ty = 0..7
// (sum_partials_kernel adds the tile rows up). Plain fp32 additions throughout (__fadd_rn: none
// contracted), so the order alone decides the bits, and a host loop in that order gives them.
constexpr int kTile = 32, kTileRows = 8;
template <typename T, bool kCast, OutFormat F, bool kGelu = false>
__global__ void tile_transpose_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                      const std::uint32_t* __restrict__ amax_bits, double qmax,
                                      std::uint8_t* __restrict__ out, std::uint8_t* __restrict__ out_t,
                                      float* __restrict__ scale_out, float* __restrict__ inv_out,
                                      float* __restrict__ col_partial = nullptr) {
  __shared__ std::uint8_t tile[kTile][kTile + 4];
  __shared__ float sums[kTileRows][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  float scale = 1.0f;
  if constexpr (kCast) {
    scale = scale_of(*amax_bits, qmax);
    if (blockIdx.x == 0 && tx == 0 && ty == 0) {
      *scale_out = scale;
      *inv_out = 1.0f / scale;
    }
  }
  constexpr float kMax = fp8_max<F>();
  const std::int64_t col_tiles = (cols + kTile - 1) / kTile;
  const std::int64_t tiles = col_tiles * ((rows + kTile - 1) / kTile);
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // (the same trip count in every thread)
    const std::int64_t r0 = t / col_tiles * kTile, c0 = t % col_tiles * kTile;
    float sum = 0.0f;  // (this thread's rows of column c0 + tx, for col_partial)
    for (int i = ty; i < kTile; i += kTileRows) {
      const std::int64_t r = r0 + i, c = c0 + tx;
      if (r < rows && c < cols) {
        std::uint8_t q;
        if constexpr (kCast) {
          const float v = load<kGelu>(x[r * cols + c]);
          q = cast<F>(v, scale, kMax);
          sum = __fadd_rn(sum, v);  // (never contracted into an FMA with the GELU's product)
        } else {
          q = x[r * cols + c];
        }
        if (out) out[r * cols + c] = q;
        tile[i][tx] = q;
      }
    }
    if (col_partial) sums[ty][tx] = sum;
    __syncthreads();
    for (int i = ty; i < kTile; i += kTileRows) {
      const std::int64_t c = c0 + i, r = r0 + tx;
      if (c < cols && r < rows) out_t[c * rows + r] = tile[tx][i];
    }
    if (col_partial && ty == 0 && c0 + tx < cols) {
      float total = sums[0][tx];
#pragma unroll
      for (int k = 1; k < kTileRows; ++k) total = __fadd_rn(total, sums[k][tx]);
      col_partial[r0 / kTile * cols + c0 + tx] = total;
    }
    __syncthreads();  // (the tile and the sums are written again for the block's next one)
  }
}

// out[c] = the sum over the tile rows of col_partial[., c]: a block of 32 x kSumGroups threads per 32
// columns; thread (tx, ty) adds tile rows [ty * chunk, (ty + 1) * chunk) of column tx in order (chunk =
// ceil(row_tiles / kSumGroups); a warp reads 32 neighbouring floats), then the groups are added in order
// ty = 0, 1, ... A fixed order, so the same bits every run.
constexpr int kSumCols = 32, kSumGroups = 32;
// (__launch_bounds__: the compiler keeps each thread's registers within what a block of 1024 can have.)
__global__ void __launch_bounds__(kSumCols* kSumGroups)
    sum_partials_kernel(const float* __restrict__ col_partial, std::int64_t row_tiles, std::int64_t cols,
                        float* __restrict__ out) {
  __shared__ float part[kSumGroups][kSumCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kSumCols + tx;
  const std::int64_t chunk = (row_tiles + kSumGroups - 1) / kSumGroups;
  const std::int64_t t0 = ty * chunk, t1 = t0 + chunk < row_tiles ? t0 + chunk : row_tiles;
  float s = 0.0f;
  if (c < cols)
    for (std::int64_t t = t0; t < t1; ++t) s = __fadd_rn(s, col_partial[t * cols + c]);
  part[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float total = part[0][tx];
    for (int g = 1; g < kSumGroups; ++g) total = __fadd_rn(total, part[g][tx]);
    out[c] = total;
  }
}

// dim 1: one block per row, two passes over it (its amax, then its cast).
template <typename T, OutFormat F>
__global__ void rowwise_kernel(const T* __restrict__ x, std::int64_t cols, double qmax, bool pow2,
                               std::uint8_t* __restrict__ out, float* __restrict__ scale_out,
                               float* __restrict__ inv_out) {
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  std::uint8_t* qr = out + row * cols;
  std::uint32_t m = 0;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = max(m, abs_bits(to_f32(xr[c])));
  m = block_max(m);
  const float scale = axis_scale(m, qmax, pow2);
  constexpr float kMax = fp8_max<F>();
  if (threadIdx.x == 0) {
    scale_out[row] = scale;
    inv_out[row] = 1.0f / scale;
  }
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) qr[c] = cast<F>(to_f32(xr[c]), scale, kMax);
}

// dim 0: a block of 32 x 8 threads per 32 columns; thread (tx, ty) walks column tx's rows ty, ty + 8, ...
// (a warp reads 32 neighbouring columns of one row), the 8 partial maxima of a column meet in shared
// memory, then the same walk casts (cast_columns: row-major, or column-major through tiles).
constexpr int kColTile = 32, kColRows = 8;

// The casts of the block's 32 columns (col = c0 + tx, its scale) over rows [r_begin, r_end), written to
// `out` row-major, or (kT) transposed, [cols, rows] row-major: 32 rows at a time go through a tile of
// shared memory, so that a warp writes 32 neighbouring bytes of one row of the transpose (as
// tile_transpose_kernel does). Every thread of the block calls it (the tiles' barriers).
template <typename T, OutFormat F, bool kT>
__device__ __forceinline__ void cast_columns(const T* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                             std::int64_t c0, std::int64_t r_begin, std::int64_t r_end, float scale,
                                             std::uint8_t* __restrict__ out) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t col = c0 + tx;
  constexpr float kMax = fp8_max<F>();
  if constexpr (!kT) {
    if (col < cols)
      for (std::int64_t r = r_begin + ty; r < r_end; r += kColRows)
        out[r * cols + col] = cast<F>(to_f32(x[r * cols + col]), scale, kMax);
  } else {
    __shared__ std::uint8_t tile[kColTile][kColTile + 4];
    for (std::int64_t r0 = r_begin; r0 < r_end; r0 += kColTile) {  // (the same trip count in every thread)
      for (int i = ty; i < kColTile; i += kColRows) {
        const std::int64_t r = r0 + i;
        if (r < r_end && col < cols) tile[i][tx] = cast<F>(to_f32(x[r * cols + col]), scale, kMax);
      }
      __syncthreads();
      for (int i = ty; i < kColTile; i += kColRows) {
        const std::int64_t c = c0 + i, r = r0 + tx;
        if (c < cols && r < r_end) out[c * rows + r] = tile[tx][i];
      }
      __syncthreads();  // (the tile is written again for the next 32 rows)
    }
  }
}

template <typename T, OutFormat F, bool kT>
__global__ void colwise_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t cols, double qmax, bool pow2,
                               std::uint8_t* __restrict__ out, float* __restrict__ scale_out,
                               float* __restrict__ inv_out) {
  __shared__ std::uint32_t part[kColRows][kColTile];
  __shared__ float scales[kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColTile + tx;
  std::uint32_t m = 0;
  if (col < cols)
    for (std::int64_t r = ty; r < rows; r += kColRows) m = max(m, abs_bits(to_f32(x[r * cols + col])));
  part[ty][tx] = m;
  __syncthreads();
  if (ty == 0) {
    for (int k = 1; k < kColRows; ++k) m = max(m, part[k][tx]);
    scales[tx] = axis_scale(m, qmax, pow2);
    if (col < cols) {
      scale_out[col] = scales[tx];
      inv_out[col] = 1.0f / scales[tx];
    }
  }
  __syncthreads();
  cast_columns<T, F, kT>(x, rows, cols, static_cast<std::int64_t>(blockIdx.x) * kColTile, 0, rows, scales[tx], out);
}

// dim 0, chunked (a column_amax scratch given): the rows split among blocks as well, so that a few
// columns still fill the device. Block (tile, chunk) of 32 x 8 threads walks its 32 columns over its
// chunk's rows; the column's maximum goes to column_amax[col] by atomicMax (zeroed before), then a
// second kernel of the same shape reads it, scales and casts. The numbers are colwise_kernel's.
template <typename T>
__global__ void column_amax_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                   std::int64_t chunk_rows, std::uint32_t* __restrict__ column_amax) {
  __shared__ std::uint32_t part[kColRows][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColTile + tx;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  std::uint32_t m = 0;
  if (col < cols)
    for (std::int64_t r = r0 + ty; r < r1; r += kColRows) m = max(m, abs_bits(to_f32(x[r * cols + col])));
  part[ty][tx] = m;
  __syncthreads();
  if (ty == 0 && col < cols) {
    for (int k = 1; k < kColRows; ++k) m = max(m, part[k][tx]);
    if (m != 0) atomicMax(column_amax + col, m);
  }
}

template <typename T, OutFormat F, bool kT>
__global__ void column_cast_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                   std::int64_t chunk_rows, const std::uint32_t* __restrict__ column_amax, double qmax,
                                   bool pow2, std::uint8_t* __restrict__ out, float* __restrict__ scale_out,
                                   float* __restrict__ inv_out) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kColTile, col = c0 + tx;
  const float scale = col < cols ? axis_scale(column_amax[col], qmax, pow2) : 1.0f;
  if (col < cols && blockIdx.y == 0 && ty == 0) {
    scale_out[col] = scale;
    inv_out[col] = 1.0f / scale;
  }
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  cast_columns<T, F, kT>(x, rows, cols, c0, r0, r1, scale, out);
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw accel::RuntimeError(std::string("fp8 cast kernel (") + what + "): " + cudaGetErrorString(e));
}

double qmax_of(OutFormat f, int margin) {
  if (margin < 0) throw accel::InvalidArgumentError("fp8: margin must be >= 0, got " + std::to_string(margin));
  return (f == OutFormat::E4M3 ? 448.0 : 57344.0) * std::ldexp(1.0, -margin);
}

// The multiprocessors of the first device asked.
int multiprocessors() {
  static int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();  // (not a launch's error for check_launch to report)
      n = 80;
    }
    return n;
  }();
  return sms;
}

// The blocks that fill the device: 8 a multiprocessor.
std::int64_t device_blocks() { return 8LL * multiprocessors(); }

int blocks_for(std::int64_t work) {
  const std::int64_t want = (work + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(want, device_blocks())));
}

template <typename T, OutFormat F>
void tensorwise(const T* x, std::int64_t n, double qmax, std::uint32_t* amax_bits, std::uint8_t* out, float* scale,
                float* inv, cudaStream_t s) {
  if (cudaMemsetAsync(amax_bits, 0, sizeof(std::uint32_t), s) != cudaSuccess) check_launch("zero the amax");
  const bool packed =
      reinterpret_cast<std::uintptr_t>(x) % 16 == 0 && reinterpret_cast<std::uintptr_t>(out) % Pack<T>::kN == 0;
  const int grid = blocks_for(packed ? n / Pack<T>::kN + 1 : n);
  if (packed) {
    amax_kernel<T, true><<<grid, kThreads, 0, s>>>(x, n, amax_bits);
    check_launch("amax");
    quantize_kernel<T, F, true><<<grid, kThreads, 0, s>>>(x, n, amax_bits, qmax, out, scale, inv);
  } else {
    amax_kernel<T, false><<<grid, kThreads, 0, s>>>(x, n, amax_bits);
    check_launch("amax");
    quantize_kernel<T, F, false><<<grid, kThreads, 0, s>>>(x, n, amax_bits, qmax, out, scale, inv);
  }
  check_launch("quantize");
}

// The grid of tile_transpose_kernel<T, kCast, F> for a [rows, cols] matrix: a block a tile, at most as
// many as the device holds at once (its occupancy: a grid-stride loop gains nothing from a second,
// partial wave).
template <typename T, bool kCast, OutFormat F, bool kGelu = false>
int tile_blocks(std::int64_t rows, std::int64_t cols) {
  static const int resident = [] {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tile_transpose_kernel<T, kCast, F, kGelu>,
                                                      kTile * kTileRows, 0) != cudaSuccess ||
        per_sm < 1) {
      (void)cudaGetLastError();
      per_sm = 1;
    }
    return per_sm * multiprocessors();
  }();
  const std::int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(tiles, resident)));
}

// (kGelu: of gelu(x), as `load` reads it.) Without out_t (gelu only: quantize_tensorwise_2d sends the
// plain row-major cast to quantize_tensorwise), the row-major bytes alone through the flat cast.
template <typename T, OutFormat F, bool kGelu>
void tensorwise_2d(const T* x, std::int64_t rows, std::int64_t cols, double qmax, std::uint32_t* amax_bits,
                   std::uint8_t* out, std::uint8_t* out_t, float* scale, float* inv, float* col_partial,
                   cudaStream_t s) {
  const std::int64_t n = rows * cols;
  if (cudaMemsetAsync(amax_bits, 0, sizeof(std::uint32_t), s) != cudaSuccess) check_launch("zero the amax");
  const bool packed = reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  if (packed)
    amax_kernel<T, true, kGelu><<<blocks_for(n / Pack<T>::kN + 1), kThreads, 0, s>>>(x, n, amax_bits);
  else
    amax_kernel<T, false, kGelu><<<blocks_for(n), kThreads, 0, s>>>(x, n, amax_bits);
  check_launch("amax");
  if (!out_t) {
    if (packed && reinterpret_cast<std::uintptr_t>(out) % Pack<T>::kN == 0)
      quantize_kernel<T, F, true, kGelu>
          <<<blocks_for(n / Pack<T>::kN + 1), kThreads, 0, s>>>(x, n, amax_bits, qmax, out, scale, inv);
    else
      quantize_kernel<T, F, false, kGelu><<<blocks_for(n), kThreads, 0, s>>>(x, n, amax_bits, qmax, out, scale, inv);
    check_launch("quantize");
    return;
  }
  tile_transpose_kernel<T, true, F, kGelu>
      <<<tile_blocks<T, true, F, kGelu>(rows, cols), dim3(kTile, kTileRows), 0, s>>>(
          x, rows, cols, amax_bits, qmax, out, out_t, scale, inv, col_partial);
  check_launch("cast and transpose");
}

template <typename T, OutFormat F, bool kT>
void axiswise(const T* x, std::int64_t rows, std::int64_t cols, int dim, double qmax, bool pow2,
              std::uint32_t* column_amax, std::uint8_t* out, float* scale, float* inv, cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  if (dim == 0 && column_amax) {
    const std::int64_t tiles = (cols + kColTile - 1) / kColTile;
    if (tiles > 0x7fffffffLL) throw accel::InvalidArgumentError("fp8 columnwise cast: too many columns");
    // Enough (tile, chunk) blocks to fill the device, each chunk a multiple of 32 rows (the tiles of the
    // transposed cast; the block walks 8 rows at a time) and at least 64 rows.
    const std::int64_t want = std::max<std::int64_t>(1, device_blocks() / tiles);
    std::int64_t chunk_rows = (rows + want - 1) / want;
    chunk_rows = std::max<std::int64_t>(64, (chunk_rows + kColTile - 1) / kColTile * kColTile);
    const std::int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    if (chunks > 65535) throw accel::InvalidArgumentError("fp8 columnwise cast: too many row chunks");
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), block(kColTile, kColRows);
    if (cudaMemsetAsync(column_amax, 0, static_cast<std::size_t>(cols) * sizeof(std::uint32_t), s) != cudaSuccess)
      check_launch("zero the column amaxes");
    column_amax_kernel<T><<<grid, block, 0, s>>>(x, rows, cols, chunk_rows, column_amax);
    check_launch("column amax");
    column_cast_kernel<T, F, kT>
        <<<grid, block, 0, s>>>(x, rows, cols, chunk_rows, column_amax, qmax, pow2, out, scale, inv);
    check_launch("column cast");
    return;
  }
  if (dim == 1) {
    if (rows > 0x7fffffffLL) throw accel::InvalidArgumentError("fp8 rowwise cast: more than 2^31 - 1 rows");
    rowwise_kernel<T, F><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, cols, qmax, pow2, out, scale, inv);
  } else {
    const std::int64_t tiles = (cols + kColTile - 1) / kColTile;
    if (tiles > 0x7fffffffLL) throw accel::InvalidArgumentError("fp8 columnwise cast: too many columns");
    colwise_kernel<T, F, kT>
        <<<static_cast<unsigned>(tiles), dim3(kColTile, kColRows), 0, s>>>(x, rows, cols, qmax, pow2, out, scale, inv);
  }
  check_launch(dim == 1 ? "rowwise" : "columnwise");
}

// Calls fn with a typed null pointer of x's element type and the format as a template value.
template <typename Fn>
void dispatch(InDtype dtype, OutFormat fmt, Fn&& fn) {
  auto with_format = [&](auto tag) {
    if (fmt == OutFormat::E4M3)
      fn(tag, std::integral_constant<OutFormat, OutFormat::E4M3>{});
    else
      fn(tag, std::integral_constant<OutFormat, OutFormat::E5M2>{});
  };
  switch (dtype) {
    case InDtype::Float32: with_format(static_cast<const float*>(nullptr)); return;
    case InDtype::Float16: with_format(static_cast<const c10::Half*>(nullptr)); return;
    case InDtype::BFloat16: with_format(static_cast<const c10::BFloat16*>(nullptr)); return;
  }
  throw accel::InvalidArgumentError("fp8 cast kernels: an input dtype other than fp32, fp16 and bf16");
}

}  // namespace

bool available() { return true; }

void quantize_tensorwise(const void* x, InDtype dtype, std::int64_t n, OutFormat fmt, int margin,
                         std::uint32_t* amax_bits, std::uint8_t* out, float* scale, float* inv_scale, void* stream) {
  const double qmax = qmax_of(fmt, margin);
  dispatch(dtype, fmt, [&](auto tag, auto f) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    tensorwise<T, decltype(f)::value>(static_cast<const T*>(x), n, qmax, amax_bits, out, scale, inv_scale,
                                      static_cast<cudaStream_t>(stream));
  });
}

void quantize_tensorwise_2d(const void* x, InDtype dtype, std::int64_t rows, std::int64_t cols, OutFormat fmt,
                            int margin, std::uint32_t* amax_bits, std::uint8_t* out, std::uint8_t* out_t, float* scale,
                            float* inv_scale, void* stream, bool gelu, float* column_partial) {
  if (!out && !out_t) throw accel::InvalidArgumentError("fp8 cast: neither layout asked for");
  if (rows < 0 || cols < 0) throw accel::InvalidArgumentError("fp8 cast: negative dims");
  if (column_partial && !out_t)
    throw accel::InvalidArgumentError("fp8 cast: column sums come with the transposed layout (out_t)");
  if (!out_t && !gelu) {  // (row-major alone: the flat cast; of gelu(x), tensorwise_2d's flat branch)
    quantize_tensorwise(x, dtype, rows * cols, fmt, margin, amax_bits, out, scale, inv_scale, stream);
    return;
  }
  const double qmax = qmax_of(fmt, margin);
  if (rows == 0 || cols == 0) throw accel::InvalidArgumentError("fp8 cast: an empty matrix");
  dispatch(dtype, fmt, [&](auto tag, auto f) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    if (gelu)
      tensorwise_2d<T, decltype(f)::value, true>(static_cast<const T*>(x), rows, cols, qmax, amax_bits, out, out_t,
                                                 scale, inv_scale, column_partial, static_cast<cudaStream_t>(stream));
    else
      tensorwise_2d<T, decltype(f)::value, false>(static_cast<const T*>(x), rows, cols, qmax, amax_bits, out, out_t,
                                                  scale, inv_scale, column_partial, static_cast<cudaStream_t>(stream));
  });
}

void sum_column_partials(const float* column_partial, std::int64_t rows, std::int64_t cols, float* out, void* stream) {
  if (rows <= 0 || cols <= 0) throw accel::InvalidArgumentError("fp8 column sums: an empty matrix");
  const std::int64_t blocks = (cols + kSumCols - 1) / kSumCols;
  if (blocks > 0x7fffffffLL) throw accel::InvalidArgumentError("fp8 column sums: too many columns");
  sum_partials_kernel<<<static_cast<unsigned>(blocks), dim3(kSumCols, kSumGroups), 0,
                        static_cast<cudaStream_t>(stream)>>>(column_partial, (rows + kTile - 1) / kTile, cols, out);
  check_launch("column sums");
}

void transpose_bytes(const std::uint8_t* in, std::int64_t rows, std::int64_t cols, std::uint8_t* out, void* stream) {
  if (rows < 0 || cols < 0) throw accel::InvalidArgumentError("fp8 transpose: negative dims");
  if (rows == 0 || cols == 0) return;
  tile_transpose_kernel<std::uint8_t, false, OutFormat::E4M3>
      <<<tile_blocks<std::uint8_t, false, OutFormat::E4M3>(rows, cols), dim3(kTile, kTileRows), 0,
         static_cast<cudaStream_t>(stream)>>>(in, rows, cols, nullptr, 0.0, nullptr, out, nullptr, nullptr);
  check_launch("transpose");
}

void quantize_axiswise(const void* x, InDtype dtype, std::int64_t rows, std::int64_t cols, int dim, OutFormat fmt,
                       int margin, bool pow2_scales, std::uint32_t* column_amax, std::uint8_t* out,
                       bool out_column_major, float* scale, float* inv_scale, void* stream) {
  if (dim != 0 && dim != 1) throw accel::InvalidArgumentError("fp8 axiswise cast: dim must be 0 or 1");
  if (out_column_major && dim != 0)
    throw accel::InvalidArgumentError("fp8 axiswise cast: the column-major output goes with dim 0");
  const double qmax = qmax_of(fmt, margin);
  dispatch(dtype, fmt, [&](auto tag, auto f) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    if (out_column_major)
      axiswise<T, decltype(f)::value, true>(static_cast<const T*>(x), rows, cols, dim, qmax, pow2_scales, column_amax,
                                            out, scale, inv_scale, static_cast<cudaStream_t>(stream));
    else
      axiswise<T, decltype(f)::value, false>(static_cast<const T*>(x), rows, cols, dim, qmax, pow2_scales, column_amax,
                                             out, scale, inv_scale, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace accel::kernels::fp8
