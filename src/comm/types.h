// accel::comm — value types shared by every backend: reduce ops, collective kinds, option structs,
// errors. No MPI, NCCL or CUDA here; only ATen's dtype enum.
#pragma once

#include "base/error.h"

#include <c10/core/ScalarType.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace accel::comm {

using Duration = std::chrono::milliseconds;

// Timeout used when an options struct leaves it at zero: ACCEL_COMM_TIMEOUT_S, else 300 s
// (see env.h for the table of ACCEL_* variables).
Duration default_timeout();

enum class ReduceOp { Sum, Avg, Max, Min };
enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier };
constexpr int kNumCollectives = 5;

const char* to_string(ReduceOp op);
const char* to_string(Collective c);

// One options struct per collective. timeout == 0 means default_timeout(). The synchronous calls
// wait up to the timeout; the asynchronous ones carry it into Work::wait() when no explicit one is
// given there.
struct AllReduceOptions {
  ReduceOp op = ReduceOp::Sum;
  Duration timeout{0};
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  Duration timeout{0};
};
struct AllGatherOptions {
  Duration timeout{0};
};
struct BroadcastOptions {
  int root = 0;
  Duration timeout{0};
};
struct BarrierOptions {
  Duration timeout{0};
};

// Base of every error the communicator raises. Faults a caller may handle are distinct types.
class CommError : public accel::RuntimeError {
 public:
  using accel::RuntimeError::RuntimeError;
};
// Bad arguments on this rank (non-contiguous tensor, wrong sizes, unsupported dtype/op).
class InvalidArgument : public CommError {
 public:
  using CommError::CommError;
};
// Ranks called the same collective with different sizes, dtypes, ops or roots. Raised on every rank.
class MismatchError : public CommError {
 public:
  using CommError::CommError;
};
// A collective did not complete within its timeout (a peer is slow, stuck or dead). After it the
// communicator is broken: later calls raise, and process exit aborts the job instead of hanging.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace accel::comm
