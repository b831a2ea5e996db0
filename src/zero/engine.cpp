// The engine: building units and flat parameters from a model, the hooks around forward and
// backward, and the step's bracket. The reduction itself is GradReducer's; the optimizer wrapper is
// in sharded_optimizer.cpp.
#include "zero/engine.h"

#include "base/env.h"
#include "base/memory.h"
#include "mixed_precision/fp8.h"
#include "sharding/sharded_init.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <unordered_map>

namespace accel::zero {
namespace {

constexpr std::size_t npos = static_cast<std::size_t>(-1);
using memory::Category;
using memory::CategoryScope;

class UnitHooksImpl final : public sharding::UnitHooks {
 public:
  UnitHooksImpl(std::weak_ptr<Engine> e, std::size_t unit) : e_(std::move(e)), unit_(unit) {}
  void pre_forward() override {
    if (auto e = e_.lock()) e->pre_forward(unit_);
  }
  void post_forward(std::vector<at::Tensor>& outs) override {
    if (auto e = e_.lock()) e->post_forward(unit_, outs, true);
  }
  void post_forward_untracked() override {
    std::vector<at::Tensor> none;
    if (auto e = e_.lock()) e->post_forward(unit_, none, false);
  }

 private:
  std::weak_ptr<Engine> e_;
  std::size_t unit_;
};

class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(Engine* e, std::size_t flat, std::size_t param) : e_(e), flat_(flat), param_(param) {}
  void operator()(const torch::autograd::Variable&) override { e_->on_grad_accumulated(flat_, param_); }

 private:
  Engine* e_;
  std::size_t flat_, param_;
};

bool type_matches(const std::string& module_name, const std::string& wanted) {
  if (module_name == wanted) return true;
  return module_name.size() > wanted.size() + 2 &&
         module_name.compare(module_name.size() - wanted.size() - 2, std::string::npos, "::" + wanted) == 0;
}

std::int64_t subtree_numel(torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model, const torch::optim::Optimizer* optimizer, ShardingSpec spec,
               std::shared_ptr<comm::Communicator> world)
    : spec_(std::move(spec)), world_(std::move(world)), model_(std::move(model)) {
  spec_.validate();
  if (spec_.hybrid()) {
    shard_ = world_->node_local();
    replicate_ = world_->cross_node();
  } else {
    shard_ = world_;
  }
  build(*model_, optimizer);
  // Sharded parameters and gradients are freed and re-allocated every step: keep those pages warm.
  if ((params_sharded() || (spec_.shards_gradients() && shard_->size() > 1)) && env::get_int("ACCEL_CPU_MALLOC_CACHE"))
    memory::keep_freed_cpu_memory();
}

Engine::~Engine() { uninstall_hooks(); }

// ---------------------------------------------------------------------------------------------------
// Building: units from the marks and the wrap policy, then one FlatParam per (unit, param group,
// requires_grad), in module order.

void Engine::build(torch::nn::Module& model, const torch::optim::Optimizer* optimizer) {
  std::unordered_map<const void*, int> group_of;
  if (optimizer)
    for (std::size_t g = 0; g < optimizer->param_groups().size(); ++g)
      for (const auto& p : optimizer->param_groups()[g].params()) group_of[p.unsafeGetTensorImpl()] = static_cast<int>(g);

  units_.push_back(UnitInfo{"", &model, {}, {}, false});
  struct Owned {
    at::Tensor param;
    std::string name;
    std::size_t unit;
  };
  std::vector<Owned> owned;
  std::unordered_map<const void*, std::size_t> seen;  // TensorImpl -> index into owned

  const WrapPolicy& wrap = spec_.wrap;
  std::function<void(torch::nn::Module&, const std::string&, std::size_t)> walk =
      [&](torch::nn::Module& m, const std::string& prefix, std::size_t unit) {
        if (&m != &model && wrap.kind != WrapPolicy::Kind::None) {
          if (auto slot = sharding::find_unit(&m)) {
            bool take = wrap.kind == WrapPolicy::Kind::Marked;
            if (wrap.kind == WrapPolicy::Kind::TypeName)
              for (const auto& t : wrap.type_names) take = take || type_matches(m.name(), t);
            if (wrap.kind == WrapPolicy::Kind::Size) take = subtree_numel(m) >= wrap.min_num_params;
            if (take) {
              std::string name = prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1);
              units_.push_back(UnitInfo{name, &m, {}, {}, false});
              slots_.push_back(slot);
              unit = units_.size() - 1;
            }
          }
        }
        for (const auto& kv : m.named_parameters(/*recurse=*/false)) {
          const at::Tensor& p = kv.value();
          std::string name = prefix + kv.key();
          auto it = seen.find(p.unsafeGetTensorImpl());
          if (it != seen.end()) {
            const Owned& first = owned[it->second];
            if (first.unit != unit)
              throw std::invalid_argument(
                  "accel: parameter '" + name + "' is the same tensor as '" + first.name + "', but they belong to " +
                  "different units ('" + (units_[first.unit].name.empty() ? "<root>" : units_[first.unit].name) +
                  "' and '" + (units_[unit].name.empty() ? "<root>" : units_[unit].name) +
                  "'); a shared (tied) parameter must stay inside one unit: unmark one of them or move the "
                  "shared module into their common parent");
            continue;  // tied inside one unit: flattened once
          }
          seen[p.unsafeGetTensorImpl()] = owned.size();
          owned.push_back({p, name, unit});
        }
        for (const auto& kv : m.named_children()) walk(*kv.value(), prefix + kv.key() + ".", unit);
      };
  walk(model, "", 0);

