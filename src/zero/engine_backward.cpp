// The engine's gradient window: what each backward does with the gradients autograd accumulates
// (copy into the flat buffer, reduce when a flat is complete, settle at the end of backward), under
// gradient accumulation (no_sync) and when a zero_grad() or a throwing backward discards a window.
#include "base/error.h"
#include "zero/engine.h"

#include "base/log.h"
#include "base/memory.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

namespace accel::zero {
namespace {
// A tensor of t's dtype, device and sizes over one zero element (every stride 0): a master.grad that
// zero_grad() can reset or zero in place (bumping its version) at no memory cost. Not a view, which
// zero_grad's detach_() would refuse.
at::Tensor zeros_placeholder(const at::Tensor& t) {
  c10::NoGradGuard no_grad;
  const at::Tensor one = at::zeros({1}, t.options());
  at::Tensor out = at::empty({0}, t.options());
  out.set_(one.storage(), 0, t.sizes(), std::vector<std::int64_t>(static_cast<std::size_t>(t.dim()), 0));
  return out;
}

// Lets go of f's placeholder master.grad where it is a view of `window` (which is going).
void drop_placeholder_over(Engine::Flat& f, const at::Tensor& window) {
  if (!window.defined() || !f.master_grad_set || !f.master.grad().defined() || !f.master.grad().is_alias_of(window))
    return;
  f.master.mutable_grad() = at::Tensor();
  f.master_grad_set = false;
}
}  // namespace

using memory::Category;
using memory::CategoryScope;

void Engine::begin_backward() {
  memory::set_forward_active(false);
  if (in_backward_) return;
  drop_discarded_grads();
  // (step_in_backward: the last backward's steps are taken; this one's gradients would go nowhere.)
  refuse_after_step_in_backward("a second backward before optimizer.step()");
  in_backward_ = true;
  std::weak_ptr<Engine> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto e = self.lock()) e->finalize_backward();
  });
}

void Engine::on_grad_accumulated(std::size_t fi, std::size_t i) {
  RECORD_USER_SCOPE("accel::grad_accumulated");
  begin_backward();
  Flat& f = flats_[fi];
  if (plan_.params_sharded && sync_ && reducer_index_[fi] != npos && reducer_->launched(reducer_index_[fi]))
    throw accel::LogicError(fmt::format(
        "accel: a gradient of '{}' arrived after its unit's backward had ended and its gradients were reduced; "
        "under sharded parameters a unit's parameters may only be used inside its own forward",
        f.flat_param->names()[i]));
  CategoryScope cat(Category::Gradients);
  open_window(f);
  // The first gradient of a window is copied (no zeroing pass), later ones added; once .grad is the
  // flat view, autograd accumulates in place and this is a no-op.
  f.flat_param->take_grad(i, /*accumulate=*/f.touched[i] != 0);
  f.touched[i] = 1;
  if (f.fired[i]) return;
  f.fired[i] = 1;
  if (++f.fired_count < f.need) return;
  f.ready = true;
  // Every use of the flat's parameters is behind us: reduce (under sharded parameters only at the
  // unit's end of backward, see end_units_started_after), or (NoSync) add to the window's wider sum and
  // let go of the gradient buffer, and free the gathered parameters. (Under NoSync a gradient that still
  // came would open the buffer again, and be added at the end of backward.)
  if (sync_ && reducer_index_[fi] != npos && !plan_.params_sharded) mark_ready(fi);
  if (!sync_ && sums_wider(f)) fold_into_grad_sum(f);
  if (unit_sharded(static_cast<std::size_t>(f.unit))) {
    wait_gather(static_cast<std::size_t>(f.unit));
    reshard_flat(f);
  }
}

