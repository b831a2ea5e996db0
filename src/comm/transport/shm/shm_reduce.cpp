// Element-wise reductions over n sources, in L1-sized blocks: the sources of one block are folded
// into an accumulator, then written once (so dst may alias a source).
#include "comm/transport/shm/shm_reduce.h"
#include "base/error.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace accel::comm {
namespace {

constexpr std::int64_t kBlock = 2048;

struct Sum {
  template <class A>
  static A apply(A a, A b) {
    return a + b;
  }
};
struct Max {
  template <class A>
  static A apply(A a, A b) {
    return a < b ? b : a;
  }
};
struct Min {
  template <class A>
  static A apply(A a, A b) {
    return b < a ? b : a;
  }
};

// A: the accumulation type (fp32 for 16-bit floats; unsigned for integer sums, which wrap). O: the
// output's (T, or fp32 for 16-bit floats kept unrounded).
template <class T, class A, class Op, class O = T>
__attribute__((always_inline)) inline void reduce_t(O* dst, O* dst2, const void* const* srcs, int n, std::int64_t count,
                                                    A divisor) {
  A acc[kBlock];
  for (std::int64_t base = 0; base < count; base += kBlock) {
    const std::int64_t m = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    for (std::int64_t i = 0; i < m; ++i) acc[i] = static_cast<A>(s0[i]);
    for (int j = 1; j < n; ++j) {
      const T* s = static_cast<const T*>(srcs[j]) + base;
      for (std::int64_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], static_cast<A>(s[i]));
    }
    if (divisor != A(0))
      for (std::int64_t i = 0; i < m; ++i) acc[i] = acc[i] / divisor;
    O* d = dst + base;
    for (std::int64_t i = 0; i < m; ++i) d[i] = static_cast<O>(acc[i]);
    if (dst2 != nullptr) {
      O* d2 = dst2 + base;
      for (std::int64_t i = 0; i < m; ++i) d2[i] = d[i];
    }
  }
}

template <class T, class A, class O = T>
__attribute__((always_inline)) inline void reduce_op(void* dst, void* dst2, const void* const* srcs, int n,
                                                     std::int64_t count, ReduceOp op, double divisor) {
  O* d = static_cast<O*>(dst);
  O* d2 = static_cast<O*>(dst2);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: reduce_t<T, A, Sum, O>(d, d2, srcs, n, count, static_cast<A>(divisor)); break;
    case ReduceOp::Max: reduce_t<T, A, Max, O>(d, d2, srcs, n, count, A(0)); break;
    case ReduceOp::Min: reduce_t<T, A, Min, O>(d, d2, srcs, n, count, A(0)); break;
  }
}

// Each kernel is cloned per instruction set and picked at load time through an ifunc. Not under
// ThreadSanitizer or AddressSanitizer: the loader runs ifunc resolvers before the sanitizer runtime
// is initialized, and the instrumented resolver crashes the process (scripts/sanitize.sh).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define ACCEL_SHM_CLONES
#else
#define ACCEL_SHM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

#define ACCEL_SHM_KERNEL(NAME, T, A, O)                                                                              \
  ACCEL_SHM_CLONES void NAME(void* dst, void* dst2, const void* const* srcs, int n, std::int64_t count, ReduceOp op, \
                             double divisor) {                                                                       \
    reduce_op<T, A, O>(dst, dst2, srcs, n, count, op, divisor);                                                      \
  }

ACCEL_SHM_KERNEL(reduce_f64, double, double, double)
ACCEL_SHM_KERNEL(reduce_f32, float, float, float)
ACCEL_SHM_KERNEL(reduce_bf16, c10::BFloat16, float, c10::BFloat16)
ACCEL_SHM_KERNEL(reduce_f16, c10::Half, float, c10::Half)
ACCEL_SHM_KERNEL(reduce_bf16_to_f32, c10::BFloat16, float, float)
ACCEL_SHM_KERNEL(reduce_f16_to_f32, c10::Half, float, float)
ACCEL_SHM_KERNEL(reduce_i32, std::int32_t, std::int32_t, std::int32_t)
ACCEL_SHM_KERNEL(reduce_i64, std::int64_t, std::int64_t, std::int64_t)
ACCEL_SHM_KERNEL(reduce_u8, std::uint8_t, std::uint8_t, std::uint8_t)

}  // namespace

void reduce_into(void* dst, void* dst2, const void* const* srcs, int nsrc, std::int64_t count, c10::ScalarType dtype,
                 ReduceOp op, double divisor, c10::ScalarType out_dtype) {
  if (count <= 0) return;
  if (out_dtype != c10::ScalarType::Undefined && out_dtype != dtype) {
    if (out_dtype == c10::kFloat && dtype == c10::kBFloat16)
      return reduce_bf16_to_f32(dst, dst2, srcs, nsrc, count, op, divisor);
    if (out_dtype == c10::kFloat && dtype == c10::kHalf)
      return reduce_f16_to_f32(dst, dst2, srcs, nsrc, count, op, divisor);
    throw accel::InvalidArgumentError("shm reduce: an output dtype other than the input's is fp32 from 16-bit floats");
  }
  switch (dtype) {
    case c10::kDouble: return reduce_f64(dst, dst2, srcs, nsrc, count, op, divisor);
    case c10::kFloat: return reduce_f32(dst, dst2, srcs, nsrc, count, op, divisor);
    case c10::kBFloat16: return reduce_bf16(dst, dst2, srcs, nsrc, count, op, divisor);
    case c10::kHalf: return reduce_f16(dst, dst2, srcs, nsrc, count, op, divisor);
    case c10::kInt: return reduce_i32(dst, dst2, srcs, nsrc, count, op, divisor);
    case c10::kLong: return reduce_i64(dst, dst2, srcs, nsrc, count, op, divisor);
    case c10::kByte: return reduce_u8(dst, dst2, srcs, nsrc, count, op, divisor);
    default: throw accel::InvalidArgumentError("shm reduce: unsupported dtype");
  }
}

}  // namespace accel::comm
