// accel::comm::Communicator — the one interface for collectives over a group of ranks.
//
// CPU tensors go over shared memory between the ranks of one node (over MPI when the group spans
// nodes, hierarchically; plain MPI with ACCEL_COMM_SHM=0), CUDA tensors over NCCL (bootstrapped over MPI on first use),
// or, where ranks of the group share a GPU or the build has no NCCL, staged through pinned host memory over the
// CPU transport (ACCEL_CUDA_COMM, cuda_comm.h); the backend is chosen per call from the tensor's device. Every
// collective exists as `x_async` returning a Work and as a blocking `x` (= x_async(...)->wait()). Collectives must be
// issued in the same order on every rank of the group. Tensors must be contiguous, and for out-of-place calls on one
// device with one dtype. Errors: InvalidArgument (this rank's arguments), MismatchError (ranks disagree on sizes,
// dtype, op or root; raised on every rank; on CUDA it also aborts the NCCL communicator), TimeoutError (then the
// communicator is broken and the process aborts the job at exit rather than hang), CommError (anything else).
//
// Not thread-safe: one thread issues collectives on a communicator (Work::wait may be called from any).
#pragma once

#include "counters.h"
#include "topology.h"
#include "types.h"
#include "work.h"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace accel::comm {

class Backend;
class MpiBackend;

class Communicator {
 public:
  // All ranks of the job: the same object for every caller while one holds it. Initializes MPI on
  // first call (also works without mpirun: a world of 1).
  static std::shared_ptr<Communicator> world();
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The job's topology (global ranks), whatever group this communicator spans.
  const Topology& topology() const;

  // --- all_reduce: in place, or input -> output ---------------------------------------------
  WorkPtr all_reduce_async(const at::Tensor& tensor, const AllReduceOptions& opts = {});
  WorkPtr all_reduce_async(const at::Tensor& input, const at::Tensor& output, const AllReduceOptions& opts = {});
  void all_reduce(const at::Tensor& tensor, const AllReduceOptions& opts = {});
  void all_reduce(const at::Tensor& input, const at::Tensor& output, const AllReduceOptions& opts = {});

  // --- reduce_scatter: input of size()*k elements -> this rank's k elements (rank r gets the
  // reduction of elements [r*k, (r+1)*k)). output may be input's own slice (in place).
  WorkPtr reduce_scatter_async(const at::Tensor& input, const at::Tensor& output,
                               const ReduceScatterOptions& opts = {});
  void reduce_scatter(const at::Tensor& input, const at::Tensor& output, const ReduceScatterOptions& opts = {});

  // --- all_gather: k elements -> one flat output of size()*k, rank r's at [r*k, (r+1)*k).
  // input may be output's own slice (in place).
  WorkPtr all_gather_async(const at::Tensor& input, const at::Tensor& output, const AllGatherOptions& opts = {});
  void all_gather(const at::Tensor& input, const at::Tensor& output, const AllGatherOptions& opts = {});

  // --- broadcast: root's tensor into everyone's, in place.
  WorkPtr broadcast_async(const at::Tensor& tensor, const BroadcastOptions& opts = {});
  void broadcast(const at::Tensor& tensor, const BroadcastOptions& opts = {});

  WorkPtr barrier_async(const BarrierOptions& opts = {});
  void barrier(const BarrierOptions& opts = {});

  // --- groups ----------------------------------------------------------------------------------
  // Collective over this group: ranks passing the same color form a new communicator, ordered by key
  // (ties by rank). color < 0: this rank joins none and gets nullptr.
  std::shared_ptr<Communicator> split(int color, int key);
  // The ranks of this rank's node, and the ranks with this rank's local rank on every node (the
  // HYBRID_SHARD groups). World communicator only; created on first use (collective), then cached.
  std::shared_ptr<Communicator> node_local();
  std::shared_ptr<Communicator> cross_node();
  // The world cut into blocks of n consecutive ranks (n divides the world size): this rank's block,
  // and the ranks at this rank's place in every block (a 2-D mesh, replicate x shard, as FSDP's HSDP
  // and DeepSpeed's MiCS lay it out). World communicator only; created on first use (collective, every
  // rank passing the same n), then cached per n.
  std::shared_ptr<Communicator> block(int n);
  std::shared_ptr<Communicator> across_blocks(int n);

