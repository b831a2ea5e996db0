// accel::comm NCCL backend — collectives on CUDA tensors. Compiled only when CMake finds CUDA and
// NCCL (ACCEL_WITH_NCCL); otherwise nccl_unavailable.cpp provides the same functions, raising.
//
// Contract: the NCCL communicator is created on first use, collectively, on the device of that
// first tensor (rank 0's ncclUniqueId is broadcast over MPI). Each collective runs on the backend's
// own stream after the work already queued on the caller's current stream; the caller's stream does
// not wait for it, so later compute overlaps the collective. Work::wait() blocks the host until the
// collective has finished (or the timeout passes: then the NCCL communicator is aborted and the job
// fails). Arguments are checked across ranks on the device (MismatchError; ACCEL_COMM_CHECK=0: off).
// 16-bit sums use NCCL's own (fp32-accumulating) reductions; fp8 moves as bytes.
#pragma once

#include "comm/transport/backend.h"

#include <memory>
#include <string>

namespace accel::comm {

class MpiBackend;

// True when this build has the NCCL backend.
bool nccl_compiled();
// "2.27.7" (ncclGetVersion), or a sentence saying why there is none.
std::string nccl_version();
// Number of CUDA devices visible (0 without CUDA or without a driver). Never throws.
int cuda_device_count();
// The 16 bytes that name the physical GPU behind cuda:`device` (the same GPU seen by two processes with
// different CUDA_VISIBLE_DEVICES has one uuid), or empty where unknown. Never throws.
std::string cuda_device_uuid(int device);
// Collective over the group `bootstrap` spans. Throws CommError when NCCL is not compiled in.
std::unique_ptr<Backend> make_nccl_backend(MpiBackend& bootstrap, int device_index);

}  // namespace accel::comm