  // Every rank starts from rank 0's weights (as DDP does), before anything is sharded.
  {
    c10::NoGradGuard ng;
    std::vector<comm::WorkPtr> works;
    for (auto& o : owned)
      if (o.param.numel() > 0 && o.param.is_contiguous() && !sharding::is_presharded(o.param))  // (those were sent when built)
        works.push_back(world_->broadcast_async(o.param, {0}));
    for (auto& w : works) w->wait();
  }

  // Group by (unit, group, requires_grad, dtype, device), keeping module order inside each.
  std::map<std::tuple<std::size_t, int, bool, int, std::string>, std::vector<std::size_t>> keys;
  for (std::size_t i = 0; i < owned.size(); ++i) {
    const at::Tensor& p = owned[i].param;
    int g = -1;
    if (auto it = group_of.find(p.unsafeGetTensorImpl()); it != group_of.end()) g = it->second;
    if (!p.requires_grad()) g = -1;
    keys[{owned[i].unit, g, p.requires_grad(), static_cast<int>(p.scalar_type()), p.device().str()}].push_back(i);
  }
  const bool sharded_params = params_sharded();
  // A world of one rank with nothing to convert: the optimizer steps the user's own parameters
  // (views into the flat buffers) on the gradients autograd gives them; no hooks, no copies.
  passthrough_ = world_->size() == 1;
  for (auto& [key, members] : keys) {
    c10::ScalarType dt = owned[members[0]].param.scalar_type();
    passthrough_ = passthrough_ && spec_.param_dtype.value_or(dt) == dt && spec_.master_dtype.value_or(dt) == dt;
  }
  for (auto& [key, members] : keys) {
    auto [unit, group, requires_grad, dtype, device] = key;
    std::vector<at::Tensor> ps;
    std::vector<std::string> names;
    for (auto i : members) {
      ps.push_back(owned[i].param);
      names.push_back(owned[i].name);
    }
    // A unit built under sharded construction gets its values back now, one unit at a time (the
    // keys are in the same order on every rank, so these all-gathers are too).
    for (const auto& p : ps) sharding::materialize(p);
    sharding::FlatParam::Options o;
    o.rank = shard_->rank();
    o.world = shard_->size();
    o.dtype = spec_.param_dtype.value_or(ps[0].scalar_type());
    o.align = spec_.align_elements;
    o.sharded = sharded_params;
    std::string fname = (units_[unit].name.empty() ? "<root>" : units_[unit].name) + "[group " + std::to_string(group) +
                        (requires_grad ? "" : ", frozen") + ", " + c10::toString(static_cast<c10::ScalarType>(dtype)) +
                        (device == "cpu" ? "" : ", " + device) + "]";
    Flat f;
    // A master in another dtype than the compute buffer starts from the original values, not from
    // their rounded copy.
    at::Tensor original;
    const c10::ScalarType mdt = spec_.master_dtype.value_or(ps[0].scalar_type());
    if (group >= 0 && !passthrough_ && mdt != o.dtype) {
      CategoryScope cat(Category::OptimizerState);
      c10::NoGradGuard ng;
      std::vector<std::int64_t> numels;
      for (const auto& p : ps) numels.push_back(p.numel());
      sharding::ShardLayout layout(numels, o.world, o.align);  // the FlatParam's own
      at::Tensor flat = at::zeros({layout.padded()}, ps[0].options().dtype(mdt));
      for (std::size_t i = 0; i < ps.size(); ++i) flat.narrow(0, layout.offset(i), ps[i].numel()).copy_(ps[i].reshape({-1}));
      auto [b, e] = layout.shard_range(o.rank);
      original = spec_.shards_optimizer() ? flat.narrow(0, b, e - b).clone() : flat;
    }
    {
      CategoryScope cat(Category::Parameters);
      f.flat = std::make_unique<sharding::FlatParam>(fname, std::move(ps), std::move(names), o);
    }
    f.master = original;
    f.unit = static_cast<int>(unit);
    f.group = group;
    f.persistent = sharded_params && unit == 0;
    f.fired.assign(f.flat->params().size(), 0);
    f.touched.assign(f.flat->params().size(), 0);
    for (const auto& p : f.flat->params()) f.need += p.requires_grad() ? 1 : 0;
    units_[unit].flats.push_back(flats_.size());
    flats_.push_back(std::move(f));
  }

