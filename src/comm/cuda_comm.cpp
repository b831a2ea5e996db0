#include "comm/cuda_comm.h"

#include "base/env.h"
#include "comm/communicator.h"
#include "comm/topology.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "comm/types.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <cstring>

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

int ranks_sharing_a_gpu(const std::string& uuids) {
  constexpr std::size_t kLen = 16;
  if (uuids.size() % kLen != 0) throw InvalidArgument("ranks_sharing_a_gpu: 16 bytes a rank");
  const std::size_t ranks = uuids.size() / kLen;
  const std::string unknown(kLen, '\0');
  int sharing = 0;
  for (std::size_t q = 0; q < ranks; ++q) {
    const std::string mine = uuids.substr(q * kLen, kLen);
    if (mine == unknown) continue;
    for (std::size_t o = 0; o < ranks; ++o)
      if (o != q && uuids.compare(o * kLen, kLen, mine) == 0) {
        ++sharing;
        break;
      }
  }
  return sharing;
}

int ranks_sharing_a_gpu(Communicator& group, const std::string& my_uuid) {
  std::string mine = my_uuid.substr(0, 16);
  mine.resize(16, '\0');
  at::Tensor in = at::empty({16}, at::kByte),
             out = at::empty({16 * static_cast<std::int64_t>(group.size())}, at::kByte);
  std::memcpy(in.mutable_data_ptr(), mine.data(), mine.size());
  group.all_gather(in, out);
  return ranks_sharing_a_gpu(std::string(static_cast<const char*>(out.const_data_ptr()), out.numel()));
}

int ranks_sharing_by_count(const Topology& topo, int gpus, const std::string& my_uuid) {
  const int ranks_here = topo.ranks_on_this_machine();
  return my_uuid.empty() && ranks_here > gpus ? ranks_here : 0;
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
