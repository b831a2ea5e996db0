#include "zero/host_copies.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace accel::zero {

namespace {
c10::Stream side_stream(c10::Device device) {
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
}
}  // namespace

HostCopies::HostCopies(c10::Device device) : device_(device), side_(side_stream(device)) {}

void HostCopies::after_current() {
  c10::impl::VirtualGuardImpl impl(device_.type());
  c10::Event ready(device_.type());
  ready.record(impl.getStream(device_));
  ready.block(side_);
}

void HostCopies::queue(const at::Tensor& dst, const at::Tensor& src, const at::Tensor& on_device) {
  after_current();
  {
    c10::StreamGuard guard(side_);
    dst.copy_(src, /*non_blocking=*/true);
  }
  c10::impl::VirtualGuardImpl impl(device_.type());
  impl.recordDataPtrOnStream(on_device.storage().data_ptr(), side_);
  pending_ = true;
}

void HostCopies::to_host(const at::Tensor& dst, const at::Tensor& src) { queue(dst, src, src); }

void HostCopies::to_device(const at::Tensor& dst, const at::Tensor& src) { current_waits(to_device_async(dst, src)); }

c10::Event HostCopies::to_device_async(const at::Tensor& dst, const at::Tensor& src) {
  queue(dst, src, dst);
  c10::Event done(device_.type());
  done.record(side_);
  return done;
}

void HostCopies::current_waits(const c10::Event& done) const {
  c10::impl::VirtualGuardImpl impl(device_.type());
  done.block(impl.getStream(device_));
}

void HostCopies::synchronize() {
  if (!pending_) return;
  side_.synchronize();
  pending_ = false;
}

}  // namespace accel::zero