// A unit's end of backward, under sharded parameters. A call's output hook (pre_backward) runs when
// autograd executes the node that made that output. Autograd's CPU and per-device queues run ready
// nodes latest-created first (gradient accumulation first of all), and a node only feeds nodes
// created before it, so every node created after that output, in particular every node of a unit
// call that began later, has run by then: those units' gradients are complete. Reducing them here,
// with the gradients their parameters did not get on this rank zero-filled, happens at the same
// point of backward on every rank whatever the data made each rank use. So a rank that waits for a
// reduction (the reducer's back-pressure) never waits for one that a peer launches only after an
// all-gather this rank has not issued yet: no deadlock, and at most grad_buckets_in_flight full
// gradients alive. Units whose end no later hook marks (the first unit, outputs without a hook) end
// in finalize_backward, as the root unit does.
void Engine::end_units_started_after(std::int64_t call_end) {
  if (!plan_.params_sharded || !sync_ || !reducer_) return;
  std::vector<std::size_t> ending;
  for (std::size_t u = 1; u < units_.size(); ++u)
    if (!units_[u].ended && units_[u].first_start > call_end) ending.push_back(u);
  // Latest first: the order their backward ran in.
  std::sort(ending.begin(), ending.end(),
            [&](std::size_t a, std::size_t b) { return units_[a].first_start > units_[b].first_start; });
  for (auto u : ending) end_unit(u);
}

void Engine::end_unit(std::size_t unit) {
  RECORD_USER_SCOPE("accel::end_unit");
  units_[unit].ended = true;
  for (auto fi : units_[unit].flats)
    if (reducer_index_[fi] != npos) mark_complete(fi);
}

void Engine::mark_complete(std::size_t fi) {
  // The regions no gradient reached in this window contribute zeros.
  Flat& f = flats_[fi];
  CategoryScope cat(Category::Gradients);
  open_window(f);
  zero_untouched(f);
  mark_ready(fi);
}

void Engine::mark_ready(std::size_t fi) {
  Flat& f = flats_[fi];
  if (!f.grad_sum.defined()) {
    reducer_->mark_ready(reducer_index_[fi]);
    hold_for_host();
    return;
  }
  add_to_grad_sum(f);
  at::Tensor sum = std::exchange(f.grad_sum, at::Tensor());
  // The placeholder master.grad shares the sum's memory: it goes, so that the sum goes as soon as the
  // reduction needs it no more (the reduced gradient replaces it).
  drop_placeholder_over(f, sum);
  const c10::ScalarType r = reducer_->reduce_dtype(), g = f.flat_param->full().scalar_type();
  if (r == g) {
    // Reduced in the gradients' own dtype (DeepSpeed's communication_data_type): the sum, rounded once,
    // goes back into the buffer, which is reduced as without a sum (a fused bucket's included).
    f.flat_param->grad_full().copy_(sum);
    reducer_->mark_ready(reducer_index_[fi]);
  } else {
    reducer_->mark_ready(reducer_index_[fi], sum.scalar_type() == r ? sum : sum.to(r));
    // The reduction reads the sum: the gradient buffer can go now, except under DDP, whose .grad show
    // the average copied back into it.
    if (plan_.reduce_mode != GradReducer::Mode::AllReduce) f.flat_param->free_grad();
  }
  hold_for_host();
}

c10::ScalarType Engine::sum_dtype() const { return spec_.window_dtype(reducer_->reduce_dtype()); }

bool Engine::sums_wider(const Flat& f) const {
  const std::size_t fi = static_cast<std::size_t>(&f - flats_.data());
  if (!reducer_ || reducer_index_[fi] == npos) return false;
  const c10::ScalarType s = sum_dtype(), g = f.flat_param->full().scalar_type();
  return s != g && c10::promoteTypes(s, g) == s;
}

void Engine::fold_into_grad_sum(Flat& f) {
  add_to_grad_sum(f);
  f.flat_param->free_grad();
  f.grad_live = false;
}

void Engine::add_to_grad_sum(Flat& f) {
  CategoryScope cat(Category::Gradients);
  zero_untouched(f);
  const at::Tensor& g = f.flat_param->grad_full();
  if (f.grad_sum.defined())
    f.grad_sum.add_(g);
  else
    f.grad_sum = g.to(sum_dtype());
}

void Engine::forget_unit_calls() {
  tick_ = 0;
  for (auto& u : units_) {
    u.first_start = -1;
    u.ended = false;
  }
}

