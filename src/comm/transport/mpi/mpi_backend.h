// accel::comm::MpiBackend — collectives on CPU tensors over MPI, and the process's MPI runtime.
//
// All MPI calls after MPI_Init run on one progress thread, so non-blocking collectives keep moving
// while the caller computes. Each group holds three duplicated MPI communicators: data (the
// collectives, started in issue order), check (a small all-reduce per collective comparing sizes,
// dtype, op and root across ranks, so a mismatch raises on every rank instead of corrupting memory;
// off with ACCEL_COMM_CHECK=0) and control (blocking setup calls: split, bootstraps).
// bfloat16/float16 reductions travel as fp32 and are rounded once at the end.
#pragma once

#include "comm/topology.h"
#include "comm/transport/backend.h"

#include <cstddef>
#include <memory>
#include <string>

namespace accel::comm {

class MpiBackend final : public Backend {
 public:
  // The world group. MPI_Init_thread on first call; MPI_Finalize at process exit (MPI_Abort instead
  // if a collective timed out, so peers do not hang).
  static std::unique_ptr<MpiBackend> world();
  ~MpiBackend() override;

  const char* name() const override { return "mpi"; }
  int rank() const override;
  int size() const override;
  // This process's rank in MPI_COMM_WORLD (MPI is initialized: a group exists).
  static int world_rank();
  void enqueue(Request request) override;

  // Blocking, collective over this group (see Communicator::split).
  std::unique_ptr<MpiBackend> split(int color, int key);
  // Blocking broadcast of raw bytes from root on the control channel (bootstraps NCCL).
  void broadcast_bytes(void* data, std::size_t n, int root);
  // Blocking all-gather of n raw bytes per rank on the control channel (transport setup).
  void allgather_bytes(const void* mine, std::size_t n, void* all);
  // Blocking: the topology of the world group as MPI sees it (shared-memory nodes).
  Topology read_topology();

  // Marks the job as failed: process exit will MPI_Abort instead of MPI_Finalize.
  static void mark_broken();
  static bool is_broken();

 private:
  struct Impl;
  explicit MpiBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "Open MPI v4.1.4, ..." (MPI_Get_library_version, first line), without initializing MPI.
std::string mpi_library_version();

}  // namespace accel::comm
