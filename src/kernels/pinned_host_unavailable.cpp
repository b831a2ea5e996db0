// pinned_host.h in a build that did not find the CUDA toolkit: nothing to register with (and no device to copy to).
#include "kernels/pinned_host.h"

namespace accel::kernels::pinned {

bool register_range(void*, std::size_t, const char** why) {
  if (why) *why = "this build has no CUDA runtime of its own";
  return false;
}

void unregister_range(void*) {}

}  // namespace accel::kernels::pinned