void Engine::open_window(Flat& f) {
  // Invariant: while !grad_live no parameter's .grad is a view of grad_full, so nothing autograd
  // just accumulated can be lost here.
  if (f.grad_live) return;
  f.added_on_the_way = false;  // (left over by a plain loss.backward() that threw)
  if (f.grad.defined() && f.grad.is_alias_of(f.flat_param->grad_full())) {
    // ZeRO-1: the pending reduced slice lives in the buffer this window overwrites.
    f.grad = f.grad.clone();
    set_master_grad(f);
  }
  if (!f.flat_param->grad_allocated()) {
    // A node-shared buffer where the reducer has one free (its peers then read this gradient in place).
    const std::size_t ri = reducer_ ? reducer_index_[static_cast<std::size_t>(&f - flats_.data())] : npos;
    f.flat_param->alloc_grad(ri != npos ? reducer_->grad_buffer(ri) : at::Tensor());
  }
  std::fill(f.touched.begin(), f.touched.end(), 0);
  f.grad_live = true;
}

void Engine::zero_untouched(Flat& f) {
  for (std::size_t i = 0; i < f.touched.size(); ++i)
    if (!f.touched[i]) {
      f.flat_param->zero_grad_of(i);
      f.touched[i] = 1;
    }
}

void Engine::set_master_grad(Flat& f, bool defer_sync) {
  if (!f.master.defined() || !f.grad.defined()) return;
  if (f.stepped_in_backward) return;  // master.grad was set when its step was posted (the worker reads it)
  CategoryScope cat(Category::Gradients);
  if (host_master(f)) {
    // Offload to host memory: the pinned buffer, filled on the side stream (already queued when the
    // reduced gradient is the very tensor the reducer handed over, unchanged since).
    const bool queued = f.host_grad_src == f.grad.unsafeGetTensorImpl() && f.host_grad_src_version == f.grad._version();
    if (!queued && !f.grad.is_same(f.host_grad)) grad_to_host(f, f.grad);
    f.host_grad_src = nullptr;
    f.master.mutable_grad() = f.host_grad;
    if (!defer_sync) host_copies_->synchronize_to_host();
    note_master_grad(f);
    return;
  }
  // Not an autograd view (zero_grad detaches grads in place, which views refuse). Host masters
  // (offload to cpu) get theirs copied from the device; a master offloaded to disk is a meta handle
  // whose gradient stays where the reduction left it.
  const c10::Device where = f.master.is_meta() ? f.grad.device() : f.master.device();
  const bool same = f.grad.scalar_type() == f.master.scalar_type() && f.grad.device() == where;
  f.master.mutable_grad() = same ? sharding::storage_alias(f.grad) : f.grad.to(where, f.master.scalar_type());
  note_master_grad(f);
}

void Engine::note_master_grad(Flat& f) {
  f.master_grad_set = true;
  f.master_grad_impl = f.master.grad().unsafeGetTensorImpl();
  f.master_grad_version = f.master.grad()._version();
}

void Engine::drop_discarded_grads() {
  for (auto& f : flats_) {
    if (!f.master_grad_set) continue;
    const at::Tensor& g = f.master.grad();
    if (g.defined() && g.unsafeGetTensorImpl() == f.master_grad_impl && g._version() == f.master_grad_version) continue;
    // optimizer->zero_grad() (to none, or in place) since we set master.grad, without a step:
    // discard what is pending or accumulating.
    if (reducer_) reducer_->release_scratch();
    f.master_grad_set = false;
    f.master.mutable_grad() = at::Tensor();
    f.grad = at::Tensor();
    f.grad_sum = at::Tensor();
    f.grad_live = false;
    f.grad_shown = false;
    f.flat_param->detach_grads();
  }
}

