// fp8_cast.h in a build without the CUDA toolkit: no kernels; mixed_precision/fp8.cpp then takes the
// composite ATen path everywhere.
#include "kernels/fp8_cast.h"

#include "base/error.h"

namespace accel::kernels::fp8 {

bool available() { return false; }

void quantize_tensorwise(const void*, InDtype, std::int64_t, OutFormat, int, std::uint32_t*, std::uint8_t*, float*,
                         float*, void*) {
  throw accel::RuntimeError("fp8 cast kernels: this build has none (no CUDA toolkit when it was configured)");
}

void quantize_tensorwise_2d(const void*, InDtype, std::int64_t, std::int64_t, OutFormat, int, std::uint32_t*,
                            std::uint8_t*, std::uint8_t*, float*, float*, void*, bool, float*) {
  throw accel::RuntimeError("fp8 cast kernels: this build has none (no CUDA toolkit when it was configured)");
}

void sum_column_partials(const float*, std::int64_t, std::int64_t, float*, void*) {
  throw accel::RuntimeError("fp8 cast kernels: this build has none (no CUDA toolkit when it was configured)");
}

void transpose_bytes(const std::uint8_t*, std::int64_t, std::int64_t, std::uint8_t*, void*) {
  throw accel::RuntimeError("fp8 cast kernels: this build has none (no CUDA toolkit when it was configured)");
}

void quantize_axiswise(const void*, InDtype, std::int64_t, std::int64_t, int, OutFormat, int, bool, std::uint32_t*,
                       std::uint8_t*, bool, float*, float*, void*) {
  throw accel::RuntimeError("fp8 cast kernels: this build has none (no CUDA toolkit when it was configured)");
}

}  // namespace accel::kernels::fp8
