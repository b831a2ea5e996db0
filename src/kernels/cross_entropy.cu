// The fused cross entropy (cross_entropy.h): a block a row of logits, each thread reading whole 16-byte
// packs where the rows are aligned for it (every row, when the first is 16-byte aligned and a row's
// bytes are a multiple of 16: vocabularies of 32000, 50304, 128256; a scalar loop for every row
// otherwise, e.g. 50257). Forward reads its row twice (the max, then the sum of exponentials:
// log_softmax's two passes and its arithmetic; a one-pass rescaled sum would read it once, with other
// roundings); backward reads it once and writes the gradient once. The sums go through a fixed tree (warp shuffles,
// then the warps in order), so a row's numbers do not change from run to run. Each log-probability is
// computed as log_softmax's CUDA kernel computes it, x - max - logsum in fp32.
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

// f(i, fp32(x[i])) for this thread's elements of the row x[0, n); kPacked: n a multiple of the pack and
// x 16-byte aligned.
template <typename T, bool kPacked, typename F>
__device__ __forceinline__ void for_each(const T* x, std::int64_t n, F&& f) {
  if constexpr (kPacked) {
    constexpr int kN = Pack<T>::kN;
    const auto* p = reinterpret_cast<const Pack<T>*>(x);
    for (std::int64_t i = threadIdx.x; i < n / kN; i += blockDim.x) {
      const Pack<T> v = p[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) f(i * kN + j, to_f32(v.v[j]));
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
  if constexpr (kPacked) {
    constexpr int kN = Pack<T>::kN;
    auto* out = reinterpret_cast<Pack<T>*>(g);
    const auto* in = reinterpret_cast<const Pack<T>*>(x);
    for (std::int64_t i = threadIdx.x; i < vocab / kN; i += blockDim.x) {
      const Pack<T> v = in[i];
      Pack<T> o;
#pragma unroll
      for (int j = 0; j < kN; ++j) o.v[j] = from_f32<T>(grad_of(i * kN + j, to_f32(v.v[j])));
      out[i] = o;
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

template <typename T>
bool packed(const void* p, std::int64_t vocab) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && (vocab * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
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
    if (packed<T>(logits, vocab))
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
    if (packed<T>(logits, vocab) && packed<T>(grad, vocab))
      backward_kernel<T, true>
          <<<grid_of(rows), kThreads, 0, s>>>(x, vocab, targets, ignore_index, row_max, row_logsum, grad_scale, g);
    else
      backward_kernel<T, false>
          <<<grid_of(rows), kThreads, 0, s>>>(x, vocab, targets, ignore_index, row_max, row_logsum, grad_scale, g);
  });
  check_launch("backward");
}

}  // namespace accel::kernels::loss