  // What the optimizer steps, per user param group: the user's parameters (passthrough), or master
  // copies (the flat buffer or this rank's shard of it) in the master dtype, aliases of the compute
  // buffer when the dtypes agree.
  group_params_.assign(optimizer ? optimizer->param_groups().size() : 0, {});
  if (passthrough_) {
    for (std::size_t g = 0; g < group_params_.size(); ++g)
      for (const auto& p : optimizer->param_groups()[g].params())
        if (p.requires_grad()) group_params_[g].push_back(p);
  }
  for (auto& f : flats_) {
    if (f.group < 0 || passthrough_) continue;
    if (!f.master.defined()) f.master = (spec_.shards_optimizer() ? f.flat->shard() : f.flat->full()).alias();
    f.master.set_requires_grad(false);
    group_params_[f.group].push_back(f.master);
  }

  // Parameter all-gathers go over a communicator of their own: a rank whose backward leaves a
  // parameter unused (data-dependent branches) launches its reduce-scatters later than the others,
  // and on one communicator that would reorder them against the backward all-gathers.
  gather_ = sharded_params ? shard_->split(0, shard_->rank()) : shard_;

  // Root flats under ZeRO-3 stay gathered from step to step.
  for (auto& f : flats_)
    if (f.persistent) {
      CategoryScope cat(Category::Gathered);
      f.flat->alloc_full();
      gather_->all_gather(f.flat->shard(), f.flat->full());
    }
  quantize_fp8_shards();

  // Reduction order: reverse module order (the order backward usually finishes units in).
  reducer_index_.assign(flats_.size(), npos);
  std::vector<sharding::FlatParam*> order;
  for (std::size_t i = flats_.size(); i-- > 0;)
    if (flats_[i].flat->requires_grad()) {
      reducer_index_[i] = order.size();
      reduce_order_.push_back(i);
      order.push_back(flats_[i].flat.get());
    }
  GradReducer::Mode mode = !spec_.shards_optimizer()   ? GradReducer::Mode::AllReduce
                           : !spec_.shards_gradients() ? GradReducer::Mode::ReduceScatterInPlace
                                                       : GradReducer::Mode::ReduceScatter;
  c10::ScalarType rdt = flats_.empty() ? c10::kFloat : flats_[0].flat->full().scalar_type();
  for (const auto& f : flats_) rdt = c10::promoteTypes(rdt, f.flat->full().scalar_type());  // never narrower
  rdt = spec_.reduce_dtype.value_or(rdt);
  if (passthrough_) return;  // nothing to reduce
  CategoryScope cat(Category::Gradients);  // all-reduce buckets allocate their gradient buffers here
  reducer_ = std::make_unique<GradReducer>(std::move(order), mode, rdt, shard_, replicate_, spec_.bucket_bytes,
                                           /*may_wait_in_backward=*/!sharded_params);
}

