#include "kernels/pinned_host.h"

#include <cuda_runtime_api.h>

namespace accel::kernels::pinned {

bool register_range(void* ptr, std::size_t bytes, std::string* why) {
  const cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();  // (not sticky: clear it, so the next CUDA call does not report it)
  if (why) *why = cudaGetErrorString(e);
  return false;
}

void unregister_range(void* ptr) {
  if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace accel::kernels::pinned
