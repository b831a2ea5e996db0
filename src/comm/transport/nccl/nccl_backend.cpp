// accel::comm NCCL backend — collectives on CUDA tensors (builds with ACCEL_WITH_NCCL).
//
// One NcclBackend per Communicator: one ncclComm_t on one device, bootstrapped over the MPI group's
// control channel, and one dedicated (high-priority, pooled) stream on which every collective runs.
//
// Ordering, per collective:
//   caller's current stream --(event "ready")--> comm stream: [signature check] NCCL kernel --(event "done")
// The comm stream first waits for the caller's current stream, so the collective sees everything the
// caller has queued so far. The caller's stream does NOT wait for the collective: compute queued after
// the launch overlaps it. Results are the caller's only after Work::wait() (or is_completed() true),
// which the Work contract already demands; wait() blocks the host until the "done" event has passed,
// so whatever the caller queues afterwards, on any stream, runs after the collective. The caching
// allocator is told that input and output are used on the comm stream (recordStream), so freeing them
// early never hands their blocks to other work before the collective ends.
//
// Cross-rank check (unless ACCEL_COMM_CHECK=0, groups of 2 or more): before the collective, the comm
// stream all-reduces (MAX) the collective's packed signature (signature.h), a few dozen bytes, and copies the result
// to pinned host memory; the Work's poll compares it as soon as it lands. A disagreement raises
// MismatchError on every rank. NCCL cannot cancel a launched collective, and mismatched sizes can leave
// it waiting forever, so the NCCL communicator is then aborted and the job must restart.
//
// Completion: the Work polls the "done" event (cudaEventQuery); while it is not ready the poll also
// checks ncclCommGetAsyncError, so a communicator failure raises instead of hanging until the
// timeout. On timeout the NCCL communicator is aborted (its kernels exit) and the job is marked broken.
#include "comm/transport/nccl/nccl_backend.h"

#include "base/env.h"
#include "comm/signature.h"
#include "comm/transport/mpi/mpi_backend.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#ifndef ACCEL_WITH_NCCL
#error "nccl_backend.cpp is compiled only with ACCEL_WITH_NCCL (use nccl_unavailable.cpp otherwise)"
#endif

namespace accel::comm {

namespace {

std::string where(int rank, int device) { return fmt::format(" (rank {}, cuda:{})", rank, device); }

[[noreturn]] void throw_cuda(const char* call, cudaError_t err, int rank, int device) {
  throw CommError(fmt::format("NCCL backend: {} failed: {}{}", call, cudaGetErrorString(err), where(rank, device)));
}

void check_cuda(const char* call, cudaError_t err, int rank, int device) {
  if (err != cudaSuccess) throw_cuda(call, err, rank, device);
}

std::string nccl_detail(ncclComm_t comm) {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') return fmt::format(" — {}", last);
#else
  (void)comm;
#endif
  return {};
}

void check_nccl(const char* call, ncclResult_t res, ncclComm_t comm, int rank, int device) {
  if (res == ncclSuccess) return;
  throw CommError(fmt::format("NCCL backend: {} failed: {}{}{}", call, ncclGetErrorString(res), nccl_detail(comm),
                              where(rank, device)));
}

ncclDataType_t nccl_dtype(c10::ScalarType t, int rank, int device) {
  switch (t) {
    case c10::ScalarType::Double: return ncclFloat64;
    case c10::ScalarType::Float: return ncclFloat32;
    case c10::ScalarType::Half: return ncclFloat16;
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case c10::ScalarType::BFloat16: return ncclBfloat16;
#endif
    case c10::ScalarType::Int: return ncclInt32;
    case c10::ScalarType::Long: return ncclInt64;
    case c10::ScalarType::Byte: return ncclUint8;
    default: break;
  }
  throw InvalidArgument(fmt::format(
      "NCCL backend: dtype {} cannot be reduced over NCCL (float64, float32, bfloat16, float16, int32, int64, uint8){}",
      c10::toString(t), where(rank, device)));
}

ncclRedOp_t nccl_op(ReduceOp op, int rank, int device) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg:
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclAvg;
#else
      break;
#endif
  }
  throw InvalidArgument(fmt::format("NCCL backend: reduce op {} is not supported by NCCL {}{}", to_string(op),
                                    nccl_version(), where(rank, device)));
}

