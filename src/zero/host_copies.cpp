#include "zero/host_copies.h"

#include "base/error.h"
#include "base/log.h"
#include "kernels/pinned_host.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/accumulate.h>

#include <fmt/format.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace accel::zero {
namespace {
// An emulated device's host memory: outside libtorch's CPU allocator, as a device's page-locked memory
// is, so that accel's counting allocator (memory::snapshot) sees what a device's would.
at::Tensor emulated_host_empty(at::IntArrayRef sizes, c10::ScalarType dtype) {
  const std::size_t bytes = static_cast<std::size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  void* p = std::malloc(std::max<std::size_t>(bytes, 1));
  if (!p)
    throw accel::RuntimeError(fmt::format("accel: {} bytes of (emulated) host memory could not be allocated", bytes));
  return at::from_blob(
      p, sizes, [](void* q) { std::free(q); }, at::TensorOptions().dtype(dtype));
}
}  // namespace

// A CPU device's side streams: one queue of operations per direction, run in order by whoever waits
// (the host thread, or the step worker waiting for a gradient), under one lock.
struct HostCopies::Emulation {
  static constexpr int kToHost = 0, kToDevice = 1;
  std::mutex mu;
  std::deque<std::function<void()>> ops[2];
  std::uint64_t queued[2] = {0, 0}, done[2] = {0, 0};

  std::uint64_t push(int side, std::function<void()> op) {
    const std::lock_guard<std::mutex> lock(mu);
    ops[side].push_back(std::move(op));
    return ++queued[side];
  }
  std::uint64_t last(int side) {
    const std::lock_guard<std::mutex> lock(mu);
    return queued[side];
  }
  void run(int side, std::uint64_t upto) {
    const std::lock_guard<std::mutex> lock(mu);
    const c10::NoGradGuard ng;
    while (done[side] < upto) {
      const std::function<void()> op = std::move(ops[side].front());
      ops[side].pop_front();
      ++done[side];  // (counted as run even if it throws: the queue goes on past it)
      op();
    }
  }
  bool finished(int side, std::uint64_t upto) {
    const std::lock_guard<std::mutex> lock(mu);
    return done[side] >= upto;
  }

  // A copy or add as a device runs it. The source's values are taken when it is queued (a device's
  // caching allocator keeps a freed source's memory until the side stream is past it, CPU memory goes
  // at once); when it runs, a source still in the same memory must hold them still (else it was
  // written before its copy could run: a race on a device), and a destination no longer in the memory
  // it was queued for (freed since: a device would have written memory that no one reads) is left.
  // The destination's version counts the write when it is queued, as a device's non-blocking copy_
  // counts it then (the engine tells a user's in-place zero_grad by it), not when it runs.
  // The values taken from a host source (a copy to the device) are host memory, outside libtorch's CPU
  // allocator as the page-locked source is (pinned_empty): accel's counting allocator sees what a
  // device's would. Those from a device source stand for it, held until the copy runs, and count.
  static std::function<void()> op(const at::Tensor& dst, const at::Tensor& src, bool add, const char* side,
                                  bool from_host) {
    struct Held {
      at::Tensor t;
      const void* memory;
    };
    auto memory_of = [](const at::Tensor& t) -> const void* {
      try {
        return t.storage().nbytes() > 0 ? t.storage().data_ptr().get() : nullptr;
      } catch (...) {  // (freed with a message to throw on access: sharding::free_storage)
        return nullptr;
      }
    };
    const Held to{dst, memory_of(dst)}, from{src, memory_of(src)};
    const at::Tensor values = from_host ? emulated_host_empty(src.sizes(), src.scalar_type()).copy_(src)
                                        : src.clone(at::MemoryFormat::Contiguous);
    dst.unsafeGetTensorImpl()->bump_version();
    const std::thread::id queued_on = std::this_thread::get_id();
    return [to, from, values, add, side, memory_of, queued_on] {
      // (Checked on the thread that queued it only: another one, the step worker, would look at the
      // source while that thread may free it.)
      if (std::this_thread::get_id() == queued_on && from.memory && memory_of(from.t) == from.memory) {
        const at::Tensor now = from.t.contiguous();
        if (std::memcmp(now.data_ptr(), values.data_ptr(), values.nbytes()) != 0)
          throw accel::LogicError(fmt::format(
              "HostCopies (emulated device): the source of a copy {} was written after the copy was queued and "
              "before anything waited for it (on a device, the copy could read either)",
              side));
      }
      if (!to.memory || memory_of(to.t) != to.memory) return;
      // (through a tensor of its own over the same memory: the destination's version stays)
      const at::Tensor dst = at::from_blob(to.t.data_ptr(), to.t.sizes(), to.t.strides(), to.t.options());
      if (add)
        dst.add_(values);
      else
        dst.copy_(values);
    };
  }
};

