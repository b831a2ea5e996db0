#include "comm/cuda_comm.h"

#include "base/env.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "comm/types.h"

#include <fmt/format.h>

namespace accel::comm {

const char* to_string(CudaComm c) {
  switch (c) {
    case CudaComm::Auto: return "auto";
    case CudaComm::Nccl: return "nccl";
    case CudaComm::Host: return "host";
  }
  return "?";
}

CudaComm cuda_comm_requested() {
  const std::string v = env::get("ACCEL_CUDA_COMM");
  for (CudaComm c : {CudaComm::Auto, CudaComm::Nccl, CudaComm::Host})
    if (v == to_string(c)) return c;
  throw InvalidArgument(fmt::format("ACCEL_CUDA_COMM='{}' is not one of auto, nccl, host", v));
}

CudaCommChoice choose_cuda_comm(CudaComm requested, bool nccl_built, int sharing) {
  if (requested == CudaComm::Host) return {CudaComm::Host, "ACCEL_CUDA_COMM=host"};
  if (requested == CudaComm::Nccl) {
    if (!nccl_built) throw InvalidArgument("ACCEL_CUDA_COMM=nccl, but accel was built without NCCL; use auto or host");
    if (sharing > 0)
      throw InvalidArgument(fmt::format(
          "ACCEL_CUDA_COMM=nccl, but {} ranks of the group share a GPU, which NCCL refuses; use auto or host "
          "(collectives staged through host memory), or give each rank its own GPU",
          sharing));
    return {CudaComm::Nccl, "ACCEL_CUDA_COMM=nccl"};
  }
  if (!nccl_built) return {CudaComm::Host, "this build has no NCCL"};
  if (sharing > 0) return {CudaComm::Host, fmt::format("{} ranks share a GPU, which NCCL refuses", sharing)};
  return {CudaComm::Nccl, "one GPU per rank"};
}

std::string describe_cuda_comm(int ranks, int gpus) {
  try {
    const CudaCommChoice c = choose_cuda_comm(cuda_comm_requested(), nccl_compiled(), ranks > gpus ? ranks : 0);
    if (c.comm == CudaComm::Nccl) return fmt::format("nccl ({})", c.why);
    return fmt::format("host, staged through pinned host memory ({})", c.why);
  } catch (const InvalidArgument& e) {
    return fmt::format("refused: {}", e.what());
  }
}

}  // namespace accel::comm
