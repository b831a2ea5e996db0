// The engine's construction: units from the marks and the wrap policy, one FlatParam per (unit,
// param group, requires_grad, dtype, device), the masters, the reducer; and the hooks it installs.
// The other jobs live beside it: engine_gather.cpp (gather and reshard around units),
// engine_fp8.cpp (the fp8 all-gather), engine_backward.cpp (the gradient window), engine_step.cpp
// (clipping and the step's bracket). The reduction itself is GradReducer's.
#include "zero/engine.h"
#include "base/error.h"

#include "base/env.h"
#include "base/log.h"
#include "base/memory.h"
#include "kernels/cpu_gemm.h"
#include "sharding/sharded_init.h"
#include "zero/step_worker.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace accel::zero {
namespace {

// ACCEL_CPU_GEMM's path for the process's float32 CPU matmuls; where onednn is asked for and this
// libtorch or CPU cannot give it, says so once (the matmuls stay on libtorch's kernels).
void install_cpu_gemm() {
  const cpu_gemm::Path want = cpu_gemm::from_env();
  const cpu_gemm::Path got = cpu_gemm::install(want);
  static std::once_flag said;
  if (got != want)
    std::call_once(said, [&] {
      log::warning(
          fmt::format("ACCEL_CPU_GEMM=onednn, but oneDNN's matmul is not available here: {}", cpu_gemm::describe(got)));
    });
}

using memory::Category;
using memory::CategoryScope;

// This rank's 0/1 setting `var`; a bad value warns (", <otherwise>") and reads as 0, so that the rank
// declines in the collective that agrees on it instead of leaving the others waiting there.
bool asks_for(const char* var, const char* otherwise) {
  try {
    return env::get_int(var) != 0;
  } catch (const std::exception& e) {
    log::warning(fmt::format("{}; {}", e.what(), otherwise));
    return false;
  }
}

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

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model, const torch::optim::Optimizer* optimizer, ShardingSpec spec,
               std::shared_ptr<comm::Communicator> world)
    : spec_(std::move(spec)), world_(std::move(world)), model_(std::move(model)) {
  spec_.validate();
  // Both process-wide settings below are for models on the CPU: an engine over a CUDA model leaves the
  // process's CPU matmuls and CPU allocator as they are, also when it is handed over on the host to be
  // moved there (ShardingSpec::device).
  bool cpu_model = true;
  for (const auto& p : model_->parameters()) {
    cpu_model = p.device().is_cpu();
    break;
  }
  if (spec_.device) cpu_model = spec_.device->is_cpu();
  if (cpu_model) install_cpu_gemm();  // float32 CPU matmuls through oneDNN where that is faster (ACCEL_CPU_GEMM)
  Groups groups = groups_for(spec_, world_);
  shard_ = std::move(groups.shard);
  replicate_ = std::move(groups.replicate);
  build(*model_, optimizer);
  if (spec_.step_in_backward && !plan_.passthrough && !plan_.masters_are_shards)
    throw accel::InvalidArgumentError(fmt::format(
        "step_in_backward steps each rank's optimizer shard as its reduction finishes: it needs sharded optimizer "
        "state (ZeRO-1/2/3, FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD), not {}",
        to_string(spec_.strategy)));
  if (cpu_model && plan_.churns_memory && env::get_int("ACCEL_CPU_MALLOC_CACHE")) memory::keep_freed_cpu_memory();
}