void Engine::abort_backward() {
  // Autograd dropped the end-of-backward callback. Let every collective already issued finish, then
  // forget this backward's gradients, so the next step starts clean (on every rank alike, provided
  // every rank saw the error).
  in_backward_ = false;
  cur_order_.clear();
  forget_unit_calls();
  // step_in_backward: the shards whose steps were already posted keep them (a step cannot be taken
  // back); their gradients go, so that no later step takes them twice.
  try {
    wait_steps_in_backward();
  } catch (...) {  // (the backward's own error is what propagates)
  }
  std::size_t stepped = 0;
  for (auto& f : flats_)
    if (f.stepped_in_backward) {
      ++stepped;
      f.stepped_in_backward = false;
      f.master.mutable_grad() = at::Tensor();
      f.master_grad_set = false;
    }
  if (stepped)
    log::warning(
        fmt::format("accel: a backward that failed had already posted the steps of {} optimizer shard(s) of this "
                    "rank (step_in_backward); those taken are kept",
                    stepped));
  bool drop_window = false;
  if (reducer_ && sync_) {
    // Gradients pending from an earlier micro-step of the window that this backward's reductions are
    // added to as each bucket finishes (ZeRO-2/3 where they lie; a device's masters in host memory
    // there, ZeRO-1's too): decided from the state every rank shares, before the flush.
    const bool adds_on_the_way = std::any_of(flats_.begin(), flats_.end(), [&](const Flat& f) {
      return adds_to_pending(f) || (host_master(f) && f.grad.defined());
    });
    // Issue every remaining bucket, as a finished backward would: a rank that had launched some
    // earlier (its gradients were ready sooner) then never waits for a collective the others skip.
    // The results are thrown away (and no step is taken on them, nor are they added anywhere).
    aborting_backward_ = true;
    try {
      for (auto fi : reduce_order_) mark_complete(fi);
      reducer_->flush();
    } catch (...) {
      reducer_->abandon();
    }
    aborting_backward_ = false;
    // A sum cannot be taken back, and the sums made on the way before the throw are in the window: it
    // goes if any rank made one (its buckets may have finished sooner than a peer's), and every rank
    // agrees on that, so that a throw before any bucket finished keeps the window, as it does without
    // accumulation. The collective is issued where every rank has a pending gradient to add to (the
    // same micro-steps behind it), so by every rank that aborts this backward. As for the flush above,
    // the engine's contract is that every rank sees the error: a backward that throws on one rank
    // alone (an out of memory there, caught by the training loop) has its reductions pair with its
    // peers' finished backward, and here issues one collective more than they do, which fails (or
    // waits) at their next one instead of training on gradients out of step.
    if (adds_on_the_way) {
      const bool added = std::any_of(flats_.begin(), flats_.end(), [](const Flat& f) { return f.added_on_the_way; });
      at::Tensor made = at::full({1}, added ? 1 : 0, at::kInt);
      try {
        if (world_->size() > 1) world_->all_reduce(made, {comm::ReduceOp::Max});
      } catch (...) {  // (the backward's own error is what propagates; the window cannot be vouched for)
        made.fill_(1);
      }
      drop_window = made.item<int>() != 0;
    }
  }
  if (reducer_) reducer_->release_scratch();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (auto& w : units_[u].inflight) {
      try {
        w->wait();
      } catch (...) {
      }
    }
    units_[u].inflight.clear();
    units_[u].backward_gathered = false;
    if (unit_sharded(u))
      for (auto fi : units_[u].flats) reshard_flat(flats_[fi]);
  }
  for (auto& f : flats_) {
    std::fill(f.fired.begin(), f.fired.end(), 0);
    f.fired_count = 0;
    f.ready = false;
    f.added_on_the_way = false;
    f.grad_live = false;
    // (The window goes, as grad_full's part of it does, and so does a placeholder master.grad over it:
    // it would hold the sum's memory until the next sync backward.)
    drop_placeholder_over(f, f.grad_sum);
    f.grad_sum = at::Tensor();
    f.flat_param->detach_grads();
    f.host_grad_src = nullptr;  // a copy queued from a gradient this backward threw away
  }
  wait_host_copies();
  held_for_host_.clear();
  copied_to_host_ = false;
  if (drop_window) {
    for (auto& f : flats_) {
      f.grad = at::Tensor();
      if (f.master_grad_set) f.master.mutable_grad() = at::Tensor();
      f.master_grad_set = false;
    }
    log::warning(
        "accel: a backward that failed had added to the accumulation window's pending gradients as buckets were "
        "reduced (under ZeRO-2/3, or in host memory under optimizer offload from a device), on this rank or "
        "another: the window's gradients are dropped, and the next step has only the backward passes after this "
        "one");
  }
}