void Engine::install_hooks() {
  if (hooks_installed_) return;
  hooks_installed_ = true;
  for (std::size_t fi = 0; fi < flats_.size() && !passthrough_; ++fi) {
    const auto& ps = flats_[fi].flat->params();
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (ps[i].requires_grad())
      {
        auto hook = std::make_unique<GradReadyHook>(this, fi, i);
        grad_hooks_.emplace_back(ps[i], hook.get());
        torch::autograd::impl::set_post_acc_grad_hooks(ps[i], std::move(hook));
      }
  }
  for (std::size_t u = 1; u < units_.size(); ++u) {
    slots_[u - 1]->hooks = std::make_shared<UnitHooksImpl>(weak_from_this(), u);
    unit_hooks_.push_back(slots_[u - 1]->hooks.get());
  }
}

void Engine::uninstall_hooks() {
  // Only hooks that are still this engine's: the model may have been prepared again since.
  for (auto& [p, ours] : grad_hooks_) {
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(p);
    if (hook.get() == ours) hook = nullptr;
  }
  grad_hooks_.clear();
  for (std::size_t u = 0; u < slots_.size(); ++u)
    if (u < unit_hooks_.size() && slots_[u]->hooks.get() == unit_hooks_[u]) slots_[u]->hooks.reset();
  unit_hooks_.clear();
}

// ---------------------------------------------------------------------------------------------------
// Forward and backward around units.

// A group of one rank has nothing to shard: its parameters stay whole, as under NO_SHARD.
bool Engine::params_sharded() const { return spec_.shards_parameters() && shard_->size() > 1; }
bool Engine::unit_sharded(std::size_t unit) const { return params_sharded() && unit != 0; }

void Engine::gather(std::size_t unit, bool async) {
  UnitInfo& u = units_[unit];
  if (!u.inflight.empty()) {
    if (!async) wait_gather(unit);
    return;
  }
  for (auto fi : u.flats) {
    Flat& f = flats_[fi];
    sharding::FlatParam& fp = *f.flat;
    if (fp.gathered()) continue;
    {
      CategoryScope cat(Category::Gathered);
      fp.alloc_full();
      if (fp8_gathered(f)) f.fp8_full = at::empty({fp.layout().padded()}, f.fp8_shard.options());
    }
    if (fp8_gathered(f))  // 1 byte per element; dequantized into the compute buffer on arrival
      u.inflight.push_back(gather_->all_gather_async(f.fp8_shard, f.fp8_full));
    else
      u.inflight.push_back(gather_->all_gather_async(fp.shard(), fp.full()));
  }
  if (!async) wait_gather(unit);
}

void Engine::wait_gather(std::size_t unit) {
  auto works = std::move(units_[unit].inflight);
  units_[unit].inflight.clear();
  for (auto& w : works) w->wait();
  for (auto fi : units_[unit].flats) {
    Flat& f = flats_[fi];
    if (!f.fp8_full.defined()) continue;
    c10::NoGradGuard ng;
    const sharding::FlatParam& fp = *f.flat;
    for (std::size_t i = 0; i < fp.params().size(); ++i) {
      const std::int64_t off = fp.layout().offset(i), n = fp.params()[i].numel();
      fp.full().narrow(0, off, n).copy_(
          mixed_precision::dequantize(f.fp8_full.narrow(0, off, n), f.fp8_scales[static_cast<std::int64_t>(i)], fp.full().scalar_type()));
    }
    f.fp8_full = at::Tensor();
  }
}