Engine::~Engine() {
  uninstall_hooks();
  step_worker_.reset();  // (waits for steps still running: they read the pinned gradients)
  // No copy between the device and host memory may outlive the buffers it reads or writes (the
  // page-locked masters, gradients and parameter shards go with the engine).
  try {
    wait_host_copies();
  } catch (...) {  // (a device already in error: nothing to wait for)
  }
  // Without unshard(), the model outlives the engine as a private sharded one does: what is gathered
  // now (the root unit) becomes this rank's own copy, the rest throws when touched. Never parameters
  // in a buffer the other ranks write. (Not collective: a destructor may run while a peer is gone; at
  // rest the last step's barrier has ordered the peers' writes.)
  for (auto& f : flats_) {
    if (!f.flat_param->node_shared() || !f.flat_param->gathered()) continue;
    try {
      f.flat_param->make_private();
    } catch (...) {  // (no memory for the copy: parameters that throw, as the sharded units' do)
      f.flat_param->free_full();
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Building: units from the marks and the wrap policy, then one FlatParam per (unit, param group,
// requires_grad), in module order.

void Engine::build(torch::nn::Module& model, const torch::optim::Optimizer* optimizer) {
  std::unordered_map<const void*, int> group_of;
  if (optimizer)
    for (std::size_t g = 0; g < optimizer->param_groups().size(); ++g)
      for (const auto& p : optimizer->param_groups()[g].params())
        group_of[p.unsafeGetTensorImpl()] = static_cast<int>(g);

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
        if (auto slot = &m != &model ? sharding::find_unit(&m) : nullptr; slot && wrap.wraps(m)) {
          units_.push_back(UnitInfo{prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1), &m, {}, {}, false});
          slots_.push_back(slot);
          unit = units_.size() - 1;
        }
        for (const auto& kv : m.named_parameters(/*recurse=*/false)) {
          const at::Tensor& p = kv.value();
          std::string name = prefix + kv.key();
          auto it = seen.find(p.unsafeGetTensorImpl());
          if (it != seen.end()) {
            const Owned& first = owned[it->second];
            if (first.unit != unit)
              throw accel::InvalidArgumentError(fmt::format(
                  "accel: parameter '{}' is the same tensor as '{}', but they belong to different units ('{}' and "
                  "'{}'); a shared (tied) parameter must stay inside one unit: unmark one of them or move the shared "
                  "module into their common parent",
                  name, first.name, units_[first.unit].name.empty() ? "<root>" : units_[first.unit].name,
                  units_[unit].name.empty() ? "<root>" : units_[unit].name));
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
      if (o.param.numel() > 0 && o.param.is_contiguous() &&
          !sharding::is_presharded(o.param))  // (those were sent when built)
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
  // Where the flats end up: the parameters' device, or the spec's when the model was handed over on
  // the host (built and sharded here, each flat moved there as its shard, or empty once its offloaded
  // shard has left: move_to_device()).
  const c10::Device here = owned.empty() ? c10::Device(c10::kCPU) : owned[0].param.device();
  device_ = spec_.device.value_or(here);
  on_a_device_ = !device_.is_cpu() || HostCopies::emulating_device_for_tests();
  // The plan: the spec against this run's group sizes and the model's dtypes.
  bool convert = false;
  // Offload to host memory (offload_optimizer.device cpu) of parameters on a device: the masters are
  // host copies, a conversion too.
  const bool host_masters = spec_.offload.optimizer == OffloadDevice::Cpu;
  for (auto& [key, members] : keys) {
    c10::ScalarType dt = owned[members[0]].param.scalar_type();
    convert = convert || spec_.param_dtype.value_or(dt) != dt || spec_.master_dtype.value_or(dt) != dt ||
              (host_masters && on_a_device_);
  }
  plan_ = Plan::resolve(spec_, world_->size(), shard_->size(), convert);
  if (device_ != here && (!spec_.shards_parameters() || plan_.passthrough))
    throw accel::LogicError(fmt::format(
        "accel: the model's parameters are on {} but the spec trains it on {}: only a model whose parameters are "
        "sharded there (ZeRO-3 / FULL_SHARD / HYBRID_SHARD over more than one rank, or with offload_param) is "
        "built on the host and moved flat by flat; move the model to {} before prepare",
        here.str(), device_.str(), device_.str()));
  const bool sharded_params = plan_.params_sharded;
  // Sharded CPU parameters whose shard group shares one node's memory: each flat's full buffer is one
  // shared-memory object every rank of the group maps, the ranks' shards side by side in it, so the
  // node holds the parameters once and gathering moves nothing. Not for shards on disk (offload_param
  // nvme frees and reloads the shard) nor for fp8 all-gathers (they gather fp8 bytes on purpose). The
  // same answer on every rank: the flag is agreed below, and node_shared_empty answers alike.
  const bool cpu_model = !owned.empty() && !on_a_device_;  // (the same device on every rank)
  bool want_node_shared = sharded_params && cpu_model && !spec_.offload.param_on_disk() && !spec_.fp8_all_gather &&
                          asks_for("ACCEL_NODE_SHARED_PARAMS", "parameters stay private to each rank");
  // Only if every rank of the group asks (each reads its own env); a CUDA engine issues no extra collective.
  if (sharded_params && cpu_model && shard_->size() > 1) {
    at::Tensor w = at::full({1}, want_node_shared ? 1 : 0, at::kInt);
    shard_->all_reduce(w, {comm::ReduceOp::Min});
    want_node_shared = w.item<int>() != 0;
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
    if (want_node_shared && device == "cpu")
      o.node_shared = [this](std::int64_t numel, c10::ScalarType dt) { return shard_->node_shared_empty(numel, dt); };
    std::string fname =
        fmt::format("{}[group {}{}, {}{}]", units_[unit].name.empty() ? "<root>" : units_[unit].name, group,
                    requires_grad ? "" : ", frozen", c10::toString(static_cast<c10::ScalarType>(dtype)),
                    device_.is_cpu() ? "" : ", " + device_.str());
    Flat f;
    // A master in another dtype than the compute buffer starts from the original values, not from
    // their rounded copy.
    at::Tensor original;
    const c10::ScalarType mdt = spec_.master_dtype.value_or(ps[0].scalar_type());
    // Host masters: in pinned host memory, stepped on the CPU (fused kernels), copied to the device.
    const bool on_host = host_masters && on_a_device_;
    if (group >= 0 && !plan_.passthrough && (mdt != o.dtype || on_host)) {
      CategoryScope cat(Category::OptimizerState);
      c10::NoGradGuard ng;
      std::vector<std::int64_t> numels;
      for (const auto& p : ps) numels.push_back(p.numel());
      sharding::ShardLayout layout(numels, o.world, o.align);  // the FlatParam's own
      at::Tensor flat = at::zeros({layout.padded()}, ps[0].options().dtype(mdt));
      for (std::size_t i = 0; i < ps.size(); ++i)
        flat.narrow(0, layout.offset(i), ps[i].numel()).copy_(ps[i].reshape({-1}));
      auto [b, e] = layout.shard_range(o.rank);
      const at::Tensor mine = plan_.masters_are_shards ? flat.narrow(0, b, e - b) : flat;
      if (on_host)
        original = HostCopies::pinned_empty(mine.sizes(), mine.scalar_type(), device_).copy_(mine);
      else if (device_ != mine.device())  // (built on the host for a device)
        original = mine.to(device_);
      else
        original = plan_.masters_are_shards ? mine.clone() : mine;
    }
    {
      CategoryScope cat(Category::Parameters);
      f.flat_param = std::make_unique<sharding::FlatParam>(fname, std::move(ps), std::move(names), o);
    }
    f.master = original;
    f.master_in_host_memory = original.defined() && on_host;
    f.unit = static_cast<int>(unit);
    f.group = group;
    f.persistent = sharded_params && unit == 0;
    f.fired.assign(f.flat_param->params().size(), 0);
    f.touched.assign(f.flat_param->params().size(), 0);
    for (const auto& p : f.flat_param->params()) f.need += p.requires_grad() ? 1 : 0;
    units_[unit].flats.push_back(flats_.size());
    flats_.push_back(std::move(f));
  }

  // What the optimizer steps, per user param group: the user's parameters (passthrough), or master
  // copies (the flat buffer or this rank's shard of it) in the master dtype, aliases of the compute
  // buffer when the dtypes agree.
  setup_offload(optimizer);
  move_to_device();
  group_params_.assign(optimizer ? optimizer->param_groups().size() : 0, {});
  if (plan_.passthrough) {
    for (std::size_t g = 0; g < group_params_.size(); ++g)
      for (const auto& p : optimizer->param_groups()[g].params())
        if (p.requires_grad()) group_params_[g].push_back(p);
  }
  for (auto& f : flats_) {
    if (f.group < 0 || plan_.passthrough) continue;
    if (!f.master.defined())
      f.master = (plan_.masters_are_shards ? f.flat_param->shard() : f.flat_param->full()).alias();
    f.master.set_requires_grad(false);
    group_params_[f.group].push_back(f.master);
  }

  // Parameter all-gathers go over a communicator of their own: a rank whose backward leaves a
  // parameter unused (data-dependent branches) launches its reduce-scatters later than the others,
  // and on one communicator that would reorder them against the backward all-gathers.
  gather_ = sharded_params ? shard_->split(0, shard_->rank()) : shard_;
  // Each group of several ranks that reduces or gathers in backward chooses how it moves CUDA tensors
  // (NCCL or staged through host memory, an exchange among its members) here, where every rank is and
  // nothing is in flight: at its first collective instead, mid-backward, that exchange would wait on
  // the MPI thread behind requests still waiting for their copies to the host. (The world moves no
  // device tensor in backward.)
  if (device_.is_cuda() && device_.has_index()) {  // (no index: decided by the first collective's tensor)
    const at::Tensor probe = at::empty({0}, at::TensorOptions().device(device_));
    for (comm::Communicator* g : {shard_.get(), replicate_.get(), gather_.get()})
      if (g && g->size() > 1) g->backend_name(probe);
  }

  // Node-shared flats: every rank has written its shard; from here on each reads all of them.
  sync_node_shared();
  // Root flats under ZeRO-3 stay gathered from step to step (node-shared: full() points at the buffer).
  for (auto& f : flats_)
    if (f.persistent) {
      CategoryScope cat(Category::Gathered);
      f.flat_param->alloc_full();
      if (!f.flat_param->node_shared()) gather_->all_gather(f.flat_param->shard(), f.flat_param->full());
    }
  quantize_fp8_shards();

  // Reduction order: reverse module order (the order backward usually finishes units in).
  reducer_index_.assign(flats_.size(), npos);
  std::vector<sharding::FlatParam*> order;
  for (std::size_t i = flats_.size(); i-- > 0;)
    if (flats_[i].flat_param->requires_grad()) {
      reducer_index_[i] = order.size();
      reduce_order_.push_back(i);
      order.push_back(flats_[i].flat_param.get());
    }
  c10::ScalarType rdt = flats_.empty() ? c10::kFloat : flats_[0].flat_param->full().scalar_type();
  for (const auto& f : flats_) rdt = c10::promoteTypes(rdt, f.flat_param->full().scalar_type());  // never narrower
  rdt = spec_.reduce_dtype.value_or(rdt);
  if (plan_.passthrough) return;           // nothing to reduce
  CategoryScope cat(Category::Gradients);  // all-reduce buckets allocate their gradient buffers here
  reducer_ = std::make_unique<GradReducer>(
      std::move(order), plan_.reduce_mode, rdt, shard_, replicate_, spec_.bucket_bytes, spec_.grad_buckets_in_flight,
      !on_a_device_ && asks_for("ACCEL_NODE_SHARED_GRADS", "gradient buffers stay private to each rank"));
  // Offload to host memory: a reduced gradient starts its way to the host as soon as its bucket
  // finishes, while backward goes on (unless a pending gradient is still to be added to it), and the
  // device lets go of it there: the pinned copy is the pending gradient (ZeRO-Offload keeps no
  // gradient on the device between its reduction and the step).
  // The step in backward (spec.step_in_backward): the master's step is posted to a worker as soon
  // as its gradient is final (on a device, once its copy to the host is queued).
  // A gradient pending from an earlier micro-step of the window (MoreMicroSteps, or a second sync
  // backward before the step) is added to as soon as each bucket is reduced: a device's one in host
  // memory there, on the way (the device lets go of this one as before); under ZeRO-2/3 the others
  // where they lie, and the reducer lets go of the reduced shard at once, so that a window holds one
  // shard of gradients and not two (the others at the end of backward).
  if (host_copies_ || spec_.step_in_backward || plan_.reduce_mode == GradReducer::Mode::ReduceScatter) {
    reducer_->set_adds_to_pending([this](std::size_t i) { return adds_to_pending(flats_[reduce_order_[i]]); });
    reducer_->set_on_reduced([this](std::size_t i, const at::Tensor& g) {
      Flat& f = flats_[reduce_order_[i]];
      const bool host = host_master(f);
      // A failed backward's reductions (abort_backward's flush) are thrown away: nothing goes to the
      // host, and what is pending there stays as it was.
      if (host && aborting_backward_) return true;
      bool taken = host;
      if (f.grad.defined() && host) {
        if (!f.grad.is_same(f.host_grad)) return false;  // added at the end of backward
        host_copies_->add_to_host(f.host_grad, g);
        f.host_grad_src = nullptr;  // (f.grad is the sum: nothing to copy again at the end)
        f.added_on_the_way = true;  // (ZeRO-1's reducer keeps g: not added again at the end)
      } else if (f.grad.defined()) {
        if (!adds_to_pending(f) || f.grad.device() != g.device() || f.grad.is_alias_of(g))
          return false;  // added at the end of backward
        CategoryScope cat(Category::Gradients);
        f.grad.add_(g);
        f.added_on_the_way = true;
        // (A group of one reduces nothing: g may be the flat's full gradient, kept for the next window.)
        taken = !g.is_alias_of(f.flat_param->grad_full());
      } else if (host) {
        grad_to_host(f, g);
      }
      // (The device lets go of g once its copy is done: counted for hold_for_host where the reducer lets
      // go of it, ZeRO-2/3 within a node.)
      if (host && plan_.reduce_mode == GradReducer::Mode::ReduceScatter && !reducer_->averages_across())
        copied_to_host_ = true;
      if (steps_in_backward(f)) step_in_backward(f, f.added_on_the_way ? f.grad : g);
      return taken;
    });
  }
}

void Engine::move_to_device() {
  // A model handed over on the host (ShardingSpec::device): each flat moves there as its shard, with its
  // values (the full buffers of sharded units are free), or empty where the shard is offloaded (its
  // storage has left), and the unsharded rest (the root unit) whole. The device never holds more than
  // the shards and one flat being moved.
  for (auto& f : flats_) {
    const std::string freed =
        fmt::format("accel: the shard of {} is offloaded to {} and not loaded now", f.flat_param->name(),
                    param_offload_ && param_offload_->in_host_memory() ? "host memory (offload_param.device cpu)"
                                                                       : "disk (offload_param.device nvme)");
    f.flat_param->move_to(device_, freed);
  }
}

bool Engine::adds_to_pending(const Flat& f) const {
  // ZeRO-2/3 and FSDP, a pending gradient that is not a device's in host memory (that one is added to
  // there), and not while a failed backward's reductions are flushed (their results are thrown away).
  // Not across nodes under HYBRID_SHARD either: its shards are final only after the cross-node averages
  // in flush(), and are added at the end of backward (the kept outputs stay for the next micro-step).
  return plan_.reduce_mode == GradReducer::Mode::ReduceScatter && reducer_ && !reducer_->averages_across() &&
         f.grad.defined() && !host_master(f) && !aborting_backward_;
}

void Engine::install_hooks() {
  if (hooks_installed_) return;
  // Activation checkpointing: the spec-wide switch takes the outermost units only; a unit checkpointed
  // inside another checkpointed one is refused (its hooks would run again in the outer recompute).
  auto inside = [&](std::size_t u, std::size_t v) {  // unit u lies in unit v's module (neither the root)
    const std::string &a = units_[u].name, &b = units_[v].name;
    return a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '.';
  };
  std::vector<bool> by_spec(units_.size(), spec_.activation_checkpointing);  // outermost units only
  for (std::size_t u = 1; u < units_.size(); ++u)
    for (std::size_t v = 1; v < units_.size(); ++v)
      if (v != u && inside(u, v)) by_spec[u] = false;
  auto checkpointed = [&](std::size_t u) { return slots_[u - 1]->checkpoint || by_spec[u]; };
  for (std::size_t u = 1; u < units_.size(); ++u)
    for (std::size_t v = 1; v < units_.size(); ++v)
      if (v != u && inside(u, v) && checkpointed(u) && checkpointed(v))
        throw accel::InvalidArgumentError(fmt::format(
            "unit '{}' is checkpointed inside unit '{}', which is checkpointed too: nested checkpointed units are "
            "not supported (the inner unit would run again in the outer recompute); checkpoint one of them",
            units_[u].name, units_[v].name));
  hooks_installed_ = true;
  for (std::size_t fi = 0; fi < flats_.size() && !plan_.passthrough; ++fi) {
    const auto& ps = flats_[fi].flat_param->params();
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (ps[i].requires_grad()) {
        auto hook = std::make_unique<GradReadyHook>(this, fi, i);
        grad_hooks_.emplace_back(ps[i], hook.get());
        torch::autograd::impl::set_post_acc_grad_hooks(ps[i], std::move(hook));
      }
  }
  for (std::size_t u = 1; u < units_.size(); ++u) {
    slots_[u - 1]->hooks = std::make_shared<UnitHooksImpl>(weak_from_this(), u);
    slots_[u - 1]->checkpoint_by_spec = by_spec[u];
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
    if (u < unit_hooks_.size() && slots_[u]->hooks.get() == unit_hooks_[u]) {
      slots_[u]->hooks.reset();
      slots_[u]->checkpoint_by_spec = false;
    }
  unit_hooks_.clear();
}

}  // namespace accel::zero
