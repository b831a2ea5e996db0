// accel::zero::Engine — executes a ShardingSpec on one model: flattens its units into FlatParams,
// gathers and frees parameters around each unit's forward and backward, reduces gradients through
// the GradReducer, and brackets the sharded optimizer's step (see sharded_optimizer.h).
//
// Build it with prepare() (sharded_optimizer.h), which also returns the optimizer to use. The model object stays the
// user's: model->forward(x) works, named_parameters() keeps its names, each parameter is a view into
// its unit's flat buffer.
//
// One training step:  loss = model->forward(x);  engine->backward(loss);  optimizer->step();
// (loss.backward() works too, provided every rank's backward reaches at least one parameter.)
// Gradient accumulation: backward passes run inside a NoSync scope skip the reduction; the first
// backward outside one reduces everything accumulated (or each micro-step reduces, inside a
// MoreMicroSteps scope, and adds to what is pending: less memory, more traffic). Gradients last
// until optimizer->step(); optimizer->zero_grad() without a step (to none or in place, also between
// accumulation micro-steps) discards them. The next engine->backward(), unit forward or first
// gradient hook notices; under DDP with plain loss.backward() the hook is too late, since autograd
// has already added into .grad. If backward throws (on every rank), engine->backward() issues the
// remaining reductions, waits for them, and forgets that backward's gradients before rethrowing
// (where a sync backward fails while the window's gradients are pending in host memory, a device's
// masters there, the whole window's, with a warning: the reductions add to them on the way).
//
// Lifetime: under ZeRO-3 the units' parameters are shards held by the flat buffers; the model's
// parameter tensors hold data only while gathered (between steps any access to their data throws,
// naming get_state_dict / save_model: sharding::freed_parameter_message). The root unit, the
// parameters in no unit, stays gathered (zero::unit_report says when that is most of the model).
// Keep the engine alive while the model is used, or call unshard() (collective) first, after which
// the model keeps full parameters.
//
// Not thread-safe: one thread drives forward, backward and step. Collectives are issued in the same
// order on every rank as long as every rank runs the same model code.
#pragma once