void Engine::settle_pending() {
  // A reduced gradient still living in the flat buffer (DDP, ZeRO-1) moves to its own tensor and the
  // window closes: this backward accumulates from zero, so neither a second sync backward nor one
  // that throws can mix into what is pending.
  // (DDP under a wider reduction: the reduced gradient has a tensor of its own already, and grad_full
  // only shows it.)
  for (auto& f : flats_) {
    if (!f.grad.defined()) continue;
    if (f.grad.is_alias_of(f.flat_param->grad_full())) {
      CategoryScope cat(Category::Gradients);
      f.grad = f.grad.clone();
      set_master_grad(f);
    } else if (!f.grad_shown) {
      continue;
    }
    f.flat_param->detach_grads();
    f.grad_live = false;
    f.grad_shown = false;
  }
}

void Engine::backward(const at::Tensor& loss) {
  memory::set_forward_active(false);
  drop_discarded_grads();
  refuse_after_step_in_backward("a second backward before optimizer.step()");  // (before autograd runs)
  settle_pending();
  // Passthrough keeps gradients in .grad, where a throwing backward would leave part of its own:
  // copy what is there first (only when something is: the usual step starts from none).
  std::vector<std::pair<at::Tensor, at::Tensor>> saved;  // (parameter, its gradient before)
  if (plan_.passthrough)
    for (auto& f : flats_)
      for (const auto& p : f.flat_param->params())
        if (p.grad().defined()) saved.emplace_back(p, p.grad().clone());
  // Unreduced gradients of earlier micro-steps of this window (NoSync) that the optimizer steps on: a
  // backward that fails may have added to them already, so they go with it.
  const bool window_before = !plan_.passthrough && std::any_of(flats_.begin(), flats_.end(), [](const Flat& f) {
    return f.group >= 0 && (f.grad_live || f.grad_sum.defined());
  });
  std::size_t before = finalize_count_;
  try {
    loss.backward();
  } catch (...) {
    if (plan_.passthrough) {
      for (auto& f : flats_)
        for (const auto& p : f.flat_param->params()) p.mutable_grad() = at::Tensor();
      for (auto& [p, g] : saved) p.mutable_grad() = g;
    }
    abort_backward();
    if (window_before)
      log::warning(
          "accel: a backward that failed inside an accumulation window dropped the gradients of the micro-steps "
          "before it, which were not reduced yet (it may have added to them): the next step has only the "
          "backward passes after this one");
    throw;
  }
  // No parameter of this rank received a gradient, so no hook queued the end-of-backward work.
  if (finalize_count_ == before) finalize_backward();
}

