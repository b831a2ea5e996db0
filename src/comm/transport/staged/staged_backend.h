// accel::comm — collectives on device tensors staged through pinned host memory, for groups NCCL
// cannot serve: ranks that share one GPU (NCCL refuses two ranks of a communicator on one device), or
// a build without NCCL. The bytes move as the CPU path moves them (shared memory on one node, MPI
// across nodes), so results equal the CPU path's on the same inputs.
//
// Per collective, like the NCCL backend's ordering:
//   caller's current stream --(event)--> copy stream: device -> pinned host copy --(event "staged")
//   host transport: the collective on the pinned copies, started once "staged" has passed, in issue
//                   order with every other collective of the group (Request::ready)
//   on completion:  pinned host -> device copy on a second copy stream, after what the caller's stream
//                   had queued at the call (it may still write the output) --(event "done")
// The caller's stream does not wait: compute queued after the call overlaps the copies and the
// host collective. Work::wait() returns once "done" has passed (the host thread waits on it), so what
// the caller queues afterwards sees the result. Device tensors are recorded on the copy streams, so
// the caching allocator keeps their blocks until the copies end. The cross-rank argument check is the
// host transport's own (MismatchError on every rank). Written against c10's device-generic streams and
// events: it compiles, and is never constructed, in a build without CUDA.
#pragma once

#include "comm/transport/backend.h"

#include <c10/core/Device.h>

#include <memory>

namespace accel::comm {

// `host`: the group's CPU transport, which must outlive the returned backend. Not collective.
std::unique_ptr<Backend> make_staged_backend(Backend& host, c10::Device device);

}  // namespace accel::comm