namespace {
std::atomic<bool> emulate_device{false};

c10::Stream side_stream(c10::Device device) {
  if (device.is_cpu()) return c10::Stream(c10::Stream::DEFAULT, device);  // (emulated: never used as a stream)
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
}
}  // namespace

void HostCopies::emulate_device_for_tests(bool on) { emulate_device = on; }
bool HostCopies::emulating_device_for_tests() { return emulate_device; }

void HostCopies::Done::synchronize() const {
  if (event_)
    event_->synchronize();
  else if (emulation_)
    emulation_->run(side_, upto_);
}

bool HostCopies::Done::query() const {
  if (event_) return event_->query();
  return !emulation_ || emulation_->finished(side_, upto_);
}

// Two side streams, one per direction: a gradient on its way to the host and a parameter shard on
// its way to the device share the bus (both directions at once), not a queue.
HostCopies::HostCopies(c10::Device device)
    : device_(device),
      to_host_(side_stream(device)),
      to_device_(side_stream(device)),
      emulation_(device.is_cpu() ? std::make_shared<Emulation>() : nullptr) {}

void HostCopies::queue(const c10::Stream& side, const at::Tensor& dst, const at::Tensor& src,
                       const at::Tensor& on_device) {
  if (emulation_) {  // (the tensors are held until the copy runs, as recordDataPtrOnStream holds memory)
    const bool to_host = &side == &to_host_;
    emulation_->push(
        to_host ? Emulation::kToHost : Emulation::kToDevice,
        Emulation::op(dst, src, /*add=*/false, to_host ? "to the host" : "to the device", /*from_host=*/!to_host));
    (to_host ? pending_host_ : pending_device_) = true;
    return;
  }
  // The device current while events are recorded and blocked (c10 switches back to the thread's device
  // after them, which would make a context on GPU 0 for a thread that never chose one).
  const c10::DeviceGuard on(device_);
  c10::impl::VirtualGuardImpl impl(device_.type());
  c10::Event ready(device_.type());  // the side stream waits for the current stream's queued work
  ready.record(impl.getStream(device_));
  ready.block(side);
  {
    c10::StreamGuard guard(side);
    if (!dst.is_cpu() && dst.scalar_type() != src.scalar_type()) {
      // To the device in another dtype (an fp32 master to its bf16 parameters): the bytes as they are,
      // then the conversion there. (ATen's copy_ would convert on the host into pageable memory, whose
      // copy blocks the host until the side stream reaches it.) The staging tensor's memory goes back
      // to the caching allocator under this stream, which orders its reuse.
      at::Tensor staged = at::empty(src.sizes(), src.options().device(device_).pinned_memory(false));
      staged.copy_(src, /*non_blocking=*/true);
      dst.copy_(staged, /*non_blocking=*/true);
    } else {
      dst.copy_(src, /*non_blocking=*/true);
    }
  }
  impl.recordDataPtrOnStream(on_device.storage().data_ptr(), side);
  (&side == &to_host_ ? pending_host_ : pending_device_) = true;
}

void HostCopies::to_host(const at::Tensor& dst, const at::Tensor& src) { queue(to_host_, dst, src, src); }