// Makes `device` current for the lifetime of the object without ever throwing (destructor paths).
class NoThrowDeviceGuard {
 public:
  explicit NoThrowDeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) (void)cudaSetDevice(device);
  }
  ~NoThrowDeviceGuard() {
    // Back to the thread's device only where it has a context already: a thread that never chose one
    // (device 0 by default) would otherwise get a context made on GPU 0 for it.
    if (prev_ >= 0 && prev_ != device_) (void)c10::cuda::MaybeSetDevice(static_cast<c10::DeviceIndex>(prev_));
  }
  NoThrowDeviceGuard(const NoThrowDeviceGuard&) = delete;
  NoThrowDeviceGuard& operator=(const NoThrowDeviceGuard&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

// The NCCL communicator, shared (weakly) with in-flight Works so their poll / timeout callbacks can
// check or abort it without keeping it alive past the backend. Every use of `comm` holds `mu`, so an
// abort from a waiting thread cannot race a launch or the destructor.
struct NcclComm {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  bool aborted = false;
  std::mutex mu;

  NcclComm() = default;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ~NcclComm() {
    std::lock_guard<std::mutex> lk(mu);
    if (comm == nullptr) return;
    NoThrowDeviceGuard g(device);
    ncclResult_t async = ncclSuccess;
    const bool failed =
        ncclCommGetAsyncError(comm, &async) != ncclSuccess || (async != ncclSuccess && async != ncclInProgress);
    // A failed communicator may have kernels that never finish: destroying it would wait on them.
    if (failed)
      (void)ncclCommAbort(comm);
    else
      (void)ncclCommDestroy(comm);
    comm = nullptr;
  }

  // Aborts the communicator (its pending kernels exit). Idempotent, never throws. Caller holds mu.
  void abort_locked() noexcept {
    if (comm == nullptr) return;
    NoThrowDeviceGuard g(device);
    (void)ncclCommAbort(comm);
    comm = nullptr;
    aborted = true;
  }

  // Throws CommError if the communicator was aborted or reports an asynchronous error (then it is
  // aborted, as NCCL requires, and the job is marked broken).
  void check_async_error() {
    std::lock_guard<std::mutex> lk(mu);
    if (aborted || comm == nullptr)
      throw CommError(
          fmt::format("NCCL backend: the NCCL communicator was aborted (an earlier collective timed out or failed){}",
                      where(rank, device)));
    ncclResult_t async = ncclSuccess;
    const ncclResult_t res = ncclCommGetAsyncError(comm, &async);
    if (res != ncclSuccess) {
      const std::string msg = fmt::format("NCCL backend: ncclCommGetAsyncError failed: {}{}{}", ncclGetErrorString(res),
                                          nccl_detail(comm), where(rank, device));
      abort_locked();
      MpiBackend::mark_broken();
      throw CommError(msg);
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string msg = fmt::format(
          "NCCL backend: the NCCL communicator failed asynchronously: {}{}{}; it has been aborted and the job must "
          "restart",
          ncclGetErrorString(async), nccl_detail(comm), where(rank, device));
      abort_locked();
      MpiBackend::mark_broken();
      throw CommError(msg);
    }
  }
};

using EventPtr = std::shared_ptr<CUevent_st>;

EventPtr make_event(int rank, int device) {
  cudaEvent_t ev = nullptr;
  check_cuda("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), rank, device);
  return EventPtr(ev, [](cudaEvent_t e) { (void)cudaEventDestroy(e); });
}

class NcclBackend final : public Backend {
 public:
  NcclBackend(std::shared_ptr<NcclComm> state, c10::cuda::CUDAStream stream, EventPtr ready, at::Tensor barrier_buf,
              bool check)
      : state_(std::move(state)),
        stream_(stream),
        ready_(std::move(ready)),
        barrier_buf_(std::move(barrier_buf)),
        check_(check && state_->size > 1) {}

  // The communicator itself is released by ~NcclComm (ncclCommDestroy, or ncclCommAbort when it was
  // aborted or failed) once no in-flight poll still holds it. Never throws.
  ~NcclBackend() override = default;

  const char* name() const override { return "nccl"; }
  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }

  void enqueue(Request request) override {
    const int rank = state_->rank, device = state_->device;
    if (!request.work) throw CommError(fmt::format("NCCL backend: request without a Work{}", where(rank, device)));
    for (const at::Tensor* t : {&request.input, &request.output}) {
      if (!t->defined()) continue;
      if (!t->is_cuda() || t->get_device() != device)
        throw InvalidArgument(fmt::format("NCCL backend: tensor on {} but this NCCL communicator uses cuda:{}{}",
                                          t->device().str(), device, where(rank, device)));
    }

    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const cudaStream_t comm_stream = stream_.stream();
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();

    // The collective runs after everything already queued on the caller's current stream.
    check_cuda("cudaEventRecord", cudaEventRecord(ready_.get(), current), rank, device);
    check_cuda("cudaStreamWaitEvent", cudaStreamWaitEvent(comm_stream, ready_.get(), 0), rank, device);

    EventPtr done = make_event(rank, device);
    // The signature check: pinned host copy in, MAX all-reduce on the device, copy back into the same
    // pinned buffer (stream order makes the reuse safe); the poll reads it once `checked` has passed.
    struct Check {
      long long mine[kNumSig] = {};
      at::Tensor host, dev;  // [fields | negated fields]: one MAX all-reduce gives max and -min
      EventPtr checked;
      std::atomic<bool> verified{false};  // polls may run on several threads
    };
    std::shared_ptr<Check> chk;
    if (check_) {
      chk = std::make_shared<Check>();
      make_signature(request, chk->mine);
      constexpr int64_t n = 2 * kNumSig;
      chk->host = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
      auto* h = chk->host.data_ptr<int64_t>();
      for (int f = 0; f < kNumSig; ++f) {
        h[f] = chk->mine[f];
        h[kNumSig + f] = -chk->mine[f];
      }
      chk->dev =
          at::empty({n}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
      c10::cuda::CUDACachingAllocator::recordStream(chk->dev.storage().data_ptr(), stream_);
      chk->checked = make_event(rank, device);
    }
    {
      std::lock_guard<std::mutex> lk(state_->mu);
      if (state_->aborted || state_->comm == nullptr)
        throw CommError(fmt::format(
            "NCCL backend: the NCCL communicator was aborted (an earlier collective timed out or failed); the job must "
            "restart{}",
            where(rank, device)));
      if (chk) {
        const size_t bytes = chk->host.nbytes();
        check_cuda(
            "cudaMemcpyAsync",
            cudaMemcpyAsync(chk->dev.data_ptr(), chk->host.data_ptr(), bytes, cudaMemcpyHostToDevice, comm_stream),
            rank, device);
        check_nccl("ncclAllReduce (argument check)",
                   ncclAllReduce(chk->dev.data_ptr(), chk->dev.data_ptr(), 2 * kNumSig, ncclInt64, ncclMax,
                                 state_->comm, comm_stream),
                   state_->comm, rank, device);
        check_cuda(
            "cudaMemcpyAsync",
            cudaMemcpyAsync(chk->host.data_ptr(), chk->dev.data_ptr(), bytes, cudaMemcpyDeviceToHost, comm_stream),
            rank, device);
        check_cuda("cudaEventRecord", cudaEventRecord(chk->checked.get(), comm_stream), rank, device);
      }
      launch(request, comm_stream);
      check_cuda("cudaEventRecord", cudaEventRecord(done.get(), comm_stream), rank, device);
    }

    // The caching allocator must not hand these blocks to another stream before the collective ends.
    for (const at::Tensor* t : {&request.input, &request.output}) {
      if (t->defined() && t->has_storage() && t->storage().data_ptr().get() != nullptr)
        c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), stream_);
    }
    // (the Communicator keeps input and output alive in the Work)
    if (request.kind == Collective::Barrier) request.work->keep_alive(std::make_shared<at::Tensor>(barrier_buf_));

    std::weak_ptr<NcclComm> weak = state_;
    const std::string what = request.work->what();
    const int size = state_->size;
    request.work->set_poll([done, weak, rank, size, device, chk, what]() -> bool {
      if (chk && !chk->verified.load()) {
        const cudaError_t c = cudaEventQuery(chk->checked.get());
        if (c != cudaSuccess && c != cudaErrorNotReady) throw_cuda("cudaEventQuery", c, rank, device);
        if (c == cudaSuccess && !chk->verified.exchange(true)) {
          const auto* all = chk->host.data_ptr<int64_t>();
          long long lo[kNumSig], hi[kNumSig];
          for (int f = 0; f < kNumSig; ++f) {
            hi[f] = all[f];
            lo[f] = -all[kNumSig + f];
          }
          try {
            verify_signature(chk->mine, lo, hi, what, rank, size);
          } catch (const MismatchError& e) {
            if (auto s = weak.lock()) {
              std::lock_guard<std::mutex> lk(s->mu);
              s->abort_locked();
            }
            MpiBackend::mark_broken();
            throw MismatchError(std::string(e.what()) +
                                " NCCL cannot cancel the collective it launched, so the NCCL communicator was aborted: "
                                "the job must restart.");
          }
        } else if (c == cudaErrorNotReady) {
          (void)cudaGetLastError();
        }
      }
      const cudaError_t e = cudaEventQuery(done.get());
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) throw_cuda("cudaEventQuery", e, rank, device);
      (void)cudaGetLastError();  // cudaErrorNotReady is not an error; do not leave it behind
      if (auto s = weak.lock()) s->check_async_error();
      return false;
    });
    request.work->set_on_timeout([weak] {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lk(s->mu);
        s->abort_locked();
      }
      MpiBackend::mark_broken();
    });
  }

 private:
  // Issues the NCCL call on `s`. Caller holds state_->mu.
  void launch(const Request& r, cudaStream_t s) {
    const int rank = state_->rank, device = state_->device;
    ncclComm_t comm = state_->comm;
    switch (r.kind) {
      case Collective::AllReduce:
      case Collective::ReduceScatter: {
        // The same signature: (send, recv, elements received, dtype, op, comm, stream).
        if (r.output.numel() == 0) return;
        const bool all = r.kind == Collective::AllReduce;
        auto* reduce = all ? &ncclAllReduce : &ncclReduceScatter;
        check_nccl(all ? "ncclAllReduce" : "ncclReduceScatter",
                   reduce(r.input.data_ptr(), r.output.data_ptr(), static_cast<size_t>(r.output.numel()),
                          nccl_dtype(r.output.scalar_type(), rank, device), nccl_op(r.op, rank, device), comm, s),
                   comm, rank, device);
        return;
      }
      case Collective::AllGather: {
        // Every dtype travels as bytes (fp8 included): no arithmetic happens.
        const size_t bytes = r.input.nbytes();
        if (bytes == 0) return;
        check_nccl("ncclAllGather", ncclAllGather(r.input.data_ptr(), r.output.data_ptr(), bytes, ncclUint8, comm, s),
                   comm, rank, device);
        return;
      }
      case Collective::Broadcast: {
        const size_t bytes = r.output.nbytes();
        if (bytes == 0) return;
        check_nccl("ncclBroadcast",
                   ncclBroadcast(r.input.data_ptr(), r.output.data_ptr(), bytes, ncclUint8, r.root, comm, s), comm,
                   rank, device);
        return;
      }
      case Collective::Barrier: {
        void* p = barrier_buf_.data_ptr();
        check_nccl("ncclAllReduce (barrier)", ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm, s), comm, rank,
                   device);
        return;
      }
    }
    throw CommError(fmt::format("NCCL backend: unknown collective{}", where(rank, device)));
  }

  std::shared_ptr<NcclComm> state_;
  c10::cuda::CUDAStream stream_;
  EventPtr ready_;          // reused: cudaStreamWaitEvent captures its state at call time
  at::Tensor barrier_buf_;  // 1 float32 on the device
  bool check_;              // the cross-rank signature check runs before each collective
};

}  // namespace

