#include "kernels/pinned_host.h"

#include <cuda_runtime_api.h>

namespace accel::kernels::pinned {

bool register_range(void* ptr, std::size_t bytes, const char** why) {
  // (Portable: page-locked for every context, whichever device is current on this thread.)
  const cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();  // (not sticky: clear it, so the next CUDA call does not report it)
  if (why) *why = cudaGetErrorString(e);
  return false;
}

void unregister_range(void* ptr) {
  if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace accel::kernels::pinned