bool Engine::fp8_gathered(const Flat& f) const {
  // (options().sharded: parameters sharded over a group of more than one rank.)
  return spec_.fp8_all_gather && f.flat->options().sharded && !f.persistent && f.flat->shard().is_floating_point();
}

void Engine::quantize_fp8_shards() {
  // Per parameter: this rank's piece of it (the intersection of its region with the shard), from
  // the master where there is one (fp32), else from the compute shard.
  struct Piece {
    Flat* f;
    std::size_t param;
    std::int64_t b, lo, hi;  // flat-buffer elements: this rank's shard starts at b; [lo, hi) inside it
  };
  std::vector<Piece> pieces;
  std::vector<at::Tensor> values;
  for (auto& f : flats_) {
    if (!fp8_gathered(f)) continue;
    const auto& layout = f.flat->layout();
    auto [b, e] = layout.shard_range(f.flat->options().rank);
    const at::Tensor& src = f.master.defined() ? f.master : f.flat->shard();
    for (std::size_t i = 0; i < f.flat->params().size(); ++i) {
      const std::int64_t off = layout.offset(i), lo = std::min(std::max(off, b), e),
                         hi = std::max(lo, std::min(off + f.flat->params()[i].numel(), e));
      pieces.push_back({&f, i, b, lo, hi});
      values.push_back(src.narrow(0, lo - b, hi - lo));
    }
  }
  if (pieces.empty()) return;  // (the same on every rank: every rank has the same flats)
  c10::NoGradGuard ng;
  using mixed_precision::Fp8Format;
  // One all-reduce of every parameter's amax: the scales of whole parameters, the same on every rank.
  at::Tensor scales = mixed_precision::agree_scales(mixed_precision::local_amaxes(values), *shard_, Fp8Format::E4M3);
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    const Piece& pc = pieces[j];
    Flat& f = *pc.f;
    if (pc.param == 0) {
      CategoryScope cat(Category::Parameters);
      if (!f.fp8_shard.defined())
        f.fp8_shard = at::zeros({f.flat->shard().numel()}, f.flat->shard().options().dtype(mixed_precision::fp8_dtype(Fp8Format::E4M3)));
      f.fp8_scales = scales.narrow(0, static_cast<std::int64_t>(j), static_cast<std::int64_t>(f.flat->params().size())).clone();
    }
    if (pc.hi > pc.lo)
      f.fp8_shard.narrow(0, pc.lo - pc.b, pc.hi - pc.lo)
          .copy_(mixed_precision::quantize(values[j], scales[static_cast<std::int64_t>(j)], Fp8Format::E4M3));
  }
}

void Engine::unshard() {
  for (std::size_t u = 0; u < units_.size(); ++u) wait_gather(u);
  std::vector<comm::WorkPtr> works;
  for (auto& f : flats_) {
    if (f.persistent || !f.flat->options().sharded) continue;
    const bool approx = fp8_gathered(f);  // what it holds gathered now is dequantized fp8: exact values instead
    f.persistent = true;
    if (f.flat->gathered() && !approx) continue;
    CategoryScope cat(Category::Gathered);
    f.flat->alloc_full();
    works.push_back(gather_->all_gather_async(f.flat->shard(), f.flat->full()));
  }
  for (auto& w : works) w->wait();
}

void Engine::reshard_flat(Flat& f) {
  if (f.persistent || !f.flat->options().sharded) return;
  f.flat->free_full();
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
  if (cur_order_.empty()) drop_discarded_grads();  // the first unit of a forward
  bool seen = false;
  for (auto u : cur_order_) seen = seen || u == unit;
  if (!seen) cur_order_.push_back(unit);
  if (!unit_sharded(unit)) return;
  gather(unit, /*async=*/false);
  if (spec_.forward_prefetch) {
    // The unit after this one in the last forward's order.
    for (std::size_t i = 0; i + 1 < fwd_order_.size(); ++i)
      if (fwd_order_[i] == unit) {
        prefetch(fwd_order_[i + 1]);
        break;
      }
  }
}

