#include "zero/host_copies.h"

#include "base/log.h"
#include "kernels/pinned_host.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/accumulate.h>

#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <optional>

namespace accel::zero {

namespace {
c10::Stream side_stream(c10::Device device) {
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
}
}  // namespace

// Two side streams, one per direction: a gradient on its way to the host and a parameter shard on
// its way to the device share the bus (both directions at once), not a queue.
HostCopies::HostCopies(c10::Device device)
    : device_(device), to_host_(side_stream(device)), to_device_(side_stream(device)) {}

void HostCopies::queue(const c10::Stream& side, const at::Tensor& dst, const at::Tensor& src,
                       const at::Tensor& on_device) {
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
  (side == to_host_ ? pending_host_ : pending_device_) = true;
}

void HostCopies::to_host(const at::Tensor& dst, const at::Tensor& src) { queue(to_host_, dst, src, src); }

void HostCopies::add_to_host(const at::Tensor& dst, const at::Tensor& src) {
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

c10::Event HostCopies::to_device_async(const at::Tensor& dst, const at::Tensor& src) {
  queue(to_device_, dst, src, dst);
  const c10::DeviceGuard on(device_);
  c10::Event done(device_.type());
  done.record(to_device_);
  return done;
}

c10::Event HostCopies::to_host_event() {
  const c10::DeviceGuard on(device_);
  c10::Event done(device_.type());
  done.record(to_host_);
  return done;
}

void HostCopies::current_waits(const c10::Event& done) const {
  const c10::DeviceGuard on(device_);
  c10::impl::VirtualGuardImpl impl(device_.type());
  done.block(impl.getStream(device_));
}

at::Tensor HostCopies::pinned_empty(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
  // Whole pages (64 KiB on some aarch64 systems): no two buffers share one, which registering both
  // would refuse.
  static const std::size_t kPage = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
  }();
  const std::size_t bytes = static_cast<std::size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
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
  to_device_.synchronize();
  pending_device_ = false;
}

void HostCopies::synchronize_to_host() {
  if (!pending_host_) return;
  to_host_.synchronize();
  pending_host_ = false;
}

}  // namespace accel::zero