#include "comm/communicator.h"
#include "sharding/flat_param.h"
#include "sharding/unit.h"
#include "zero/grad_reducer.h"
#include "zero/host_copies.h"
#include "zero/optimizer_offload.h"
#include "zero/param_offload.h"
#include "zero/plan.h"
#include "zero/spec.h"

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace accel::zero {

class StepWorker;

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // What the engine keeps per flat parameter beyond the mechanism.
  struct Flat {
    std::unique_ptr<sharding::FlatParam> flat_param;
    int unit = 0;             // index into units()
    int group = -1;           // the user optimizer's param group, -1: not optimized
    bool persistent = false;  // gathered from the step's all-gather until the next step (root unit)
    at::Tensor master;        // what the optimizer steps: the shard (sharded) or the whole flat buffer
                              // (undefined in passthrough, and for flats the optimizer does not own)
    at::Tensor grad;          // reduced gradient feeding master.grad (undefined until a sync backward)
    // Offload: the region of the optimizer's file holding this flat's master and state (master is
    // then a meta tensor: a handle the optimizer's param groups and gradients hang on), the slot of
    // the parameter file holding its shard; npos when not offloaded. staged_master: the master read
    // into memory between stage_offloaded() and unstage_offloaded().
    std::size_t opt_region = static_cast<std::size_t>(-1), param_slot = static_cast<std::size_t>(-1);
    at::Tensor staged_master;
    // Offload to host memory (a master in pinned host memory, parameters on a device): the pinned
    // buffer master.grad is, and the device gradient a copy into it was queued from (with that
    // tensor's version then; null when none is queued).
    // master_in_host_memory: the master is such a host copy (offload_optimizer device cpu).
    at::Tensor host_grad;
    bool master_in_host_memory = false;
    const void* host_grad_src = nullptr;
    std::int64_t host_grad_src_version = 0;
    // fp8 all-gather (spec.fp8_all_gather, sharded units): this rank's shard in e4m3, one scale per
    // parameter (agreed across the shard group after each step), the gathered bytes while in flight.
    at::Tensor fp8_shard, fp8_scales, fp8_full;
    // per backward
    std::vector<char> fired;
    std::size_t fired_count = 0, need = 0;
    bool grad_live = false;     // grad_full holds this accumulation window's gradients
    std::vector<char> touched;  // per parameter: its region of grad_full written in this window
    // Where the accumulation dtype is wider than the gradients (bf16/fp16 compute, fp32 reduction):
    // the window's earlier backward passes summed in it (NoSync), grad_full holding only the current
    // one's; the sync backward adds grad_full and reduces the sum (FSDP2 accumulates in reduce_dtype).
    at::Tensor grad_sum;
    // DDP under such a reduction: .grad shows f.grad rounded into grad_full, so a backward that did not
    // settle it first (a plain loss.backward()) has it in its reduction already.
    bool grad_shown = false;
    bool ready = false;
    bool added_on_the_way = false;           // this backward's reduced gradient is already added to the pending grad
    bool stepped_in_backward = false;        // spec.step_in_backward: its step was posted as its gradient was final
    bool master_grad_set = false;            // master.grad was set by us (reduction or placeholder), not stepped on
    const void* master_grad_impl = nullptr;  // ... that tensor, and its version then: a zero_grad()
    std::int64_t master_grad_version = 0;    // (to none, or in place) changes one of them
  };
  struct UnitInfo {
    std::string name;  // "" for the root unit, else the module path ("blocks.0")
    torch::nn::Module* module = nullptr;
    std::vector<std::size_t> flats;
    std::vector<comm::WorkPtr> inflight;  // prefetch all-gathers
    bool backward_gathered = false;
    // Per forward/backward: when its first call that backward will reach began (a tick of the unit
    // hooks; -1: none yet; calls whose outputs need no gradient, such as an evaluation under no_grad,
    // do not count), when its latest call began, and whether its end of backward has been handled.
    std::int64_t first_start = -1, call_start = -1;
    bool ended = false;
  };

  Engine(std::shared_ptr<torch::nn::Module> model, const torch::optim::Optimizer* optimizer, ShardingSpec spec,
         std::shared_ptr<comm::Communicator> world);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ShardingSpec& spec() const { return spec_; }
  // The spec resolved against this run's groups and dtypes: what the engine actually does.
  const Plan& plan() const { return plan_; }
  const std::vector<Flat>& flats() const { return flats_; }
  const std::vector<UnitInfo>& units() const { return units_; }
  comm::Communicator& world() const { return *world_; }
  // The group parameters, gradients and optimizer state are sharded over (world, or the node
  // group under HYBRID_SHARD) and the group gradients are then averaged over (null if none).
  const std::shared_ptr<comm::Communicator>& shard_group() const { return shard_; }
  const std::shared_ptr<comm::Communicator>& replicate_group() const { return replicate_; }
  // Where parameter all-gathers go: a duplicate of the shard group when parameters are sharded
  // (so they cannot be reordered against reduce-scatters), else the shard group itself.
  const std::shared_ptr<comm::Communicator>& gather_group() const { return gather_; }
  std::size_t num_buckets() const { return reducer_ ? reducer_->num_buckets() : 0; }
  // Per param group of the user's optimizer: the tensors the sharded optimizer steps (master shards,
  // or in passthrough the user's parameters themselves).
  const std::vector<std::vector<at::Tensor>>& optimizer_params() const { return group_params_; }

  // --- backward --------------------------------------------------------------------------------
  // loss.backward() and the end-of-backward work (idempotent per backward).
  void backward(const at::Tensor& loss);
  // While false, backward passes accumulate locally without reducing (DDP's no_sync).
  void set_gradient_sync(bool sync) { sync_ = sync; }
  bool gradient_sync() const { return sync_; }
  class NoSync {
   public:
    explicit NoSync(Engine& e) : e_(e), saved_(e.gradient_sync()) { e_.set_gradient_sync(false); }
    ~NoSync() { e_.set_gradient_sync(saved_); }

   private:
    Engine& e_;
    bool saved_;
  };
  // Accumulation that reduces every micro-step (DeepSpeed's ZeRO-2/3, Accelerate's sync_each_batch):
  // backward passes while more_micro_steps() reduce as a sync backward does and add to the gradients
  // pending for the step, so no rank keeps an unsharded gradient between micro-steps (NoSync keeps
  // every unit's; a device's master in host memory gets the sum there, made on the way); but they
  // are not the window's last, so no step starts in backward (spec.step_in_backward). The first
  // backward after it is the last of the window. More traffic than NoSync (a reduction per
  // micro-step), less memory.
  void set_more_micro_steps(bool more) { more_micro_steps_ = more; }
  bool more_micro_steps() const { return more_micro_steps_; }
  class MoreMicroSteps {
   public:
    explicit MoreMicroSteps(Engine& e) : e_(e), saved_(e.more_micro_steps()) { e_.set_more_micro_steps(true); }
    ~MoreMicroSteps() { e_.set_more_micro_steps(saved_); }

   private:
    Engine& e_;
    bool saved_;
  };

  // Collective: gathers every sharded unit for good (the parameters stay whole from now on, as under
  // SHARD_GRAD_OP), so the model keeps working without the engine.
  void unshard();

  // Global gradient norm over every rank's shards (norm_type 2, any p >= 1, or infinity), computed
  // after the reduction; scales the gradients by max_norm / (norm + 1e-6) when that is < 1, as
  // torch::nn::utils::clip_grad_norm_ does. Returns the norm before clipping.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // Clamps every gradient to [-clip_value, clip_value] (after the reduction). Only where each rank
  // holds whole gradients (DDP / NO_SHARD, or one rank); throws std::logic_error otherwise.
  void clip_grad_value(double clip_value);

  // The gradients the optimizer steps on (its masters' .grad, or in passthrough the parameters'),
  // the defined ones: what fp16 unscaling and overflow checks look at.
  std::vector<at::Tensor> step_grads() const;
  // Call after multiplying every step_grads() tensor in place by coef (unscaling, clipping): brings
  // the engine's own copies along and keeps a zero_grad() distinguishable from that change.
  void grads_scaled(double coef);

  // --- the sharded optimizer's step calls these ---------------------------------------------------
  void before_step();
  void after_step();
  // The step threw on this rank after before_step (a closure, an I/O error): its peers are inside
  // the step's collectives and cannot finish them, so the job is made to end promptly, naming this
  // rank and the error (Communicator::abandon), rather than after their collectives time out.
  void step_failed(const std::string& what);
  // Instead of a step (fp16 overflow): this step's gradients are dropped, parameters and optimizer
  // state stay as they are, and the next backward starts a new accumulation window. Local.
  void skip_step();

  // --- the step in backward (spec.step_in_backward) -------------------------------------------
  // The sharded optimizer hands over how to step one of its masters alone (its fused CPU step of that
  // parameter; false where it cannot), or nullptr to take it back (after waiting for posted steps).
  void set_step_one(std::function<bool(const at::Tensor& master)> step_one);
  // The masters the last backward stepped (their steps are done once backward returns): the
  // optimizer's step leaves them out.
  std::vector<at::Tensor> stepped_in_backward() const;

  // --- offload (spec.offload) ------------------------------------------------------------------
  const OptimizerOffload* optimizer_offload() const { return opt_offload_.get(); }
  const ParamOffload* param_offload() const { return param_offload_.get(); }
  // The offloaded optimizer's step (between before_step and after_step): each param group's rule
  // now (options as the user's scheduler left them).
  void offloaded_step(const std::vector<OffloadRule>& group_rules);
  // f's master values as a tensor in memory: f.master itself, or for an offloaded optimizer the
  // staged copy or else a copy read from its file.
  at::Tensor master_data(const Flat& f) const;
  // Checkpoints: brings offloaded state into memory, as if nothing were offloaded (staged masters,
  // which master_data returns; optimizer state in opt->state() keyed by the master handles as
  // torch::optim keys it; parameter shards resident) — and back. write_back: what is in memory now
  // (a loaded checkpoint) replaces what the files hold. Without offload both do nothing.
  void stage_offloaded(torch::optim::Optimizer* opt);
  void unstage_offloaded(torch::optim::Optimizer* opt, bool write_back);
  // Offload to host memory on a device: blocks until the side stream's copies are done (the host may
  // then write masters that an updated-parameter copy was still reading). Anyone writing masters
  // outside the optimizer's step (loading a checkpoint) calls it first; no-op otherwise.
  void wait_host_copies() const;

  // --- checkpoints -------------------------------------------------------------------------------
  // The elements [begin, end) of f's flat buffer that f.master holds on this rank: its shard of the
  // shard group where the optimizer is sharded, else the whole padded buffer. (Passthrough engines
  // have no masters: the optimizer steps the parameters themselves.)
  std::pair<std::int64_t, std::int64_t> master_range(const Flat& f) const;
  // Collective. Writes every master into its compute buffer (converting the dtype) and all-gathers
  // the parameters the strategy keeps replicated: the parameter half of after_step(), for masters
  // that were overwritten (a loaded checkpoint). No-op in passthrough.
  void params_from_masters();
  // Collective. Call before writing masters or parameter shards outside the step (loading a
  // checkpoint): with node-shared parameters, no peer may still be reading them. No-op otherwise.
  void before_param_writes();
  // Whether sharded parameters live in memory their shard group shares (FlatParam::node_shared).
  bool node_shared() const;
  // The node-shared full buffers' bytes: the node holds them once, and each rank maps (and its RSS
  // counts) all of them. accel's allocator counts none of them (memory::snapshot).
  std::int64_t node_shared_bytes() const;
  // This rank's node-shared gradient buffers (GradReducer, ACCEL_NODE_SHARED_GRADS), in bytes; the node
  // holds the shard group's size times this, and each rank maps all of it.
  std::int64_t node_shared_grad_bytes() const;

  // Collective over the gather group when `local` is this rank's part: f's padded flat buffer whole.
  // `local` is f.master, a tensor shaped like it (an optimizer state), or f's compute shard; a local
  // tensor that is already whole (replicated, or a group of one) is returned as a flat view, no copy.
  // Every rank of the group must call it for the same flat. The one way checkpoints, save_model and
  // get_state_dict see a flat parameter whole.
  at::Tensor whole(const Flat& f, const at::Tensor& local) const;
  // f's values whole: from the master (exact fp32 where masters are wider than the compute dtype) or
  // from the compute buffer (a gathered flat as it is; a sharded one, one whose gather is still in
  // flight, or one gathered as fp8, from its exact shard gathered into a temporary).
  enum class Source { Compute, Master };
  at::Tensor whole_values(const Flat& f, Source source) const;

  // Installs the autograd and unit hooks (prepare() does; needs the engine in a shared_ptr).
  void install_hooks();
  void uninstall_hooks();

  // --- called by the unit hooks and autograd hooks ---------------------------------------------------
  void pre_forward(std::size_t unit);
  void post_forward(std::size_t unit, std::vector<at::Tensor>& outputs, bool tracked);
  // call_end: the tick at which that call of the unit ended its forward.
  void pre_backward(std::size_t unit, std::int64_t call_end);
  void on_grad_accumulated(std::size_t flat, std::size_t param);

 private:
  void build(torch::nn::Module& model, const torch::optim::Optimizer* optimizer);
  void begin_backward();
  void open_window(Flat& f);
  // defer_sync: a device-to-host copy may stay queued (the caller synchronizes host_copies_ before
  // anything reads master.grad).
  void set_master_grad(Flat& f, bool defer_sync = false);
  void note_master_grad(Flat& f);
  void settle_pending();
  void drop_discarded_grads();
  void abort_backward();
  void zero_untouched(Flat& f);
  void finalize_backward();
  void end_units_started_after(std::int64_t call_end);
  void end_unit(std::size_t unit);
  // Flat fi's gradients of this window are complete: zero-fill what no gradient reached, mark it ready.
  void mark_complete(std::size_t fi);
  // Hands flat fi's gradients of this window to the reducer (with grad_sum, where there is one).
  void mark_ready(std::size_t fi);
  // The accumulation dtype (ShardingSpec::window_dtype: accumulate_dtype, else bf16 under bf16 masters,
  // else the reduce dtype) is wider than f's gradients: a window's backward passes are summed in it.
  c10::ScalarType sum_dtype() const;
  bool sums_wider(const Flat& f) const;
  void add_to_grad_sum(Flat& f);     // grad_sum += grad_full (complete), in sum_dtype()
  void fold_into_grad_sum(Flat& f);  // ... and grad_full goes (NoSync): the next backward starts it afresh
  void forget_unit_calls();          // a forward/backward's unit ticks and ends
  void gather(std::size_t unit, bool async);
  void wait_gather(std::size_t unit);
  void reshard(std::size_t unit);
  void reshard_flat(Flat& f);
  void prefetch(std::size_t unit);
  bool unit_sharded(std::size_t unit) const;
  bool fp8_gathered(const Flat& f) const;
  comm::WorkPtr gather_fp8_async(Flat& f);
  void dequantize_arrived(Flat& f);
  void close_step();
  void quantize_fp8_shards();

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  ShardingSpec spec_;
  Plan plan_;
  c10::Device device_ = c10::kCPU;  // where the flats live (spec_.device, else the parameters' device)
  // device_ is a device apart from host memory: not the CPU, or the CPU taking a device's path under
  // HostCopies::emulate_device_for_tests (offload to host memory then goes through emulated copies).
  bool on_a_device_ = false;
  std::shared_ptr<comm::Communicator> world_, shard_, replicate_, gather_;
  std::shared_ptr<torch::nn::Module> model_;
  std::vector<Flat> flats_;
  std::vector<UnitInfo> units_;
  std::vector<std::shared_ptr<sharding::UnitSlot>> slots_;
  std::unique_ptr<GradReducer> reducer_;
  std::vector<std::size_t> reduce_order_;           // flats_ indices in reducer order
  std::vector<std::size_t> reducer_index_;          // flats_ index -> reducer index (or npos)
  std::vector<std::size_t> fwd_order_, cur_order_;  // unit order of the last / current forward
  std::int64_t tick_ = 0;                           // counts unit calls' starts and ends in a forward
  bool sync_ = true;
  bool more_micro_steps_ = false;  // set_more_micro_steps
  bool hooks_installed_ = false;
  std::vector<std::pair<at::Tensor, const void*>> grad_hooks_;  // ours, to remove only ours
  std::vector<const void*> unit_hooks_;
  std::vector<std::vector<at::Tensor>> group_params_;
  std::unique_ptr<OptimizerOffload> opt_offload_;
  std::unique_ptr<ParamOffload> param_offload_;
  std::vector<std::size_t> opt_region_flat_;  // region -> flats_ index
  std::unique_ptr<HostCopies> host_copies_;   // offload to host memory of a device's masters
  bool host_master(const Flat& f) const;
  // on_reduced adds f's reduced shard to its pending gradient as its bucket finishes (and takes it).
  bool adds_to_pending(const Flat& f) const;
  const at::Tensor& pinned_grad(Flat& f);           // f.host_grad, allocated (pinned) the first time
  void grad_to_host(Flat& f, const at::Tensor& g);  // queues f.host_grad := g
  // Back-pressure on the reduced gradients on their way to the host during backward: the device's
  // copy of each is let go of only once its copy is done, so no more than spec.grad_buckets_in_flight
  // reductions' copies may be pending. Called after each GradReducer::mark_ready (whose finished
  // buckets queued copies: copied_to_host_), it waits for the oldest beyond that (held_for_host_).
  void hold_for_host();
  std::deque<HostCopies::Done> held_for_host_;
  bool copied_to_host_ = false;
  void setup_offload(const torch::optim::Optimizer* optimizer);
  void move_to_device();  // every flat's buffers to device_ (a no-op where they are)
  void fetch_params_ahead(std::size_t unit);
  // params_from_masters' work; offloaded_done: the offloaded step already wrote its flats' values.
  void write_params(bool offloaded_done);
  void sync_node_shared();  // a barrier of the gather group, when any flat is node-shared
  bool in_backward_ = false;
  std::size_t finalize_count_ = 0;
  // spec.step_in_backward: the step of one master, and the thread that runs it while backward goes on.
  std::function<bool(const at::Tensor&)> step_one_;
  std::unique_ptr<StepWorker> step_worker_;
  bool aborting_backward_ = false;              // abort_backward's flush: its results are thrown away
  std::exception_ptr step_error_;               // a step in backward that failed: the next optimizer step throws it
  bool steps_in_backward(const Flat& f) const;  // f's master can take its step as its gradient is final
  void step_in_backward(Flat& f, const at::Tensor& g);  // master.grad := g (or the pinned copy); post its step
  void wait_steps_in_backward();                        // every posted step done (rethrows a step's error)
  void refuse_after_step_in_backward(const char* what) const;
};

}  // namespace accel::zero
