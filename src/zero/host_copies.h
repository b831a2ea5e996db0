// accel::zero::HostCopies — the side streams that move data between a device and pinned host memory
// for offload to host memory: reduced gradient shards device -> host as each bucket finishes and
// updated master shards host -> device after the CPU step (offload_optimizer.device cpu,
// ZeRO-Offload), parameter shards host -> device ahead of their gathers (offload_param.device cpu),
// all off the compute stream, one side stream per direction (both directions of the bus at once).
//
// Contract (all calls from the host thread that drives the engine):
//   * to_host(dst, src): queued on the to-host side stream after everything queued so far on the device's
//     current stream (src is ready there). The host must not read dst before synchronize().
//   * to_device(dst, src): queued on the to-device side stream after the current stream's work (nothing there
//     still reads dst); the current stream then waits for it (a device-side wait: the host does not
//     block), so every kernel queued afterwards sees the new values. The host must not write src
//     before synchronize().
//   * to_device_async(dst, src): the same copy, but nothing waits for it yet: it returns the Done
//     that marks it (an event), and current_waits(done) makes the current stream wait for it when the
//     values are needed (a prefetch: the copy runs while the kernels queued after it compute).
//   * add_to_host(dst, src): dst += src for dst in pinned host memory and src on the device, on the
//     to-host side stream after the current stream's queued work and every copy to the host queued
//     before it: dst goes over to the device, the sum is made there and comes back (the host neither
//     blocks nor adds; the device holds one temporary of dst's size until the copy back is done).
//     The host must not read or write dst before synchronize().
//   * Device tensors used on the side stream are recorded on it, so the caching allocator does not
//     hand their memory out again while a copy is in flight.
// Written against c10's device-generic stream and event interfaces, so it compiles in a CPU-only build.
//
// On the CPU (tests): HostCopies of a CPU "device" emulates one. Every copy and add is queued and
// runs only when something waits for it (synchronize, synchronize_to_host, current_waits, a Done's
// synchronize), on the thread that waits: as late as a device could run it. A caller that reads a
// destination before waiting, or writes a source it queued before the copy ran, sees the wrong values
// there, as it could on a device. With emulate_device_for_tests(true), an engine over a CPU model
// takes a device's offload path through such a HostCopies (zero/engine_offload.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace accel::zero {

class HostCopies {
  struct Emulation;

 public:
  // Where a side stream's queued copies end: an event on a device, a place in the queue emulated.
  class Done {
   public:
    void synchronize() const;  // the host waits until the copies are done
    bool query() const;        // they are done

   private:
    friend class HostCopies;
    std::optional<c10::Event> event_;
    std::shared_ptr<Emulation> emulation_;
    int side_ = 0;
    std::uint64_t upto_ = 0;
  };

  explicit HostCopies(c10::Device device);
  void to_host(const at::Tensor& dst, const at::Tensor& src);
  void add_to_host(const at::Tensor& dst, const at::Tensor& src);
  void to_device(const at::Tensor& dst, const at::Tensor& src);
  Done to_device_async(const at::Tensor& dst, const at::Tensor& src);
  // Passes once every copy to the host queued so far has finished.
  Done to_host_event();
  void current_waits(const Done& done) const;
  // A tensor of `sizes` (contiguous, not a view: a master or a gradient made of it can be detached
  // in place, as Optimizer::zero_grad does) in host memory page-locked for the devices (copies from
  // and to it run on the side streams without the host), taking the bytes it asks for rounded up to a
  // page: PyTorch's pinned allocator would round them up to a power of two. Where that cannot be had
  // (a build without the CUDA runtime of its own), PyTorch's pinned memory. Freed with the tensor: the
  // caller keeps it alive until no copy from or to it is in flight. `device`: the device the copies go
  // to, current while the memory is registered (a CUDA context is made there, not on device 0, for a
  // rank on another GPU); the CPU: ordinary host memory, outside libtorch's CPU allocator while a
  // device is emulated (as a device's page-locked memory is outside it: memory::snapshot then shows
  // what the device would hold).
  static at::Tensor pinned_empty(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device);
  // Blocks until every copy queued so far has finished (a no-op when none is pending).
  void synchronize();
  // Blocks until the copies to the host queued so far have finished (the host reads what they wrote;
  // copies to the device, parameter prefetches among them, go on).
  void synchronize_to_host();
  const c10::Device& device() const { return device_; }
  bool emulated() const { return emulation_ != nullptr; }

  // Tests: whether an engine over a CPU model takes a device's offload path, through an emulated
  // HostCopies (read when the engine is built; off by default).
  static void emulate_device_for_tests(bool on);
  static bool emulating_device_for_tests();

 private:
  void queue(const c10::Stream& side, const at::Tensor& dst, const at::Tensor& src, const at::Tensor& on_device);
  Done done_on(const c10::Stream& side) const;  // passes once what `side` has queued so far is done

  c10::Device device_;
  c10::Stream to_host_, to_device_;  // one side stream per direction
  bool pending_host_ = false, pending_device_ = false;
  std::shared_ptr<Emulation> emulation_;  // a CPU device's queues
};

}  // namespace accel::zero
