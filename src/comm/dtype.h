// accel::comm — which dtypes travel how. Pure classification; backends map these to wire types.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>

namespace accel::comm {

enum class DtypeClass {
  Float,      // float64, float32: reduced natively
  HalfFloat,  // bfloat16, float16: reduced with fp32 accumulation
  Integer,    // int32, int64, uint8: reduced natively (no Avg)
  Fp8,        // float8_e4m3fn, float8_e5m2: moved as bytes (all_gather, broadcast only)
  Unsupported,
};

DtypeClass classify(c10::ScalarType t);
// The PyTorch-style name: "float32", "bfloat16", "float8_e4m3fn", ... (c10's own names otherwise).
const char* dtype_name(c10::ScalarType t);
// "float32, bfloat16, ..." — the list printed in errors.
const char* supported_dtypes();

}  // namespace accel::comm
