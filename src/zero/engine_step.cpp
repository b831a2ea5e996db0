// The step's side of the engine: gradient clipping (by global norm, by value), what fp16 unscaling
// sees, and the bracket around the optimizer's step (masters written back, parameters all-gathered).
#include "base/error.h"
#include "zero/engine.h"

#include "base/memory.h"
#include "zero/step_worker.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <utility>

namespace accel::zero {

void Engine::clip_grad_value(double clip_value) {
  if (!(clip_value >= 0)) throw accel::InvalidArgumentError("clip_grad_value: clip_value must be >= 0");
  refuse_after_step_in_backward("clip_grad_value");
  if (plan_.state_split)
    throw accel::LogicError(fmt::format(
        "clip_grad_value: the gradients are sharded across ranks under {}; clip by norm instead (clip_grad_norm)",
        to_string(spec_.strategy)));
  for (const auto& group : group_params_)
    for (const auto& p : group)
      if (p.grad().defined()) p.grad().clamp_(-clip_value, clip_value);
  for (auto& f : flats_)
    if (f.master_grad_set && f.master.grad().defined()) note_master_grad(f);
  for (auto& f : flats_)  // the reduced gradient where the master's is a converted copy
    if (f.grad.defined() && f.master.defined() && f.master.grad().defined() && !f.grad.is_alias_of(f.master.grad()))
      f.grad.clamp_(-clip_value, clip_value);
}

double Engine::clip_grad_norm(double max_norm, double norm_type) {
  const bool inf = std::isinf(norm_type);
  if (!inf && norm_type < 1.0) throw accel::InvalidArgumentError("clip_grad_norm: norm_type must be >= 1 or inf");
  refuse_after_step_in_backward("clip_grad_norm");
  double local = 0.0;
  std::vector<at::Tensor> grads;
  for (const auto& group : group_params_)
    for (const auto& p : group)
      if (p.grad().defined()) grads.push_back(p.grad());
  for (const auto& grad : grads) {
    at::Tensor g = grad.to(at::kDouble);
    if (inf)
      local = std::max(local, g.abs().max().item<double>());
    else
      local += g.abs().pow(norm_type).sum().item<double>();
  }
  double total = local;
  if (plan_.state_split) {
    at::Tensor t = at::full({1}, local, at::kDouble);
    shard_->all_reduce(t, {inf ? comm::ReduceOp::Max : comm::ReduceOp::Sum});
    total = t.item<double>();
  }
  if (!inf) total = std::pow(total, 1.0 / norm_type);
  double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (auto& g : grads) g.mul_(coef);
    grads_scaled(coef);
  }
  return total;
}

std::vector<at::Tensor> Engine::step_grads() const {
  std::vector<at::Tensor> grads;
  for (const auto& group : group_params_)
    for (const auto& p : group)
      if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

void Engine::grads_scaled(double coef) {
  refuse_after_step_in_backward("scaling the gradients (unscaling, clipping)");
  for (auto& f : flats_)
    if (f.master_grad_set && f.master.grad().defined()) note_master_grad(f);
  for (auto& f : flats_)  // the reduced gradient where the master's is a converted copy
    if (f.grad.defined() && f.master.defined() && f.master.grad().defined() && !f.grad.is_alias_of(f.master.grad()))
      f.grad.mul_(coef);
}

void Engine::skip_step() {
  if (in_backward_) throw accel::LogicError("accel: optimizer step during backward");
  refuse_after_step_in_backward("skipping the step");
  for (const auto& group : group_params_)
    for (const auto& p : group) p.mutable_grad() = at::Tensor();
  close_step();
}

void Engine::close_step() {
  // The step consumed (or dropped) the gradients: the next backward starts a new accumulation window.
  for (auto& f : flats_) {
    f.grad_live = false;
    f.flat_param->detach_grads();
    f.grad = at::Tensor();  // after a step, master.grad keeps it until zero_grad
    f.grad_sum = at::Tensor();
    f.grad_shown = false;
    f.master_grad_set = false;
    f.stepped_in_backward = false;
  }
  if (reducer_) reducer_->release_scratch();
}

void Engine::before_step() {
  RECORD_USER_SCOPE("accel::before_step");
  memory::set_forward_active(false);
  if (in_backward_) throw accel::LogicError("accel: optimizer step during backward");
  wait_host_copies();  // (the last step's copies to the device read the masters the step writes)
  wait_steps_in_backward();
  if (step_error_) {
    // A step taken in backward failed: this step fails with its error (the job ends, as for any step
    // that throws), and the window's gradients go, so that nothing adds to them or steps them again.
    const std::exception_ptr e = std::exchange(step_error_, nullptr);
    for (auto& f : flats_)
      if (f.stepped_in_backward) f.master.mutable_grad() = at::Tensor();
    close_step();
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& err) {
      step_failed(err.what());  // (the peers are about to enter the step's collectives)
      throw;
    }
  }
  sync_node_shared();  // no peer still reads the node-shared parameters this step writes
}

// ---------------------------------------------------------------------------------------------------
// The step in backward (spec.step_in_backward)

void Engine::set_step_one(std::function<bool(const at::Tensor& master)> step_one) {
  wait_steps_in_backward();
  step_one_ = std::move(step_one);
}