void Engine::post_forward(std::size_t unit, std::vector<at::Tensor>& outputs, bool tracked) {
  if (!unit_sharded(unit)) return;
  for (auto& t : outputs)
    if (t.defined() && t.requires_grad())
      t.register_hook([self = weak_from_this(), unit](const at::Tensor&) {
        if (auto e = self.lock()) e->pre_backward(unit);
      });
  units_[unit].backward_gathered = false;
  // Without tracked outputs backward could not gather first: keep the parameters until post-backward.
  if (spec_.reshard_after_forward && tracked) reshard(unit);
}

void Engine::pre_backward(std::size_t unit) {
  begin_backward();
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
        break;
      }
  }
}

void Engine::begin_backward() {
  if (in_backward_) return;
  in_backward_ = true;
  drop_discarded_grads();
  std::weak_ptr<Engine> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto e = self.lock()) e->finalize_backward();
  });
}

void Engine::on_grad_accumulated(std::size_t fi, std::size_t i) {
  begin_backward();
  Flat& f = flats_[fi];
  CategoryScope cat(Category::Gradients);
  open_window(f);
  // The first gradient of a window is copied (no zeroing pass), later ones added; once .grad is the
  // flat view, autograd accumulates in place and this is a no-op.
  f.flat->take_grad(i, /*accumulate=*/f.touched[i] != 0);
  f.touched[i] = 1;
  if (f.fired[i]) return;
  f.fired[i] = 1;
  if (++f.fired_count < f.need) return;
  f.ready = true;
  // Every use of the flat's parameters is behind us: reduce, and free the gathered parameters.
  if (sync_ && reducer_index_[fi] != npos) reducer_->mark_ready(reducer_index_[fi]);
  if (unit_sharded(static_cast<std::size_t>(f.unit))) {
    wait_gather(static_cast<std::size_t>(f.unit));
    reshard_flat(f);
  }
}

void Engine::open_window(Flat& f) {
  // Invariant: while !grad_live no parameter's .grad is a view of grad_full, so nothing autograd
  // just accumulated can be lost here.
  if (f.grad_live) return;
  if (f.grad.defined() && f.grad.is_alias_of(f.flat->grad_full())) {
    // ZeRO-1: the pending reduced slice lives in the buffer this window overwrites.
    f.grad = f.grad.clone();
    set_master_grad(f);
  }
  if (!f.flat->grad_allocated()) f.flat->alloc_grad();
  std::fill(f.touched.begin(), f.touched.end(), 0);
  f.grad_live = true;
}

void Engine::zero_untouched(Flat& f) {
  for (std::size_t i = 0; i < f.touched.size(); ++i)
    if (!f.touched[i]) {
      f.flat->zero_grad_of(i);
      f.touched[i] = 1;
    }
}

void Engine::set_master_grad(Flat& f) {
  if (!f.master.defined() || !f.grad.defined()) return;
  CategoryScope cat(Category::Gradients);
  // Not an autograd view (zero_grad detaches grads in place, which views refuse).
  f.master.mutable_grad() = f.grad.scalar_type() == f.master.scalar_type() ? sharding::storage_alias(f.grad)
                                                                           : f.grad.to(f.master.scalar_type());
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
    f.master_grad_set = false;
    f.master.mutable_grad() = at::Tensor();
    f.grad = at::Tensor();
    f.grad_live = false;
    f.flat->detach_grads();
  }
}

void Engine::abort_backward() {
  // Autograd dropped the end-of-backward callback. Let every collective already issued finish, then
  // forget this backward's gradients, so the next step starts clean (on every rank alike, provided
  // every rank saw the error).
  in_backward_ = false;
  cur_order_.clear();
  if (reducer_ && sync_) {
    // Issue every remaining bucket, as a finished backward would: a rank that had launched some
    // earlier (its gradients were ready sooner) then never waits for a collective the others skip.
    // The results are thrown away.
    try {
      for (auto fi : reduce_order_) {
        open_window(flats_[fi]);
        zero_untouched(flats_[fi]);
        reducer_->mark_ready(reducer_index_[fi]);
      }
      reducer_->flush();
    } catch (...) {
      reducer_->abandon();
    }
  }
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
    f.grad_live = false;
    f.flat->detach_grads();
  }
}