void HostCopies::add_to_host(const at::Tensor& dst, const at::Tensor& src) {
  if (emulation_) {
    emulation_->push(Emulation::kToHost,
                     Emulation::op(dst, src, /*add=*/true, "added to the host", /*from_host=*/false));
    pending_host_ = true;
    return;
  }
  const c10::DeviceGuard on(device_);
  c10::impl::VirtualGuardImpl impl(device_.type());
  c10::Event ready(device_.type());
  ready.record(impl.getStream(device_));
  ready.block(to_host_);
  {
    // Allocated under the side stream, so the caching allocator orders the temporary's reuse by it.
    c10::StreamGuard guard(to_host_);
    at::Tensor sum = at::empty(dst.sizes(), dst.options().device(device_).pinned_memory(false));
    sum.copy_(dst, /*non_blocking=*/true);
    sum.add_(src);
    dst.copy_(sum, /*non_blocking=*/true);
  }
  impl.recordDataPtrOnStream(src.storage().data_ptr(), to_host_);
  pending_host_ = true;
}

void HostCopies::to_device(const at::Tensor& dst, const at::Tensor& src) { current_waits(to_device_async(dst, src)); }

HostCopies::Done HostCopies::to_device_async(const at::Tensor& dst, const at::Tensor& src) {
  queue(to_device_, dst, src, dst);
  return done_on(to_device_);
}

HostCopies::Done HostCopies::to_host_event() { return done_on(to_host_); }

HostCopies::Done HostCopies::done_on(const c10::Stream& side) const {
  Done done;
  if (emulation_) {
    done.emulation_ = emulation_;
    done.side_ = &side == &to_host_ ? Emulation::kToHost : Emulation::kToDevice;
    done.upto_ = emulation_->last(done.side_);
    return done;
  }
  const c10::DeviceGuard on(device_);
  done.event_.emplace(device_.type());
  done.event_->record(side);
  return done;
}

void HostCopies::current_waits(const Done& done) const {
  if (!done.event_) {  // (emulated: the compute stream's next work is the host's, so the copies run now)
    done.synchronize();
    return;
  }
  const c10::DeviceGuard on(device_);
  c10::impl::VirtualGuardImpl impl(device_.type());
  done.event_->block(impl.getStream(device_));
}

at::Tensor HostCopies::pinned_empty(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
  // Whole pages (64 KiB on some aarch64 systems): no two buffers share one, which registering both
  // would refuse.
  static const std::size_t kPage = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
  }();
  const std::size_t bytes = static_cast<std::size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  if (device.is_cpu()) {  // (no device to lock it for)
    return emulating_device_for_tests() ? emulated_host_empty(sizes, dtype)
                                        : at::empty(sizes, at::TensorOptions().dtype(dtype));
  }
  const std::size_t rounded = std::max<std::size_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
  std::optional<c10::DeviceGuard> on_device;
  if (!device.is_cpu()) on_device.emplace(device);
  void* p = nullptr;
  const char* why = "posix_memalign refused";
  if (posix_memalign(&p, kPage, rounded) == 0) {
    if (kernels::pinned::register_range(p, rounded, &why))
      return at::from_blob(
          p, sizes,
          // (unregistered under the device it was registered for: the thread that drops the last
          // reference may have another current device, where the call would make a context)
          [device](void* q) {
            std::optional<c10::DeviceGuard> on;
            try {
              if (!device.is_cpu()) on.emplace(device);
            } catch (...) {  // (a deleter must not throw: unregistered from wherever it is)
            }
            kernels::pinned::unregister_range(q);
            std::free(q);
          },
          at::TensorOptions().dtype(dtype));
    std::free(p);
  }
  static std::once_flag said;
  std::call_once(said, [&] {
    log::warning(
        fmt::format("accel: host memory could not be page-locked as asked ({}): PyTorch's pinned "
                    "allocator instead, which rounds each buffer up to a power of two",
                    why));
  });
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(true));
}

void HostCopies::synchronize() {
  synchronize_to_host();
  if (!pending_device_) return;
  if (emulation_)
    emulation_->run(Emulation::kToDevice, emulation_->last(Emulation::kToDevice));
  else
    to_device_.synchronize();
  pending_device_ = false;
}

void HostCopies::synchronize_to_host() {
  if (!pending_host_) return;
  if (emulation_)
    emulation_->run(Emulation::kToHost, emulation_->last(Emulation::kToHost));
  else
    to_host_.synchronize();
  pending_host_ = false;
}

}  // namespace accel::zero
