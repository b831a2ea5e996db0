// The fused cross entropy (cross_entropy.h): a block a row of logits, each thread reading whole 16-byte
// packs from the row's first 16-byte boundary on, and the few elements before it and after the last
// pack one at a time, so that a vocabulary of 50257, whose rows start at every offset, is read in packs
// too (before, such rows were read element by element). The gradient is written the same way where it
// lies as far from a boundary as the logits, element by element otherwise. Forward reads its row twice
// (the max, then the sum of exponentials: log_softmax's two passes and its arithmetic; a one-pass
// rescaled sum would read it once, with other roundings); backward reads it once and writes the
// gradient once. The sums go through a fixed tree (warp shuffles, then the warps in order), so a row's
// numbers do not change from run to run. Each log-probability is computed as log_softmax's CUDA kernel
// computes it, x - max - logsum in fp32.
#include "kernels/cross_entropy.h"

#include "base/error.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace accel::kernels::loss {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(c10::Half v) { return static_cast<float>(v); }
__device__ __forceinline__ float to_f32(c10::BFloat16 v) { return static_cast<float>(v); }

// fp32 to T with c10's conversion (round to nearest even), as at::Tensor::to does.
template <typename T>
__device__ __forceinline__ T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return T(v);
}

template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

// Elements of the row x[0, n) before its first 16-byte boundary (x is aligned to its element).
template <typename T>
__device__ __forceinline__ std::int64_t head_of(const T* x, std::int64_t n) {
  const auto mis = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x) % 16);
  const std::int64_t h = mis == 0 ? 0 : (16 - mis) / static_cast<std::int64_t>(sizeof(T));
  return h < n ? h : n;
}

// f(i, fp32(x[i])) for this thread's elements of the row x[0, n). kPacked: whole 16-byte packs from
// the row's first 16-byte boundary on, and the elements before it and after the last whole pack (fewer
// than a pack each) one at a time, to the block's first threads; otherwise one element at a time.
template <typename T, bool kPacked, typename F>
__device__ __forceinline__ void for_each(const T* x, std::int64_t n, F&& f) {
  if constexpr (kPacked) {
    constexpr int kN = Pack<T>::kN;
    const std::int64_t h = head_of(x, n), packs = (n - h) / kN, tail = h + packs * kN;
    const auto* p = reinterpret_cast<const Pack<T>*>(x + h);
    for (std::int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const Pack<T> v = p[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) f(h + i * kN + j, to_f32(v.v[j]));
    }
    for (std::int64_t e = threadIdx.x; e < h + (n - tail); e += blockDim.x) {
      const std::int64_t i = e < h ? e : tail + (e - h);
      f(i, to_f32(x[i]));
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) f(i, to_f32(x[i]));
  }
}

// Block-wide max and sum (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `warps`: 32 floats of shared memory, free to reuse once every thread has the result.
template <bool kMax>
__device__ float block_reduce(float v, float* warps) {
  auto op = [](float a, float b) { return kMax ? fmaxf(a, b) : a + b; };
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();  // (warps[] may still be read from an earlier call)
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < (blockDim.x >> 5) ? warps[threadIdx.x] : (kMax ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) warps[0] = v;
  }
  __syncthreads();
  return warps[0];
}

template <typename T, bool kPacked>
__global__ void forward_kernel(const T* logits, std::int64_t vocab, const std::int64_t* targets,
                               std::int64_t ignore_index, float* max_out, float* logsum_out, float* loss_out) {
  __shared__ float warps[32];
  const std::int64_t r = blockIdx.x;
  const T* x = logits + r * vocab;
  float m = -INFINITY;
  for_each<T, kPacked>(x, vocab, [&](std::int64_t, float v) { m = fmaxf(m, v); });
  m = block_reduce<true>(m, warps);
  float s = 0.0f;
  for_each<T, kPacked>(x, vocab, [&](std::int64_t, float v) { s += expf(v - m); });
  s = block_reduce<false>(s, warps);
  if (threadIdx.x == 0) {
    const float logsum = logf(s);
    const std::int64_t t = targets[r];
    max_out[r] = m;
    logsum_out[r] = logsum;
    loss_out[r] = t == ignore_index ? 0.0f : (t < 0 || t >= vocab ? NAN : -(to_f32(x[t]) - m - logsum));
  }
}