bool Engine::steps_in_backward(const Flat& f) const {
  if (!spec_.step_in_backward || !step_one_ || !sync_ || more_micro_steps_ || aborting_backward_ || f.group < 0 ||
      f.opt_region != npos || !f.master.defined())
    return false;
  const at::Tensor& m = f.master;
  if (!m.is_cpu() || m.scalar_type() != at::kFloat || !m.is_contiguous()) return false;
  if (host_master(f)) return true;  // a device's master in host memory: stepped once its gradient is there
  if (on_a_device_) return false;   // (a master on an emulated device: one on the device's memory)
  // On the host: a master of its own (wider than the parameters), never the buffer the parameters
  // (or a peer, node-shared) still read during this backward.
  // (By storage object: a sharded flat's freed buffers throw on a look at their data.)
  auto same = [&](const at::Tensor& t) {
    return t.defined() && t.storage().unsafeGetStorageImpl() == m.storage().unsafeGetStorageImpl();
  };
  return !same(f.flat_param->shard()) && !same(f.flat_param->full());
}

void Engine::step_in_backward(Flat& f, const at::Tensor& g) {
  std::shared_ptr<const HostCopies::Done> arrived;
  if (host_master(f)) {
    f.master.mutable_grad() = f.host_grad;  // (grad_to_host just queued the copy into it)
    arrived = std::make_shared<const HostCopies::Done>(host_copies_->to_host_event());
  } else {
    // A copy of its own: the reduction's buffers are reused while the step reads it.
    f.master.mutable_grad() = g.to(f.master.device(), f.master.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }
  note_master_grad(f);
  f.stepped_in_backward = true;
  if (!step_worker_)  // (its device current on its thread for good: c10's event calls switch back to it)
    step_worker_ = std::make_unique<StepWorker>([device = device_] {
      if (device.is_cuda()) c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
    });
  step_worker_->post([this, master = f.master, arrived, name = f.flat_param->name()] {
    if (arrived) arrived->synchronize();  // the gradient is in host memory
    memory::CategoryScope cat(memory::Category::OptimizerState);
    if (!step_one_(master))
      throw accel::LogicError(
          fmt::format("step_in_backward: the master of {} could not take the optimizer's fused CPU step (its state or "
                      "options changed to something those kernels do not do)",
                      name));
  });
}

void Engine::wait_steps_in_backward() {
  if (step_worker_) step_worker_->wait();
}

std::vector<at::Tensor> Engine::stepped_in_backward() const {
  std::vector<at::Tensor> out;
  for (const auto& f : flats_)
    if (f.stepped_in_backward) out.push_back(f.master);
  return out;
}

void Engine::refuse_after_step_in_backward(const char* what) const {
  for (const auto& f : flats_)
    if (f.stepped_in_backward)
      throw accel::LogicError(fmt::format(
          "accel: {} after the optimizer already stepped {} in backward (step_in_backward, ACCEL_STEP_IN_BACKWARD): "
          "the step would not see it; turn step_in_backward off to clip, unscale or skip steps",
          what, f.flat_param->name()));
}

void Engine::step_failed(const std::string& what) {
  if (world_->size() == 1) return;  // (nobody waits; passthrough is a world of one too)
  world_->abandon(fmt::format("the optimizer step failed on rank {}: {}", world_->rank(), what));
}

void Engine::sync_node_shared() {
  if (node_shared()) gather_->barrier();
}

void Engine::before_param_writes() {
  wait_host_copies();  // no copy to the device still reads the host masters written next
  sync_node_shared();
}

std::pair<std::int64_t, std::int64_t> Engine::master_range(const Flat& f) const {
  if (plan_.masters_are_shards) return f.flat_param->layout().shard_range(f.flat_param->options().rank);
  return {0, f.flat_param->layout().padded()};
}

void Engine::after_step() {
  RECORD_USER_SCOPE("accel::after_step");
  if (plan_.passthrough) return;
  write_params(/*offloaded_done=*/true);
  close_step();
}

void Engine::params_from_masters() {
  sync_node_shared();  // (node-shared parameters: no peer still reads what this writes)
  write_params(/*offloaded_done=*/false);
}

void Engine::write_params(bool offloaded_done) {
  if (plan_.passthrough) return;
  c10::NoGradGuard ng;
  std::vector<comm::WorkPtr> works;
  for (auto& f : flats_) {
    if (f.group >= 0 && !(offloaded_done && f.opt_region != npos)) {
      // Master -> compute buffer where they are different tensors (or -> the shard's file).
      const at::Tensor master = master_data(f);
      const at::Tensor& dst = plan_.masters_are_shards ? f.flat_param->shard() : f.flat_param->full();
      if (f.param_slot != npos)
        param_offload_->store(f.param_slot, 0, master);
      else if (host_master(f))
        host_copies_->to_device(dst, master);  // the compute stream waits for it on the device
      else if (!master.is_alias_of(dst))
        dst.copy_(master);
    }
    // Replicated parameters (ZeRO-1/2) and the always-gathered root unit (ZeRO-3) are all-gathered
    // from the updated shards; sharded units are gathered again by their next forward.
    // (A persistent flat keeps its own shard buffer whenever parameters are sharded, on one rank too:
    // parameters offloaded to disk shard a world of one.)
    // Frozen flats: the step never writes them, a loaded checkpoint (params_from_masters) only into the
    // shard of a sharded one, which the root unit's keeps gathered.
    if (f.group < 0 && offloaded_done) continue;
    if (!f.flat_param->options().sharded) {
      if (f.group < 0 || !plan_.state_split) continue;
      auto [b, e] = f.flat_param->layout().shard_range(f.flat_param->options().rank);
      works.push_back(gather_->all_gather_async(f.flat_param->full().narrow(0, b, e - b), f.flat_param->full()));
    } else if (f.persistent && !f.flat_param->node_shared()) {
      works.push_back(gather_->all_gather_async(f.flat_param->shard(), f.flat_param->full()));
    }
  }
  for (auto& w : works) w->wait();
  sync_node_shared();  // every rank's shard is written before any rank reads the parameters again
  // Sharded units gathered as fp8: their bytes follow the new masters.
  quantize_fp8_shards();
}

}  // namespace accel::zero