void Engine::finalize_backward() {
  RECORD_USER_SCOPE("accel::finalize_backward");
  in_backward_ = false;
  ++finalize_count_;
  if (!cur_order_.empty()) {
    fwd_order_ = cur_order_;
    cur_order_.clear();
  }
  forget_unit_calls();
  for (auto& u : units_) u.backward_gathered = false;
  if (plan_.passthrough) return;
  if (sync_) {
    // Flats still waiting are launched now, in the same order on every rank.
    for (auto fi : reduce_order_) mark_complete(fi);
    std::vector<at::Tensor> reduced;
    {
      CategoryScope cat(Category::Gradients);
      reduced = reducer_->flush();
    }
    for (std::size_t r = 0; r < reduce_order_.size(); ++r) {
      Flat& f = flats_[reduce_order_[r]];
      at::Tensor g = reduced[r];
      if (!plan_.masters_are_shards) {
        // DDP: .grad shows the averaged gradient, and the window stays open until the step: a
        // second loss.backward() adds its local gradients and averages again, which sums the
        // averages. (engine->backward() settles the first average into its own tensor first.)
        // Under a wider reduction .grad shows the average rounded into grad_full: what is pending is in
        // this reduction already unless engine->backward() settled it first.
        if (f.grad.defined() && !f.grad.is_alias_of(g) && !f.grad_shown) g.add_(f.grad);
        f.grad = g;
        f.flat_param->attach_grads();
        f.grad_shown = !g.is_alias_of(f.flat_param->grad_full());
      } else {
        // The reduced shard is the pending gradient until the step, and the window closes: a second
        // sync backward before the step reduces into a fresh window and adds to it. ZeRO-2/3 give
        // the full buffer back; ZeRO-1 keeps it (and so does a group of one): g is their buffer's own slice
        // (not where the window was summed wider, or a group of one converted it to the reduce dtype).
        // Taken on its way: to the host (offload: the pinned copy is the gradient), or added to the
        // gradient pending from an earlier micro-step (which is then the sum).
        if (!g.defined()) g = host_master(f) ? f.host_grad : f.grad;
        // (A pending gradient that was not added to on the way: the second sync backward before a
        // step of a master that is not a device's in host memory, or ZeRO-1's.)
        if (!f.grad.defined())
          f.grad = g;
        else if (!g.is_same(f.grad) && !f.added_on_the_way)
          f.grad.add_(f.grad.device() == g.device() ? g : g.to(f.grad.device()));
        f.added_on_the_way = false;
        if (g.is_alias_of(f.flat_param->grad_full()))
          f.flat_param->detach_grads();
        else
          f.flat_param->free_grad();
        f.grad_live = false;
      }
      set_master_grad(f, /*defer_sync=*/true);
      // A device's master in host memory: the pinned copy is the pending gradient (the next
      // micro-step's is added to it there), also where the reducer keeps its output (ZeRO-1).
      if (plan_.masters_are_shards && host_master(f)) f.grad = f.host_grad;
    }
    if (!more_micro_steps_) reducer_->release_scratch();  // (the window is over)
    // The host reads the offloaded masters' gradients from here on (clipping, unscaling, the step);
    // parameter shards on their way to the device go on.
    if (host_copies_) host_copies_->synchronize_to_host();
    held_for_host_.clear();
    copied_to_host_ = false;
    // (step_in_backward: the masters are the optimizer's again. A step that failed fails the
    // optimizer's step, as a step that throws there would: the reductions are all done and agreed.)
    try {
      wait_steps_in_backward();
    } catch (...) {
      step_error_ = std::current_exception();
    }
  } else {
    // Accumulating: keep the parameters' .grad on their flat views so the next backward adds in place.
    // Where the reduce dtype is wider, the window lives in grad_sum (a flat that was ready folded in
    // on the way) and the next backward starts grad_full afresh.
    for (auto& f : flats_) {
      if (f.grad_live && sums_wider(f)) fold_into_grad_sum(f);
      if (f.grad_live) {
        zero_untouched(f);
        f.flat_param->attach_grads();
      } else if (!f.grad_sum.defined()) {
        continue;
      }
      // A placeholder master.grad (this rank's unreduced region), so that optimizer->zero_grad()
      // during accumulation is noticed and discards the window, as it would in PyTorch. A device's
      // master in host memory cannot take the device's buffer: its pinned gradient, zero-filled (no
      // copy into it is in flight: the last sync backward waited for them), where the window's sum
      // arrives at the sync backward.
      // (A master.grad we did not set is what a zero_grad(set_to_none=false) after the last step left:
      // the placeholder takes its place, or a zero_grad in this window would go unnoticed.)
      if (!f.master.defined() || f.grad.defined() || (f.master.grad().defined() && f.master_grad_set)) continue;
      const at::Tensor& window = f.grad_sum.defined() ? f.grad_sum : f.flat_param->grad_full();
      if (host_master(f)) {
        f.master.mutable_grad() = pinned_grad(f).zero_();
        note_master_grad(f);
      } else if (f.master.scalar_type() == window.scalar_type() &&
                 (f.master.is_meta() || f.master.device() == window.device())) {
        auto [b, e] = f.flat_param->layout().shard_range(f.flat_param->options().rank);
        f.master.mutable_grad() =
            sharding::storage_alias(plan_.masters_are_shards ? window.narrow(0, b, e - b) : window);
        note_master_grad(f);
      } else {
        // A master of another dtype than the window (fp32 masters over a bf16 window named in
        // grad_accum_dtype, an fp32 window over bf16 or fp64 masters, masters on disk): a stand-in that
        // holds no memory, so that the discard is noticed all the same.
        f.master.mutable_grad() = zeros_placeholder(f.master);
        note_master_grad(f);
      }
    }
  }
  for (auto& f : flats_) {
    std::fill(f.fired.begin(), f.fired.end(), 0);
    f.fired_count = 0;
    f.ready = false;
  }
  for (std::size_t u = 1; u < units_.size(); ++u)
    if (unit_sharded(u)) reshard(u);
}

}  // namespace accel::zero
