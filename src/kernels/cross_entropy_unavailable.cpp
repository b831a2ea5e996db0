// cross_entropy.h in a build without the CUDA toolkit: no kernels; mixed_precision/cross_entropy.cpp
// then takes the composite ATen path everywhere.
#include "kernels/cross_entropy.h"

#include "base/error.h"

namespace accel::kernels::loss {

bool available() { return false; }

void cross_entropy_forward(const void*, InDtype, std::int64_t, std::int64_t, const std::int64_t*, std::int64_t, float*,
                           float*, float*, void*) {
  throw accel::RuntimeError("cross entropy kernels: this build has none (no CUDA toolkit when it was configured)");
}

void cross_entropy_backward(const void*, InDtype, std::int64_t, std::int64_t, const std::int64_t*, std::int64_t,
                            const float*, const float*, const float*, void*, void*) {
  throw accel::RuntimeError("cross entropy kernels: this build has none (no CUDA toolkit when it was configured)");
}

}  // namespace accel::kernels::loss
