// The engine around units: gathering a unit's parameters before its forward and backward (with
// prefetch), freeing them after, unshard(), and whole() for callers that need one flat buffer whole.
#include "zero/engine.h"

#include "base/memory.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

namespace accel::zero {

using memory::Category;
using memory::CategoryScope;

// The root unit (0) stays gathered from step to step; the others are gathered around each use.
bool Engine::unit_sharded(std::size_t unit) const { return plan_.params_sharded && unit != 0; }

void Engine::gather(std::size_t unit, bool async) {
  UnitInfo& u = units_[unit];
  if (!u.inflight.empty()) {
    if (!async) wait_gather(unit);
    return;
  }
  for (auto fi : u.flats) {
    Flat& f = flats_[fi];
    sharding::FlatParam& fp = *f.flat_param;
    if (fp.gathered()) continue;
    if (f.param_slot != npos) param_offload_->fetch(f.param_slot);
    {
      CategoryScope cat(Category::Gathered);
      fp.alloc_full();
    }
    if (fp.node_shared()) continue;  // full() points at the group's one buffer: nothing to move
    u.inflight.push_back(fp8_gathered(f) ? gather_fp8_async(f) : gather_->all_gather_async(fp.shard(), fp.full()));
  }
  if (!async) wait_gather(unit);
}

void Engine::wait_gather(std::size_t unit) {
  auto works = std::move(units_[unit].inflight);
  units_[unit].inflight.clear();
  for (auto& w : works) w->wait();
  for (auto fi : units_[unit].flats) {
    dequantize_arrived(flats_[fi]);
    // An offloaded shard has been gathered: until the next gather the file holds it.
    if (flats_[fi].param_slot != npos && !flats_[fi].persistent) param_offload_->release(flats_[fi].param_slot);
  }
}

void Engine::unshard() {
  for (std::size_t u = 0; u < units_.size(); ++u) wait_gather(u);
  // Node-shared parameters become each rank's own copy: the model may be trained or changed on after
  // this (or after the engine is gone) without the ranks writing into one buffer. From here on their
  // flats are persistent, all-gathered in place after each step, as private ones are below.
  if (node_shared()) {
    sync_node_shared();  // every peer's last writes are in
    CategoryScope cat(Category::Gathered);
    for (auto& f : flats_) {
      if (!f.flat_param->node_shared()) continue;
      f.flat_param->make_private();
      f.persistent = true;
    }
  }
  std::vector<comm::WorkPtr> works;
  for (auto& f : flats_) {
    if (f.persistent || !f.flat_param->options().sharded) continue;
    const bool approx = fp8_gathered(f);  // what it holds gathered now is dequantized fp8: exact values instead
    f.persistent = true;
    if (f.param_slot != npos) param_offload_->fetch(f.param_slot);  // stays resident from now on
    if (f.flat_param->gathered() && !approx) continue;
    CategoryScope cat(Category::Gathered);
    f.flat_param->alloc_full();
    works.push_back(gather_->all_gather_async(f.flat_param->shard(), f.flat_param->full()));
  }
  for (auto& w : works) w->wait();
}

at::Tensor Engine::whole(const Flat& f, const at::Tensor& local) const {
  const std::int64_t padded = f.flat_param->layout().padded();
  if (local.numel() == padded) return local.reshape({-1});
  at::Tensor out = at::empty({padded}, local.options());
  gather_->all_gather(local.reshape({-1}).contiguous(), out);
  return out;
}

at::Tensor Engine::whole_values(const Flat& f, Source source) const {
  if (source == Source::Master && f.master.defined()) return whole(f, master_data(f));
  if (f.flat_param->node_shared()) return f.flat_param->node_buffer();  // whole here, gathered or not
  // The gathered buffer only where it holds the exact values now: not while a (prefetch) gather into
  // it is in flight, and not when it holds fp8 bytes dequantized. (The same on every rank: gathering
  // is collective.) Otherwise the shard, gathered into a temporary.
  const bool exact =
      f.flat_param->gathered() && units_[static_cast<std::size_t>(f.unit)].inflight.empty() && !fp8_gathered(f);
  if (exact) return f.flat_param->full();
  if (f.param_slot != npos) {
    const bool was_resident = param_offload_->resident(f.param_slot);
    param_offload_->fetch(f.param_slot);  // (resident: the device waits for a copy still arriving)
    if (!was_resident) {
      at::Tensor out = whole(f, f.flat_param->shard()).clone();
      param_offload_->release(f.param_slot);
      return out;
    }
  }
  return whole(f, f.flat_param->shard());
}

bool Engine::node_shared() const {
  for (const auto& f : flats_)
    if (f.flat_param->node_shared()) return true;
  return false;
}

std::int64_t Engine::node_shared_bytes() const {
  std::int64_t n = 0;
  for (const auto& f : flats_)
    if (f.flat_param->node_shared()) n += static_cast<std::int64_t>(f.flat_param->node_buffer().nbytes());
  return n;
}

std::int64_t Engine::node_shared_grad_bytes() const { return reducer_ ? reducer_->node_shared_grad_bytes() : 0; }

void Engine::reshard_flat(Flat& f) {
  if (f.persistent || !f.flat_param->options().sharded) return;
  f.flat_param->free_full();
  f.fp8_full = at::Tensor();
}

void Engine::reshard(std::size_t unit) {
  wait_gather(unit);
  for (auto fi : units_[unit].flats) reshard_flat(flats_[fi]);
}

void Engine::prefetch(std::size_t unit) {
  if (unit_sharded(unit)) gather(unit, /*async=*/true);
}

void Engine::pre_forward(std::size_t unit) {
  RECORD_USER_SCOPE("accel::pre_forward");         // (profiler scopes: step_bench --profile shows the hooks' share)
  if (cur_order_.empty()) drop_discarded_grads();  // the first unit of a forward
  memory::set_forward_active(true);                // until backward or the step begins
  bool seen = false;
  for (auto u : cur_order_) seen = seen || u == unit;
  if (!seen) cur_order_.push_back(unit);
  units_[unit].call_start = ++tick_;
  if (!unit_sharded(unit)) return;
  gather(unit, /*async=*/false);
  if (spec_.forward_prefetch) {
    // The unit after this one in the last forward's order (and, from disk, the shards of the one after that).
    for (std::size_t i = 0; i + 1 < fwd_order_.size(); ++i)
      if (fwd_order_[i] == unit) {
        prefetch(fwd_order_[i + 1]);
        if (i + 2 < fwd_order_.size() && unit_sharded(fwd_order_[i + 2])) fetch_params_ahead(fwd_order_[i + 2]);
        break;
      }
  }
}

void Engine::post_forward(std::size_t unit, std::vector<at::Tensor>& outputs, bool tracked) {
  RECORD_USER_SCOPE("accel::post_forward");
  const std::int64_t call_end = ++tick_;
  if (!unit_sharded(unit)) return;
  for (auto& t : outputs)
    if (t.defined() && t.requires_grad()) {
      t.register_hook([self = weak_from_this(), unit, call_end](const at::Tensor&) {
        if (auto e = self.lock()) e->pre_backward(unit, call_end);
      });
      if (units_[unit].first_start < 0) units_[unit].first_start = units_[unit].call_start;
    }
  units_[unit].backward_gathered = false;
  // Without tracked outputs backward could not gather first: keep the parameters until post-backward.
  if (spec_.reshard_after_forward && tracked) reshard(unit);
}

void Engine::pre_backward(std::size_t unit, std::int64_t call_end) {
  RECORD_USER_SCOPE("accel::pre_backward");
  begin_backward();
  // Every unit call that began after this one ended has finished its backward: reduce those units
  // now, before this unit gathers (the same point of backward on every rank).
  end_units_started_after(call_end);
  UnitInfo& u = units_[unit];
  if (u.backward_gathered) return;
  u.backward_gathered = true;
  gather(unit, /*async=*/false);
  if (spec_.backward_prefetch) {
    // The unit before this one in forward order runs next in backward.
    const auto& order = cur_order_.empty() ? fwd_order_ : cur_order_;
    for (std::size_t i = 1; i < order.size(); ++i)
      if (order[i] == unit) {
        prefetch(order[i - 1]);
        if (i >= 2 && unit_sharded(order[i - 2])) fetch_params_ahead(order[i - 2]);
        break;
      }
  }
}

}  // namespace accel::zero