template <typename T, bool kPacked>
__global__ void backward_kernel(const T* logits, std::int64_t vocab, const std::int64_t* targets,
                                std::int64_t ignore_index, const float* row_max, const float* row_logsum,
                                const float* grad_scale, T* grad) {
  const std::int64_t r = blockIdx.x;
  const T* x = logits + r * vocab;
  T* g = grad + r * vocab;
  const std::int64_t t = targets[r];
  // nll_loss's gradient is -w at the target (0 on an ignored row), log_softmax's backward adds
  // exp(log-probability) times minus that row's sum, +w.
  const float w = t == ignore_index ? 0.0f : (t < 0 || t >= vocab ? NAN : *grad_scale);
  const float m = row_max[r], logsum = row_logsum[r];
  auto grad_of = [&](std::int64_t i, float v) { return (i == t ? -w : 0.0f) + expf(v - m - logsum) * w; };
  if constexpr (kPacked) {  // (g lies as far from a 16-byte boundary as x does)
    constexpr int kN = Pack<T>::kN;
    const std::int64_t h = head_of(x, vocab), packs = (vocab - h) / kN, tail = h + packs * kN;
    auto* out = reinterpret_cast<Pack<T>*>(g + h);
    const auto* in = reinterpret_cast<const Pack<T>*>(x + h);
    for (std::int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const Pack<T> v = in[i];
      Pack<T> o;
#pragma unroll
      for (int j = 0; j < kN; ++j) o.v[j] = from_f32<T>(grad_of(h + i * kN + j, to_f32(v.v[j])));
      out[i] = o;
    }
    for (std::int64_t e = threadIdx.x; e < h + (vocab - tail); e += blockDim.x) {
      const std::int64_t i = e < h ? e : tail + (e - h);
      g[i] = from_f32<T>(grad_of(i, to_f32(x[i])));
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) g[i] = from_f32<T>(grad_of(i, to_f32(x[i])));
  }
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw accel::RuntimeError(std::string("cross entropy kernel (") + what + "): " + cudaGetErrorString(e));
}

// A grid of `rows` blocks (at most 2^31 - 1, CUDA's limit on x).
unsigned grid_of(std::int64_t rows) {
  if (rows > 2147483647LL) throw accel::InvalidArgumentError("cross entropy kernels: more than 2^31 - 1 rows");
  return static_cast<unsigned>(rows);
}

// Whether the rows can be read in packs: the logits (and the gradient, which must then lie as far
// from a 16-byte boundary as the logits, row by row) aligned to their element.
template <typename T>
bool packed(const void* logits, const void* grad = nullptr) {
  const auto x = reinterpret_cast<std::uintptr_t>(logits);
  if (x % sizeof(T) != 0) return false;
  if (grad == nullptr) return true;
  return reinterpret_cast<std::uintptr_t>(grad) % 16 == x % 16;
}

// Calls fn with a typed null pointer of the logits' element type.
template <typename Fn>
void dispatch(InDtype dtype, Fn&& fn) {
  switch (dtype) {
    case InDtype::Float32: fn(static_cast<float*>(nullptr)); return;
    case InDtype::Float16: fn(static_cast<c10::Half*>(nullptr)); return;
    case InDtype::BFloat16: fn(static_cast<c10::BFloat16*>(nullptr)); return;
  }
  throw accel::InvalidArgumentError("cross entropy kernels: logits other than fp32, fp16 and bf16");
}

void check_shape(std::int64_t rows, std::int64_t vocab) {
  if (rows < 0 || vocab < 1)
    throw accel::InvalidArgumentError("cross entropy kernels: expected rows >= 0 and vocab >= 1, got " +
                                      std::to_string(rows) + " and " + std::to_string(vocab));
}

}  // namespace

bool available() { return true; }

void cross_entropy_forward(const void* logits, InDtype dtype, std::int64_t rows, std::int64_t vocab,
                           const std::int64_t* targets, std::int64_t ignore_index, float* row_max, float* row_logsum,
                           float* loss, void* stream) {
  check_shape(rows, vocab);
  if (rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(logits);
    if (packed<T>(logits))
      forward_kernel<T, true>
          <<<grid_of(rows), kThreads, 0, s>>>(x, vocab, targets, ignore_index, row_max, row_logsum, loss);
    else
      forward_kernel<T, false>
          <<<grid_of(rows), kThreads, 0, s>>>(x, vocab, targets, ignore_index, row_max, row_logsum, loss);
  });
  check_launch("forward");
}

void cross_entropy_backward(const void* logits, InDtype dtype, std::int64_t rows, std::int64_t vocab,
                            const std::int64_t* targets, std::int64_t ignore_index, const float* row_max,
                            const float* row_logsum, const float* grad_scale, void* grad, void* stream) {
  check_shape(rows, vocab);
  if (rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(logits);
    T* g = static_cast<T*>(grad);
    if (packed<T>(logits, grad))
      backward_kernel<T, true>
          <<<grid_of(rows), kThreads, 0, s>>>(x, vocab, targets, ignore_index, row_max, row_logsum, grad_scale, g);
    else
      backward_kernel<T, false>
          <<<grid_of(rows), kThreads, 0, s>>>(x, vocab, targets, ignore_index, row_max, row_logsum, grad_scale, g);
  });
  check_launch("backward");
}

}  // namespace accel::kernels::loss
