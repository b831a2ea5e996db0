// accel::comm — the element-wise reduction the shared-memory transport runs on each rank's slice:
// plain loops the compiler vectorizes (cloned for AVX2 where the CPU has it), on the calling thread
// only (no intra-op thread pool: the transport's thread must not compete with the caller's compute).
#pragma once

#include "comm/types.h"

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace accel::comm {

// dst[i] = op(srcs[0][i], ..., srcs[n-1][i]), divided by `divisor` when it is > 0 (avg). dst may be
// one of the sources (same address). bfloat16/float16 accumulate in fp32 and are rounded once, as
// the MPI transport does. Integer sums wrap as MPI's do. dst2, when not null, gets the same values
// (all_reduce writes its reduced slice to the shared buffer and its own output in one pass).
// out_dtype: the destinations' dtype when not `dtype` (Undefined: the same): fp32 from bfloat16/float16
// sources, the fp32 accumulator kept unrounded (the hierarchical transport's node sums).
void reduce_into(void* dst, void* dst2, const void* const* srcs, int nsrc, std::int64_t count, c10::ScalarType dtype,
                 ReduceOp op, double divisor, c10::ScalarType out_dtype = c10::ScalarType::Undefined);

}  // namespace accel::comm