void Engine::settle_pending() {
  // A reduced gradient still living in the flat buffer (DDP, ZeRO-1) moves to its own tensor and the
  // window closes: this backward accumulates from zero, so neither a second sync backward nor one
  // that throws can mix into what is pending.
  for (auto& f : flats_) {
    if (!f.grad.defined() || !f.grad.is_alias_of(f.flat->grad_full())) continue;
    CategoryScope cat(Category::Gradients);
    f.grad = f.grad.clone();
    set_master_grad(f);
    f.flat->detach_grads();
    f.grad_live = false;
  }
}

void Engine::backward(const at::Tensor& loss) {
  drop_discarded_grads();
  settle_pending();
  // Passthrough keeps gradients in .grad, where a throwing backward would leave part of its own:
  // copy what is there first (only when something is: the usual step starts from none).
  std::vector<std::pair<at::Tensor, at::Tensor>> saved;  // (parameter, its gradient before)
  if (passthrough_)
    for (auto& f : flats_)
      for (const auto& p : f.flat->params())
        if (p.grad().defined()) saved.emplace_back(p, p.grad().clone());
  std::size_t before = finalize_count_;
  try {
    loss.backward();
  } catch (...) {
    if (passthrough_) {
      for (auto& f : flats_)
        for (const auto& p : f.flat->params()) p.mutable_grad() = at::Tensor();
      for (auto& [p, g] : saved) p.mutable_grad() = g;
    }
    abort_backward();
    throw;
  }
  // No parameter of this rank received a gradient, so no hook queued the end-of-backward work.
  if (finalize_count_ == before) finalize_backward();
}

