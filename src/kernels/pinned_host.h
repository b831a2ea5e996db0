// accel::kernels::pinned — page-locking host memory for the CUDA devices without PyTorch's pinned
// allocator, which rounds every allocation up to a power of two (a 588 MiB master shard would take
// 1 GiB of page-locked memory). Plain C++: pinned_host_cuda.cpp calls the CUDA runtime
// (cudaHostRegister) in a build that finds the CUDA toolkit (nvcc or not); pinned_host_unavailable.cpp
// answers false without.
// zero::HostCopies::pinned_empty wraps it for tensors.
#pragma once

#include <cstddef>

namespace accel::kernels::pinned {

// Page-locks [ptr, ptr + bytes) for every CUDA context (ptr page-aligned); false, with the reason in
// *why (a static string), where it cannot (no CUDA runtime in this build, no device, the system
// refuses).
bool register_range(void* ptr, std::size_t bytes, const char** why);
// Undoes register_range. The caller has no copy from or to the range in flight.
void unregister_range(void* ptr);

}  // namespace accel::kernels::pinned
