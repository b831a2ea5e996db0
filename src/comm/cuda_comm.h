// accel::comm — which transport carries collectives on CUDA tensors (ACCEL_CUDA_COMM):
//   nccl  NCCL, one GPU per rank (NCCL refuses two ranks of a communicator on one device);
//   host  staged through pinned host memory over the group's CPU transport (staged_backend.h): works
//         wherever the CPU path works, ranks sharing a GPU included, at host-copy speed;
//   auto  (default) nccl, unless the build has no NCCL or ranks of the group share a GPU: then host.
// The Communicator decides once per group, on its first CUDA collective, from every rank's device
// (so all ranks decide alike); the launcher and the Accelerator predict the same from the topology.
#pragma once

#include <string>

namespace accel::comm {

class Communicator;
struct Topology;

enum class CudaComm { Auto, Nccl, Host };

const char* to_string(CudaComm c);
// ACCEL_CUDA_COMM; throws InvalidArgument naming the variable and the allowed values on a bad one.
CudaComm cuda_comm_requested();

struct CudaCommChoice {
  CudaComm comm;    // Nccl or Host
  std::string why;  // one clause: "NCCL, one GPU per rank", "2 ranks share a GPU", ...
};
// What `requested` resolves to for a group where `sharing` ranks use a GPU another rank of the group
// uses too (0: one GPU each), given whether this build has NCCL. Throws InvalidArgument where nccl is
// asked for and cannot serve the group.
CudaCommChoice choose_cuda_comm(CudaComm requested, bool nccl_built, int sharing);

// How many ranks use a GPU that another rank uses too, from every rank's GPU UUID (16 bytes each,
// `uuids` holding rank r's at [16 r, 16 r + 16); all zero where a rank does not know its own). A rank
// with an unknown UUID counts as sharing with no one. UUIDs, not device indices: a rank given one GPU
// by CUDA_VISIBLE_DEVICES sees it as device 0, as every other rank sees its own.
int ranks_sharing_a_gpu(const std::string& uuids);
// The same over `group` (collective; every rank gets the same count): each rank gives its own GPU's
// UUID (comm/transport/nccl's cuda_device_uuid, empty where unknown).
int ranks_sharing_a_gpu(Communicator& group, const std::string& my_uuid);
// Where a rank does not know its GPU's UUID (my_uuid empty: the device's properties could not be read):
// the ranks of its node (every rank of the job under a simulated topology, which says nothing about
// machines) when they outnumber the `gpus` it sees, else 0. Both the Accelerator's check (this rank's)
// and the Communicator's choice (the most over the group) count these as sharing too.
int ranks_sharing_by_count(const Topology& topo, int gpus, const std::string& my_uuid);

// One line for `accel env` and `accel launch`: what `ranks` ranks on a node with `gpus` GPUs get under
// ACCEL_CUDA_COMM in this build ("nccl (one GPU per rank)", "host (4 ranks share a GPU, ...)", or
// "refused: ..."). Never throws.
std::string describe_cuda_comm(int ranks, int gpus);

}  // namespace accel::comm