void Engine::finalize_backward() {
  in_backward_ = false;
  ++finalize_count_;
  if (!cur_order_.empty()) {
    fwd_order_ = cur_order_;
    cur_order_.clear();
  }
  for (auto& u : units_) u.backward_gathered = false;
  if (passthrough_) return;
  if (sync_) {
    // Parameters that got no gradient on this rank in this window contribute zeros; flats still
    // waiting are launched now, in the same order on every rank.
    for (auto fi : reduce_order_) {
      Flat& f = flats_[fi];
      CategoryScope cat(Category::Gradients);
      open_window(f);
      zero_untouched(f);
      reducer_->mark_ready(reducer_index_[fi]);
    }
    std::vector<at::Tensor> reduced;
    {
      CategoryScope cat(Category::Gradients);
      reduced = reducer_->flush();
    }
    for (std::size_t r = 0; r < reduce_order_.size(); ++r) {
      Flat& f = flats_[reduce_order_[r]];
      at::Tensor g = reduced[r];
      if (!spec_.shards_optimizer()) {
        // DDP: .grad shows the averaged gradient, and the window stays open until the step: a
        // second loss.backward() adds its local gradients and averages again, which sums the
        // averages. (engine->backward() settles the first average into its own tensor first.)
        if (f.grad.defined() && !f.grad.is_alias_of(g)) g.add_(f.grad);
        f.grad = g;
        f.flat->attach_grads();
      } else {
        // The reduced shard is the pending gradient until the step, and the window closes: a second
        // sync backward before the step reduces into a fresh window and adds to it. ZeRO-2/3 give
        // the full buffer back; ZeRO-1 (and a group of one) keep it: g is their buffer's own slice.
        if (f.grad.defined())
          f.grad.add_(g);
        else
          f.grad = g;
        if (g.is_alias_of(f.flat->grad_full()))
          f.flat->detach_grads();
        else
          f.flat->free_grad();
        f.grad_live = false;
      }
      set_master_grad(f);
    }
  } else {
    // Accumulating: keep the parameters' .grad on their flat views so the next backward adds in place.
    for (auto& f : flats_)
      if (f.grad_live) {
        zero_untouched(f);
        f.flat->attach_grads();
        // A placeholder master.grad (this rank's unreduced region), so that optimizer->zero_grad()
        // during accumulation is noticed and discards the window, as it would in PyTorch.
        if (f.master.defined() && !f.grad.defined() && !f.master.grad().defined() &&
            f.master.scalar_type() == f.flat->grad_full().scalar_type()) {
          const at::Tensor& gf = f.flat->grad_full();
          auto [b, e] = f.flat->layout().shard_range(f.flat->options().rank);
          f.master.mutable_grad() = sharding::storage_alias(spec_.shards_optimizer() ? gf.narrow(0, b, e - b) : gf);
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

// ---------------------------------------------------------------------------------------------------
// Clipping and the step.

void Engine::clip_grad_value(double clip_value) {
  if (!(clip_value >= 0)) throw std::invalid_argument("clip_grad_value: clip_value must be >= 0");
  if (shards_gradients_or_optimizer_across_ranks())
    throw std::logic_error("clip_grad_value: the gradients are sharded across ranks under " +
                           std::string(to_string(spec_.strategy)) + "; clip by norm instead (clip_grad_norm)");
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
  if (!inf && norm_type < 1.0) throw std::invalid_argument("clip_grad_norm: norm_type must be >= 1 or inf");
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
  if (spec_.shards_optimizer() && shard_->size() > 1) {
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
  for (auto& f : flats_)
    if (f.master_grad_set && f.master.grad().defined()) note_master_grad(f);
  for (auto& f : flats_)  // the reduced gradient where the master's is a converted copy
    if (f.grad.defined() && f.master.defined() && f.master.grad().defined() && !f.grad.is_alias_of(f.master.grad()))
      f.grad.mul_(coef);
}

void Engine::skip_step() {
  if (in_backward_) throw std::logic_error("accel: optimizer step during backward");
  for (const auto& group : group_params_)
    for (const auto& p : group) p.mutable_grad() = at::Tensor();
  close_step();
}

void Engine::close_step() {
  // The step consumed (or dropped) the gradients: the next backward starts a new accumulation window.
  for (auto& f : flats_) {
    f.grad_live = false;
    f.flat->detach_grads();
    f.grad = at::Tensor();  // after a step, master.grad keeps it until zero_grad
    f.master_grad_set = false;
  }
}

void Engine::before_step() {
  if (in_backward_) throw std::logic_error("accel: optimizer step during backward");
}

std::pair<std::int64_t, std::int64_t> Engine::master_range(const Flat& f) const {
  if (spec_.shards_optimizer()) return f.flat->layout().shard_range(f.flat->options().rank);
  return {0, f.flat->layout().padded()};
}

void Engine::after_step() {
  if (passthrough_) return;
  params_from_masters();
  close_step();
}

void Engine::params_from_masters() {
  if (passthrough_) return;
  c10::NoGradGuard ng;
  std::vector<comm::WorkPtr> works;
  for (auto& f : flats_) {
    if (f.group >= 0) {
      // Master -> compute buffer where they are different tensors.
      const at::Tensor& dst = spec_.shards_optimizer() ? f.flat->shard() : f.flat->full();
      if (!f.master.is_alias_of(dst)) dst.copy_(f.master);
    }
    // Replicated parameters (ZeRO-1/2) and the always-gathered root unit (ZeRO-3) are all-gathered
    // from the updated shards; sharded units are gathered again by their next forward.
    if (!spec_.shards_optimizer() || f.group < 0 || shard_->size() == 1) continue;
    if (!f.flat->options().sharded) {
      auto [b, e] = f.flat->layout().shard_range(f.flat->options().rank);
      works.push_back(gather_->all_gather_async(f.flat->full().narrow(0, b, e - b), f.flat->full()));
    } else if (f.persistent) {
      works.push_back(gather_->all_gather_async(f.flat->shard(), f.flat->full()));
    }
  }
  for (auto& w : works) w->wait();
  // Sharded units gathered as fp8: their bytes follow the new masters.
  quantize_fp8_shards();
}

// ---------------------------------------------------------------------------------------------------

}  // namespace accel::zero
