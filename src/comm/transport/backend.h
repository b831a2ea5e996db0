// accel::comm::Backend — what one transport (MPI for CPU tensors, NCCL for CUDA tensors) provides
// for one group of ranks. The Communicator validates arguments, counts traffic and creates the Work;
// a backend only moves bytes. Internal to src/comm.
#pragma once

#include "comm/types.h"
#include "comm/work.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace accel::comm {

// One collective, already validated locally (contiguous, same device and dtype, sizes consistent
// with the world size, op allowed for the dtype).
//   AllReduce:     input -> output (may be the same tensor), numel equal.
//   ReduceScatter: input numel = world * output numel; output may alias input's own rank slice. On
//                  the shm transport only, a bf16/fp16 input may have an fp32 output: the sums kept
//                  unrounded (the hierarchical transport's node sums; every rank alike).
//   AllGather:     output numel = world * input numel; input may alias output's own rank slice.
//   Broadcast:     input == output, root's data lands everywhere.
//   Barrier:       no tensors.
struct Request {
  Collective kind = Collective::Barrier;
  at::Tensor input, output;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  WorkPtr work;  // finish() it exactly once, or throw from enqueue() before anything started

  // --- used by transports built from other transports (hierarchical collectives) -----------------
  bool caller_waits = false;  // the caller waits right away (blocking call): no need to wake a thread
  bool skip_check = false;    // the cross-rank check was done elsewhere (a check_only request)
  bool check_only = false;    // only the cross-rank check of these arguments; no data moves
  // Not started before every one of these has finished; fails with the first one's error, if any
  // failed (which happens alike on every rank: they are checks or steps of the same collective).
  std::vector<WorkPtr> after;
  // Not started before this returns true either (polled by the transport's thread; must be cheap
  // and take no lock the transport holds: a device event's query, for collectives staged from a GPU).
  std::function<bool()> ready;
  // Runs after the data moved, before work is finished (copy a staging buffer out, divide for avg).
  std::function<void()> then;
};

// True when the two tensors' bytes overlap (both non-empty).
inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  auto a0 = static_cast<const char*>(a.data_ptr()), b0 = static_cast<const char*>(b.data_ptr());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// The first error among `after`, or null; `ready` false while one is still running.
inline std::exception_ptr dependency_error(const Request& r, bool& ready) {
  ready = true;
  if (r.ready && !r.ready()) {
    ready = false;
    return nullptr;
  }
  for (const auto& w : r.after) {
    if (!w->finished()) {
      ready = false;
      return nullptr;
    }
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts the collective; completion is reported through request.work. Non-blocking unless the
  // backend says otherwise. Collectives must be enqueued in the same order on every rank.
  virtual void enqueue(Request request) = 0;
};

}  // namespace accel::comm
