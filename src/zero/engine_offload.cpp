// The engine's side of offload (spec.offload). To disk (nvme): which flats' optimizer state and
// parameter shards go to files, the offloaded step, parameter shards fetched ahead of their
// gathers, and staging for checkpoints. To host memory from a device (cpu): the side stream that
// copies reduced gradients to the pinned masters' host buffers and updated masters back, and
// parameter shards kept in pinned host memory, copied to the device before their gathers.
#include "base/error.h"
#include "zero/engine.h"

#include "base/memory.h"
#include "zero/optimizers.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace accel::zero {

using memory::Category;
using memory::CategoryScope;

void Engine::setup_offload(const torch::optim::Optimizer* optimizer) {
  const OffloadSpec& os = spec_.offload;
  if (plan_.passthrough) return;
  if (os.optimizer == OffloadDevice::Cpu && spec_.fp8_all_gather)
    throw accel::InvalidArgumentError("offload_optimizer to cpu cannot be combined with fp8 all-gather yet");
  if (os.param_offloaded() && spec_.fp8_all_gather)
    throw accel::InvalidArgumentError(
        "offload_param cannot be combined with fp8 all-gather (fp8 shards stay in the device's memory)");
  c10::NoGradGuard ng;
  // The side streams between the device and pinned host memory: for host masters (offload_optimizer
  // cpu) and for parameter shards kept in host memory or read from a file (offload_param).
  const bool params_leave = os.param_offloaded() && plan_.params_sharded;
  if (on_a_device_ && (os.optimizer == OffloadDevice::Cpu || params_leave))
    for (const auto& f : flats_)
      if (params_leave || f.master_in_host_memory) {
        host_copies_ = std::make_unique<HostCopies>(device_);
        break;
      }
  if (os.optimizer_on_disk() && optimizer) {
    const OptimizerRow* row = find_optimizer_row(*optimizer);
    if (!row || !row->offload_rule)
      throw accel::InvalidArgumentError(fmt::format(
          "offload_optimizer.device nvme steps the optimizer with accel's fused CPU kernels, which exist for Adam, "
          "AdamW and SGD; the optimizer is {}",
          row ? row->name : c10::demangle(typeid(*optimizer).name())));
    std::vector<OptimizerOffload::Region> regions;
    for (std::size_t fi = 0; fi < flats_.size(); ++fi) {
      Flat& f = flats_[fi];
      if (f.group < 0) continue;
      const c10::ScalarType mdt = f.master.defined() ? f.master.scalar_type() : f.flat_param->options().dtype;
      if (mdt != at::kFloat)
        throw accel::InvalidArgumentError(
            fmt::format("offload_optimizer.device nvme needs fp32 master weights; {} has {} masters",
                        f.flat_param->name(), c10::toString(mdt)));
      const auto& g = optimizer->param_groups().at(static_cast<std::size_t>(f.group));
      OptimizerOffload::Region r;
      auto [b, e] = master_range(f);
      r.numel = e - b;
      row->offload_rule(g.has_options() ? g.options() : optimizer->defaults(), r.rule);
      f.opt_region = regions.size();
      opt_region_flat_.push_back(fi);
      regions.push_back(r);
    }
    opt_offload_ = std::make_unique<OptimizerOffload>(os, world_->rank(), std::move(regions));
    for (std::size_t r = 0; r < opt_region_flat_.size(); ++r) {
      Flat& f = flats_[opt_region_flat_[r]];
      if (f.master.defined()) {
        opt_offload_->init(r, f.master);
      } else {
        auto [b, e] = master_range(f);
        const at::Tensor& compute = plan_.masters_are_shards ? f.flat_param->shard() : f.flat_param->full();
        opt_offload_->init(r, plan_.masters_are_shards ? compute : compute.narrow(0, b, e - b));
      }
      // The handle: shaped like the master, no memory.
      f.master = at::empty({opt_offload_->regions()[r].numel}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
    }
  }
  // Parameter shards to disk, or (a model on a device) to pinned host memory.
  if ((os.param_on_disk() || (os.param == OffloadDevice::Cpu && on_a_device_)) && plan_.params_sharded) {
    std::vector<sharding::FlatParam*> slots;
    std::vector<at::Tensor> twins;  // host masters that can serve as the shards' pinned copies
    for (std::size_t fi = 0; fi < flats_.size(); ++fi) {
      Flat& f = flats_[fi];
      if (f.persistent || !f.flat_param->options().sharded) continue;
      // The master can no longer be the shard itself: the shard leaves memory.
      if (f.group >= 0 && !f.master.defined()) {
        CategoryScope cat(Category::OptimizerState);
        const at::Tensor& shard = f.flat_param->shard();
        f.master = shard.to(shard.options().device(device_), /*non_blocking=*/false, /*copy=*/true);
      }
      f.param_slot = slots.size();
      slots.push_back(f.flat_param.get());
      // fp32 compute over fp32 host masters: after each step the shard's values are the master's bytes.
      // (host_master() would ask where the shard is: a model built on the host is not on the device yet.)
      const at::Tensor& shard = f.flat_param->shard();
      const bool twin = !os.param_on_disk() && host_copies_ && f.master_in_host_memory &&
                        f.master.scalar_type() == shard.scalar_type() && f.master.numel() == shard.numel() &&
                        f.master.is_contiguous();
      twins.push_back(twin ? f.master : at::Tensor());
    }
    param_offload_ = std::make_unique<ParamOffload>(os, world_->rank(), std::move(slots), host_copies_.get(), twins);
  }
}

void Engine::offloaded_step(const std::vector<OffloadRule>& group_rules) {
  c10::NoGradGuard ng;
  std::vector<at::Tensor> grads(opt_region_flat_.size());
  std::vector<OffloadRule> rules(opt_region_flat_.size());
  for (std::size_t r = 0; r < opt_region_flat_.size(); ++r) {
    const Flat& f = flats_[opt_region_flat_[r]];
    rules[r] = group_rules.at(static_cast<std::size_t>(f.group));
    const at::Tensor& g = f.master.grad();
    if (g.defined()) grads[r] = g.to(at::kCPU, at::kFloat).contiguous();  // (a device's gradients step on the host)
  }
  opt_offload_->step(grads, rules, [&](std::size_t r, std::int64_t begin, const at::Tensor& values) {
    Flat& f = flats_[opt_region_flat_[r]];
    if (f.param_slot != npos) return param_offload_->store(f.param_slot, begin, values);
    const at::Tensor& dst = plan_.masters_are_shards ? f.flat_param->shard() : f.flat_param->full();
    dst.narrow(0, begin, values.numel()).copy_(values);
  });
}

at::Tensor Engine::master_data(const Flat& f) const {
  if (f.opt_region == npos) return f.master;
  if (f.staged_master.defined()) return f.staged_master;
  return opt_offload_->read(f.opt_region, 0);
}

void Engine::stage_offloaded(torch::optim::Optimizer* opt) {
  const OptimizerRow* row = opt ? find_optimizer_row(*opt) : nullptr;
  for (auto& f : flats_) {
    if (f.param_slot != npos) param_offload_->fetch(f.param_slot);
    if (f.opt_region == npos) continue;
    f.staged_master = opt_offload_->read(f.opt_region, 0);
    const std::int64_t steps = opt_offload_->steps(f.opt_region);
    if (!row || steps == 0) continue;
    const OffloadRule& rule = opt_offload_->regions()[f.opt_region].rule;
    std::map<std::string, at::Tensor> tensors;
    for (int s = 1; s <= rule.state_count(); ++s) tensors[rule.state_name(s)] = opt_offload_->read(f.opt_region, s);
    opt->state()[f.master.unsafeGetTensorImpl()] = row->import_state(tensors, steps);
  }
}

void Engine::unstage_offloaded(torch::optim::Optimizer* opt, bool write_back) {
  const OptimizerRow* row = opt ? find_optimizer_row(*opt) : nullptr;
  for (auto& f : flats_) {
    if (f.opt_region != npos) {
      if (write_back && !opt) {
        opt_offload_->write(f.opt_region, 0, f.staged_master);  // the weights only (load_model)
      } else if (write_back) {
        const OffloadRule& rule = opt_offload_->regions()[f.opt_region].rule;
        opt_offload_->write(f.opt_region, 0, f.staged_master);
        std::int64_t steps = 0;
        auto it = opt->state().find(f.master.unsafeGetTensorImpl());
        if (it != opt->state().end() && row) {
          const OptimizerState st = row->export_state(*it->second);
          for (int s = 1; s <= rule.state_count(); ++s) {
            at::Tensor t;
            for (const auto& [name, tensor] : st.tensors)
              if (name == rule.state_name(s)) t = tensor;
            if (!t.defined()) t = at::zeros({opt_offload_->regions()[f.opt_region].numel}, at::kFloat);
            opt_offload_->write(f.opt_region, s, t);
          }
          // SGD keeps no step count: a momentum buffer means it has stepped.
          steps = st.step ? *st.step : (st.tensors.empty() ? 0 : 1);
        } else {
          for (int s = 1; s <= rule.state_count(); ++s)
            opt_offload_->write(f.opt_region, s, at::zeros({opt_offload_->regions()[f.opt_region].numel}, at::kFloat));
        }
        opt_offload_->set_steps(f.opt_region, steps);
      }
      if (opt) opt->state().erase(f.master.unsafeGetTensorImpl());
      f.staged_master = at::Tensor();
    }
    if (f.param_slot != npos) {
      // Frozen flats have no master to refresh them from: their loaded values go to the file.
      if (write_back && f.group < 0) param_offload_->store(f.param_slot, 0, f.flat_param->shard());
      param_offload_->release(f.param_slot);
    }
  }
}

bool Engine::host_master(const Flat& f) const {
  return host_copies_ && f.master_in_host_memory && f.flat_param->shard().device() == host_copies_->device();
}

const at::Tensor& Engine::pinned_grad(Flat& f) {
  if (!f.host_grad.defined()) {
    CategoryScope cat(Category::Gradients);
    f.host_grad = HostCopies::pinned_empty(f.master.sizes(), f.master.scalar_type(), device_);
  }
  return f.host_grad;
}

void Engine::grad_to_host(Flat& f, const at::Tensor& g) {
  host_copies_->to_host(pinned_grad(f), g);
  f.host_grad_src = g.unsafeGetTensorImpl();
  f.host_grad_src_version = g._version();
}

void Engine::hold_for_host() {
  // After the reducer's launches (the next bucket's collective goes on meanwhile). A device that keeps
  // up has done the oldest copy by now; one that does not stalls the host here rather than hold every
  // reduced gradient of the backward until its end: 4 bytes a parameter at one rank.
  if (!copied_to_host_) return;
  copied_to_host_ = false;
  held_for_host_.push_back(host_copies_->to_host_event());
  while (held_for_host_.size() > static_cast<std::size_t>(std::max(1, spec_.grad_buckets_in_flight))) {
    held_for_host_.front().synchronize();
    held_for_host_.pop_front();
  }
}

void Engine::wait_host_copies() const {
  if (host_copies_) host_copies_->synchronize();
}

void Engine::fetch_params_ahead(std::size_t unit) {
  if (!param_offload_) return;
  for (auto fi : units_.at(unit).flats)
    if (flats_[fi].param_slot != npos) param_offload_->fetch_async(flats_[fi].param_slot);
}

}  // namespace accel::zero