bool nccl_compiled() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown (ncclGetVersion failed)";
  int major, minor, patch;
  if (v >= 10000) {  // NCCL >= 2.9: major*10000 + minor*100 + patch
    major = v / 10000;
    minor = (v % 10000) / 100;
    patch = v % 100;
  } else {  // older: major*1000 + minor*100 + patch
    major = v / 1000;
    minor = (v % 1000) / 100;
    patch = v % 100;
  }
  return fmt::format("{}.{}.{}", major, minor, patch);
}

int cuda_device_count() {
  try {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // clear "no driver" etc.
      return 0;
    }
    return n < 0 ? 0 : n;
  } catch (...) {
    return 0;
  }
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return std::string(prop.uuid.bytes, sizeof prop.uuid.bytes);
}

std::unique_ptr<Backend> make_nccl_backend(MpiBackend& bootstrap, int device_index) {
  const int rank = bootstrap.rank(), size = bootstrap.size();
  const int ndev = cuda_device_count();
  if (device_index < 0 || device_index >= ndev)
    throw InvalidArgument(fmt::format("NCCL backend: cuda:{} does not exist ({} CUDA devices visible){}", device_index,
                                      ndev, where(rank, device_index)));

  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));

  // Rank 0's id (or its failure) reaches every rank, so a failing ncclGetUniqueId raises everywhere
  // instead of leaving the other ranks blocked in the broadcast.
  struct {
    int status;  // ncclResult_t of rank 0's ncclGetUniqueId
    ncclUniqueId id;
  } boot;
  std::memset(&boot, 0, sizeof boot);
  if (rank == 0) boot.status = static_cast<int>(ncclGetUniqueId(&boot.id));
  bootstrap.broadcast_bytes(&boot, sizeof boot, 0);
  if (boot.status != ncclSuccess)
    throw CommError(fmt::format("NCCL backend: ncclGetUniqueId failed on rank 0: {}{}",
                                ncclGetErrorString(static_cast<ncclResult_t>(boot.status)), where(rank, device_index)));

  auto state = std::make_shared<NcclComm>();
  state->rank = rank;
  state->size = size;
  state->device = device_index;
  ncclComm_t comm = nullptr;
  const ncclResult_t res = ncclCommInitRank(&comm, size, boot.id, rank);
  if (res != ncclSuccess)
    throw CommError(
        fmt::format("NCCL backend: ncclCommInitRank failed: {} (world of {}; NCCL needs one distinct GPU per "
                    "rank){}",
                    ncclGetErrorString(res), size, where(rank, device_index)));
  state->comm = comm;  // from here ~NcclComm releases it if anything below throws

  auto stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device_index));
  EventPtr ready = make_event(rank, device_index);
  at::Tensor barrier_buf = at::zeros(
      {1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)));
  c10::cuda::CUDACachingAllocator::recordStream(barrier_buf.storage().data_ptr(), stream);
  return std::make_unique<NcclBackend>(std::move(state), stream, std::move(ready), std::move(barrier_buf),
                                       env::get_int("ACCEL_COMM_CHECK") != 0);
}

}  // namespace accel::comm