  // --- memory every rank of the group maps ------------------------------------------------------
  // Collective over this group: a zero-filled CPU tensor of `numel` elements whose memory every rank of
  // the group maps (one POSIX shared-memory object: a rank's write is the others' read), or an undefined
  // tensor on every rank when the group does not share one node's memory (one rank, ranks on several
  // nodes, real or simulated, ACCEL_COMM_SHM=0) or the memory cannot be had (/dev/shm full: the pages are
  // reserved up front, so a full /dev/shm gives undefined here instead of SIGBUS later). The memory goes
  // back when the last rank frees its tensor. Nothing orders one rank's writes against another's reads:
  // the caller does (barrier()). `wanted` false on any rank: undefined on every rank, and no warning
  // (every rank calls, each saying whether it wants the memory: a per-rank setting cannot split the group).
  // A reduce_scatter whose input lies in such memory is read in place by the peers of an "shm" group
  // (no copy through the transport's buffers), and returns only once they are done reading it.
  at::Tensor node_shared_empty(std::int64_t numel, c10::ScalarType dtype, bool wanted = true);

  // --- counting ----------------------------------------------------------------------------------
  Counters counters() const;
  void reset_counters();

  // True after a timeout (or abandon()): every later collective raises CommError.
  bool broken() const { return broken_->load(); }
  // This rank cannot follow its peers any more: it left a sequence of collectives they are inside (a
  // failed optimizer step). Logs `why` (with the rank), breaks the communicator (later calls raise) and
  // makes process exit abort the whole job at once (MPI_Abort) instead of waiting for the peers until
  // their collectives time out: the job ends promptly, as when a rank dies.
  void abandon(const std::string& why);
  // Name of the backend the tensor's device selects ("shm", "shm+mpi", "mpi", "nccl", "host+shm", ...).
  // For a CUDA tensor the first call is collective (it chooses the CUDA transport).
  const char* backend_name(const at::Tensor& t);

 private:
  Communicator(std::unique_ptr<MpiBackend> mpi, std::shared_ptr<const Topology> topo,
               std::shared_ptr<std::atomic<bool>> broken);
  // blocking: the caller waits right away (the synchronous forms).
  WorkPtr submit(Collective kind, const at::Tensor& input, const at::Tensor& output, ReduceOp op, int root,
                 Duration timeout, bool blocking = false);
  Backend& backend_for(const at::Tensor& t);
  // Collective: NCCL or host staging for this group's CUDA tensors on cuda:device (cuda_comm.h).
  std::unique_ptr<Backend> make_cuda_backend(const at::Tensor& t);

  std::unique_ptr<MpiBackend> mpi_;
  std::unique_ptr<Backend> cpu_;   // shared memory (or hierarchical) for CPU tensors; null: MPI
  std::unique_ptr<Backend> cuda_;  // NCCL, or staged through host memory over cpu_ (or mpi_)
  int cuda_device_ = -1;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<const Topology> topo_;
  std::shared_ptr<std::atomic<bool>> broken_;  // shared by the world and every group split from it
  mutable std::mutex counters_mu_;
  Counters counters_;
  std::shared_ptr<std::atomic<std::int64_t>> wait_ns_ = std::make_shared<std::atomic<std::int64_t>>(0);
  std::shared_ptr<Communicator> node_local_, cross_node_;
  std::map<int, std::pair<std::shared_ptr<Communicator>, std::shared_ptr<Communicator>>> blocks_;
  void make_blocks(int n);
};

}  // namespace accel::comm
