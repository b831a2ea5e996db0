// Collectives on device tensors through pinned host memory and the group's CPU transport (see
// staged_backend.h for the ordering).
#include "comm/transport/staged/staged_backend.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <string>

namespace accel::comm {
namespace {

c10::Stream pool_stream(c10::Device device) {
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
}

// An event destroyed under a guard for its device: its last owner may be the host transport's progress
// thread, where c10's destroyEvent would switch back to the device that thread never chose (0), making a
// context on GPU 0 for a rank that runs on another.
std::shared_ptr<c10::Event> device_event(c10::Device device) {
  return std::shared_ptr<c10::Event>(new c10::Event(device.type()), [device](c10::Event* e) {
    const c10::DeviceGuard on_device(device);
    delete e;
  });
}

at::Tensor pinned_like(const at::Tensor& t) {
  return at::empty({t.numel()}, t.options().device(at::kCPU).pinned_memory(true));
}

class StagedBackend final : public Backend {
 public:
  StagedBackend(Backend& host, c10::Device device)
      : host_(host),
        device_(device),
        to_host_(pool_stream(device)),
        to_device_(pool_stream(device)),
        name_(std::string("host+") + host.name()) {}

  const char* name() const override { return name_.c_str(); }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void enqueue(Request r) override {
    if (!r.work) throw CommError(fmt::format("{}: request without a Work (rank {})", name_, rank()));
    if (r.kind == Collective::Barrier) {  // no tensors: the host transport's barrier
      host_.enqueue(std::move(r));
      return;
    }
    for (const at::Tensor* t : {&r.input, &r.output})
      if (t->device() != device_)
        throw InvalidArgument(fmt::format("{}: tensor on {} but this communicator stages {} (rank {})", name_,
                                          t->device().str(), device_.str(), rank()));
    // This device current while events are recorded and streams blocked here: c10's event calls switch
    // back to the thread's device after, which would make a context on GPU 0 for a thread that never
    // chose one.
    const c10::DeviceGuard on_device(device_);
    const at::Tensor in = r.input.view({-1}), out = r.output.view({-1});
    const bool broadcast = r.kind == Collective::Broadcast;
    // Pinned copies: in place for all_reduce and broadcast, as the host transport allows.
    const at::Tensor h_in = pinned_like(in);
    const at::Tensor h_out = (r.kind == Collective::AllReduce || broadcast) ? h_in : pinned_like(out);

    c10::impl::VirtualGuardImpl impl(device_.type());
    // Everything the caller's stream has queued so far comes first: it may still write the input (the
    // copy out waits for it) or the output (the copy back, too: a broadcast's receiver zeroing it).
    auto queued = device_event(device_);
    queued->record(impl.getStream(device_));
    // device -> host (a broadcast's receivers send nothing)
    if (!broadcast || rank() == r.root) {
      queued->block(to_host_);
      c10::StreamGuard on_copy_stream(to_host_);
      c10::NoGradGuard raw_bytes;  // (a parameter's buffer may require grad: no autograd here)
      h_in.copy_(in, /*non_blocking=*/true);
      if (in.numel() > 0) impl.recordDataPtrOnStream(r.input.storage().data_ptr(), to_host_);
    }
    auto staged = device_event(device_);
    staged->record(to_host_);

    // The host collective, in issue order, started once the staging copy has landed; its completion
    // queues host -> device (a broadcast's root already holds the result).
    auto done = device_event(device_);
    const bool copy_back = !broadcast || rank() != r.root;
    Request h;
    h.kind = r.kind;
    h.input = h_in;
    h.output = h_out;
    h.op = r.op;
    h.root = r.root;
    h.work =
        std::make_shared<Work>(r.work->what() + " (staged through host memory)", rank(), size(), default_timeout());
    // (Both run on the host transport's progress thread: the device guard again.)
    h.ready = [staged, device = device_] {
      const c10::DeviceGuard on_device(device);
      return staged->query();
    };
    h.then = [out, h_out, queued, done, copy_back, device = device_, stream = to_device_] {
      const c10::DeviceGuard on_device(device);
      queued->block(stream);
      c10::StreamGuard on_copy_stream(stream);
      // Raw bytes, as the CPU transports and NCCL write them: below autograd and the in-place view
      // tracking, so the output's version counter does not move and an inference tensor (made under
      // c10::InferenceMode, which this thread never enters) takes the result.
      at::AutoDispatchBelowADInplaceOrView raw_bytes;
      if (copy_back && out.numel() > 0) {
        out.copy_(h_out, /*non_blocking=*/true);
        c10::impl::VirtualGuardImpl(device.type()).recordDataPtrOnStream(out.storage().data_ptr(), stream);
      }
      done->record(stream);
    };
    WorkPtr inner = h.work;
    host_.enqueue(std::move(h));
    // Done once the host collective is (polling it moves it, as a CPU collective's waiter does) and the
    // copy back has passed.
    r.work->set_poll([inner, done] {
      if (!inner->is_completed()) return false;
      if (auto e = inner->exception()) std::rethrow_exception(e);
      return done->query();
    });
  }

 private:
  Backend& host_;
  c10::Device device_;
  c10::Stream to_host_, to_device_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Backend> make_staged_backend(Backend& host, c10::Device device) {
  return std::make_unique<StagedBackend>(host, device);
}

}  // namespace accel::comm
