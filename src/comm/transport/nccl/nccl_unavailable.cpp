// accel::comm NCCL backend, stand-in for builds without CUDA/NCCL (ACCEL_WITH_NCCL undefined):
// reports that NCCL is absent and raises when a CUDA tensor would need it. No CUDA includes.
#include "comm/transport/nccl/nccl_backend.h"

#include "comm/types.h"

namespace accel::comm {

bool nccl_compiled() { return false; }

std::string nccl_version() { return "not compiled (CUDA toolkit or NCCL not found at configure time)"; }

int cuda_device_count() { return 0; }

std::string cuda_device_uuid(int /*device*/) { return {}; }

std::unique_ptr<Backend> make_nccl_backend(MpiBackend& /*bootstrap*/, int /*device_index*/) {
  throw CommError(
      "accel was built without NCCL: CUDA tensors cannot be communicated; rebuild on a machine with the CUDA "
      "toolkit and NCCL");
}

}  // namespace accel::comm
