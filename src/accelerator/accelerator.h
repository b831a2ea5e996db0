// accel::Accelerator — the one object a training loop talks to. The loop is written once; the config
// (file, launcher environment or constructor arguments) decides DDP, ZeRO-1/2/3 or FSDP:
//
//   accel::Accelerator acc;                                   // config: ACCEL_CONFIG_FILE or defaults
//   auto model = Net();                                       // any torch::nn::Module
//   torch::optim::AdamW adamw(model->parameters(), 1e-3);
//   accel::DataLoader loader(dataset, {.batch_size = 16, .shuffle = true});
//   auto opt = acc.prepare(model, adamw, loader);             // model: same handle; loader: sharded
//   for (auto& batch : loader) {
//     auto scope = acc.accumulate();                          // sync on the last micro-step
//     acc.backward(loss_fn(model->forward(batch.data), batch.target));
//     if (acc.sync_gradients()) acc.clip_grad_norm_(1.0);
//     opt->step();                                            // no-op until the last micro-step
//     opt->zero_grad();
//   }
//
// prepare() moves the model to device(), makes every rank start from rank 0's weights, builds the
// sharding engine (zero/engine.h) and returns the optimizer to use: the user's optimizer type over
// this rank's master shards, behind AcceleratedOptimizer. The user's own optimizer object is left
// alone (do not step it). One model per Accelerator.
//
// Collectives: prepare, backward (on sync steps), the optimizer's step, clip_grad_norm_, gather*,
// reduce, pad_across_processes, wait_for_everyone, main_process_first, check_trigger,
// get_state_dict, init_trackers, step_metrics (with per_rank_memory) and end_training must be called by
// every rank in the same order.
#pragma once

#include "accelerator/config.h"
#include "accelerator/data_loader.h"
#include "comm/communicator.h"
#include "mixed_precision/autocast.h"
#include "optim/from_config.h"
#include "sharding/sharded_init.h"
#include "tracking/tracker.h"
#include "zero/engine.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace accel {

// Explicit constructor arguments: they win over the launcher's environment and the config file.
struct AcceleratorOptions {
  std::optional<std::string> config_file;
  std::optional<std::string> mixed_precision;  // "no" | "fp16" | "bf16" | "fp8"
  std::optional<std::int64_t> gradient_accumulation_steps;
  // Accelerate's GradientAccumulationPlugin(sync_each_batch): micro-steps that do not step still reduce
  // their gradients and add them to what is pending (Engine::MoreMicroSteps), instead of accumulating
  // them unreduced (no_sync): less memory, since no rank keeps an unsharded gradient between
  // micro-steps (nor the device, under ZeRO-Offload), for a reduction per micro-step. Unset: on under
  // DeepSpeed ZeRO-2/3, which reduce every micro-step (DeepSpeed refuses no_sync there), off otherwise
  // (Accelerate's default).
  std::optional<bool> sync_each_batch;
  std::optional<bool> cpu;  // use the CPU even when CUDA devices exist
  // Name the config keys that have no effect here, in one line on the main process (at construction;
  // config().ignored says why for each).
  bool report_ignored_keys = true;
  // Checkpoints (Accelerate's ProjectConfiguration): save_state()/load_state() without a directory
  // use <project_dir>/checkpoints/checkpoint_<i>, keeping at most total_limit of them (0: all).
  // (Also project_dir in the config file; this one wins.)
  std::string project_dir;
  // After prepare(): load the newest checkpoint of <project_dir>/checkpoints when there is one, so that a
  // job started again (accel launch --max_restarts) goes on from it with no code of its own. Objects
  // registered for checkpointing after prepare() are not restored by it. Unset: ACCEL_AUTO_RESUME when
  // set, else the config's resume_from_checkpoint ("latest", or a directory to load at every start).
  std::optional<bool> auto_resume;
  int total_limit = 0;
  // --- trackers (Accelerate's log_with): names ("tensorboard", "jsonl", "csv", "all", or one given
  // to tracking::register_tracker) and/or tracker objects. Empty: the config file's log_with. Those
  // that write files go to <project_dir>/<project_name> (init_trackers), so they need project_dir.
  std::vector<tracking::LogWith> log_with;
};

// The config an Accelerator built with these options starts from (resolve_config over its explicit
// arguments), before it knows the ranks and the device. No collective: a program can check its
// options with it before any rank exists.
AcceleratorConfig resolve_config(const AcceleratorOptions& options);
// Where its automatic checkpoints and trackers' files go: options.project_dir, else the config's.
inline const std::string& resolve_project_dir(const AcceleratorOptions& options, const AcceleratorConfig& cfg) {
  return options.project_dir.empty() ? cfg.project_dir : options.project_dir;
}
// The trackers such an Accelerator runs, given that config: options.log_with, else the config's
// log_with, "all" expanded and each name once. Throws ConfigError for a name no tracker is registered
// under, or a tracker that writes files without a project directory (options.project_dir, else the
// config's). No collective either: the Accelerator's constructor checks its options with it.
std::vector<tracking::LogWith> resolve_log_with(const AcceleratorOptions& options, const AcceleratorConfig& cfg);

class TuneRun;  // accelerator/tuning.h

// What the training loop and the Accelerator share about the current micro-step.
struct GradientState {
  std::int64_t accumulation_steps = 1;
  std::int64_t micro_step = 0;  // micro-steps since the last sync (Accelerator::step() counts optimizer steps)
  bool sync_gradients = true;   // this micro-step reduces and steps
  bool step_was_skipped = false;
  std::int64_t skipped_steps = 0;  // optimizer steps skipped on an fp16 overflow, in all
  // The gradient norm of the last clip (Accelerator::clip_grad_norm_ or the config's clipping in the
  // step); NaN until one (fp16 clipping inside the step does not report it).
  double last_grad_norm = std::numeric_limits<double>::quiet_NaN();
  std::int64_t optimizer_steps = 0;                   // steps the optimizer took (saved in checkpoints)
  std::vector<std::shared_ptr<LoaderState>> loaders;  // prepared loaders
  std::shared_ptr<TuneRun> tune;                      // ACCEL_TUNE: `accel tune` measures this run
  // A checkpoint's learning rates, held back for a schedule that may be prepared after the load (it
  // steps to them from the program's own); the first optimizer step without one sets them.
  std::vector<double> pending_lrs;
  bool end_of_dataloader() const;
  // Real samples in the current batch of the loader iterating when it holds padding, else -1.
  std::int64_t remainder() const;
};

// The prepared optimizer: steps only on sync micro-steps, clipping first when the config says so.
class LossScaling;  // accelerator/precision.h

class AcceleratedOptimizer {
 public:
  AcceleratedOptimizer(std::shared_ptr<torch::optim::Optimizer> inner, std::shared_ptr<zero::Engine> engine,
                       std::shared_ptr<GradientState> state, std::optional<double> clip,
                       std::shared_ptr<LossScaling> scaling = nullptr);
  // Steps the sharded optimizer on sync micro-steps; no-op otherwise (gradient accumulation).
  // fp16: first checks every rank's gradients for inf/nan (one all-reduce) and unscales them; on
  // an overflow the step is skipped on every rank (parameters and optimizer state unchanged, the
  // gradients dropped), step_was_skipped() says so, and the loss scale drops (DeepSpeed's rule).
  void step();
  // Clears gradients after a step; no-op on non-sync micro-steps (they are still accumulating).
  void zero_grad(bool set_to_none = true);
  // The optimizer that steps the master shards (its type is the user's: dynamic_cast works). Build
  // LR schedulers over this one.
  torch::optim::Optimizer& inner() { return *inner_; }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() { return inner_->param_groups(); }
  bool step_was_skipped() const { return state_->step_was_skipped; }

 private:
  std::shared_ptr<torch::optim::Optimizer> inner_;
  std::shared_ptr<zero::Engine> engine_;
  std::shared_ptr<GradientState> state_;
  std::optional<double> clip_;
  std::shared_ptr<LossScaling> scaling_;
};

// A prepared LR scheduler: steps once per optimizer step, never on non-sync micro-steps or when the
// optimizer step was skipped (fp16 overflow).
class AcceleratedScheduler {
 public:
  AcceleratedScheduler(std::shared_ptr<torch::optim::LRScheduler> inner, std::shared_ptr<GradientState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}
  void step();
  torch::optim::LRScheduler& inner() { return *inner_; }
  std::int64_t steps() const { return steps_; }
  // Resuming: the inner scheduler as if it had taken n steps in all (schedules are functions of the
  // step count): accel's (optim::IterationSchedule) set there, earlier or later; others stepped
  // forward (they cannot go back: a warning).
  void fast_forward(std::int64_t n);

 private:
  std::shared_ptr<torch::optim::LRScheduler> inner_;
  std::shared_ptr<GradientState> state_;
  std::int64_t steps_ = 0;
};

// Builds a scheduler over the prepared optimizer (prepare's 4-argument form).
using SchedulerFactory = std::function<std::shared_ptr<torch::optim::LRScheduler>(torch::optim::Optimizer&)>;

struct Prepared {
  std::shared_ptr<AcceleratedOptimizer> optimizer;
  std::shared_ptr<AcceleratedScheduler> scheduler;
};

class Accelerator {
 public:
  // Resolves the config (explicit > ACCEL_* environment > file > default, see config.h), opens the
  // world communicator and picks the device. Throws ConfigError for a bad config.
  explicit Accelerator(AcceleratorOptions opts = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // --- prepare ------------------------------------------------------------------------------------
  template <class M>
  std::shared_ptr<AcceleratedOptimizer> prepare(M& model, torch::optim::Optimizer& optimizer) {
    return prepare_model(module_ptr(model), optimizer, std::nullopt);
  }
  template <class M, class Dataset>
  std::shared_ptr<AcceleratedOptimizer> prepare(M& model, torch::optim::Optimizer& optimizer,
                                                DataLoader<Dataset>& loader) {
    prepare_data_loader(loader);
    return prepare_model(module_ptr(model), optimizer, loader.plan().per_process_batch());
  }
  template <class M, class Dataset>
  Prepared prepare(M& model, torch::optim::Optimizer& optimizer, DataLoader<Dataset>& loader,
                   const SchedulerFactory& make_scheduler) {
    Prepared p;
    p.optimizer = prepare(model, optimizer, loader);
    p.scheduler = prepare_scheduler(make_scheduler(p.optimizer->inner()));
    return p;
  }
  // Shards the loader over the ranks, moves its batches to device() and tracks its epoch ends.
  template <class Dataset>
  void prepare_data_loader(DataLoader<Dataset>& loader) {
    auto st = std::make_shared<LoaderState>();
    loader.shard(process_index(), num_processes(), device(), st, shrink_factor_);
    state_->loaders.push_back(std::move(st));
    loader_prepared();
  }
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler(std::shared_ptr<torch::optim::LRScheduler> scheduler);

  // --- the config's optimizer and schedule (a DeepSpeed config's "optimizer" and "scheduler") ------
  // As Accelerate's DummyOptim and DummyScheduler: the config file says which optimizer and schedule
  // run, the program which values "auto" stands for and what runs without a block
  // (optim/from_config.h). The optimizer, over `params`, is then passed to prepare() as any other:
  //   auto adamw = acc.create_optimizer(model->parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  //   auto opt = acc.prepare(model, *adamw, loader);
  //   auto sched = acc.create_scheduler({.total_num_steps = steps, .warmup_num_steps = steps / 10});
  // A program that passes its own optimizer or scheduler keeps it; a block it leaves unused is
  // warned about (at prepare(), at prepare_scheduler(), or at the first backward without a scheduler).
  std::shared_ptr<torch::optim::Optimizer> create_optimizer(const std::vector<at::Tensor>& params,
                                                            const optim::OptimizerDefaults& defaults = {});
  // Param groups with their own lr or weight_decay (a group without weight decay, as Accelerate's
  // DummyOptim takes them).
  std::shared_ptr<torch::optim::Optimizer> create_optimizer(const std::vector<optim::ParamGroup>& groups,
                                                            const optim::OptimizerDefaults& defaults = {});
  // Over the prepared optimizer (after prepare()), and prepared: the scheduler prepare_scheduler returns.
  std::shared_ptr<AcceleratedScheduler> create_scheduler(const optim::SchedulerDefaults& defaults = {});

  // --- the step -----------------------------------------------------------------------------------
  // loss / gradient_accumulation_steps (fp16: times the loss scale), then backward through the
  // engine (reducing on sync steps).
  void backward(const at::Tensor& loss);
  // One micro-step of gradient accumulation: sync_gradients() is true on every
  // gradient_accumulation_steps-th micro-step and on the loader's last batch; until then backward
  // accumulates locally (or reduces and adds up, sync_each_batch()) and the optimizer does not
  // step. Keep the returned scope alive for the micro-step (forward, backward, step).
  class AccumulateScope {
   public:
    explicit AccumulateScope(Accelerator& a);
    ~AccumulateScope();
    AccumulateScope(const AccumulateScope&) = delete;
    AccumulateScope& operator=(const AccumulateScope&) = delete;
    AccumulateScope(AccumulateScope&& o) noexcept : a_(o.a_), active_(o.active_) { o.active_ = false; }

   private:
    Accelerator& a_;
    bool active_ = true;
  };
  [[nodiscard]] AccumulateScope accumulate() { return AccumulateScope(*this); }
  template <class M>
  [[nodiscard]] AccumulateScope accumulate(M&) {
    return AccumulateScope(*this);
  }
  bool sync_gradients() const { return state_->sync_gradients; }
  bool sync_each_batch() const;  // AcceleratorOptions::sync_each_batch as resolved
  std::int64_t gradient_accumulation_steps() const { return state_->accumulation_steps; }
  bool optimizer_step_was_skipped() const { return state_->step_was_skipped; }

  // Mixed precision autocast for a block, on device()'s autocast (CPU or CUDA): bf16 (bf16, fp8) or
  // fp16 (fp16); nothing in fp32. Put forward and the loss inside it. force_fp32: autocast off for
  // the block (nested inside one: ops run in their inputs' dtype, so cast inputs to fp32 there;
  // parameters stay in the compute dtype). See mixed_precision/autocast.h.
  class AutocastGuard {
   public:
    AutocastGuard() = default;
    explicit AutocastGuard(mixed_precision::AutocastScope s) : scope_(std::move(s)) {}

   private:
    std::optional<mixed_precision::AutocastScope> scope_;
  };
  [[nodiscard]] AutocastGuard autocast(bool force_fp32 = false);
  // fp16: the current loss scale (backward multiplies the loss by it); nullopt otherwise.
  std::optional<double> loss_scale() const;

  // Global gradient norm over every rank (after the reduction), clipped to max_norm; returns the
  // norm before clipping. On a non-sync micro-step gradients are not reduced yet: returns NaN and
  // does nothing. Under DEEPSPEED with gradient_clipping set, the step clips to that value and this
  // only measures (as in Accelerate).
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);
  // Clamps every gradient to [-clip_value, clip_value]. DDP and single process only: throws under
  // sharded strategies (as Accelerate does for DeepSpeed and FSDP).
  void clip_grad_value_(double clip_value);

  // --- collectives on tensors -----------------------------------------------------------------------
  // Every rank's tensor concatenated along dim 0 in rank order (0-dim tensors count as [1]); shapes
  // must agree across ranks (pad_across_processes first otherwise).
  at::Tensor gather(const at::Tensor& t);
  // gather(), then on the last batch of a prepared loader drops the rows that are padding
  // duplicates (even_batches), so each sample counts once.
  at::Tensor gather_for_metrics(const at::Tensor& t);
  // "sum" | "mean" | "max" | "min" across ranks; every rank gets the result (a new tensor).
  at::Tensor reduce(const at::Tensor& t, const std::string& reduction = "sum");
  // Every rank's strings (any bytes: generated text, JSON records) concatenated in rank order, on every
  // rank (Accelerate's gather_object); lists and strings may differ in length across ranks.
  std::vector<std::string> gather_object(const std::vector<std::string>& items);
  // gather_object(), then on the last batch of a prepared loader drops the entries of padding
  // duplicates (even_batches), as gather_for_metrics does rows: one string per sample of the batch.
  std::vector<std::string> gather_for_metrics(const std::vector<std::string>& items);
  // Rank `from`'s string on every rank (Accelerate's broadcast_object_list); the others' argument
  // is not read.
  std::string broadcast_object(const std::string& object, int from = 0);
  // Pads `t` along `dim` to the largest size across ranks with pad_value (at the end, or the start).
  at::Tensor pad_across_processes(const at::Tensor& t, std::int64_t dim = 0, double pad_value = 0,
                                  bool pad_first = false);
  void wait_for_everyone();

  // --- processes ------------------------------------------------------------------------------------
  int process_index() const { return world_->rank(); }
  int local_process_index() const { return world_->topology().local_rank; }
  int num_processes() const { return world_->size(); }
  bool is_main_process() const { return process_index() == 0; }
  bool is_local_main_process() const { return local_process_index() == 0; }
  bool is_last_process() const { return process_index() == num_processes() - 1; }
  c10::Device device() const { return device_; }
  const AcceleratorConfig& config() const { return cfg_; }
  DistributedType distributed_type() const { return cfg_.distributed_type; }
  MixedPrecision mixed_precision() const { return cfg_.mixed_precision; }
  const std::shared_ptr<comm::Communicator>& world() const { return world_; }
  // The engine of the prepared model (null before prepare).
  const std::shared_ptr<zero::Engine>& engine() const { return engine_; }

  // Prints on the local main process only (once per machine), with a newline.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream os;
    (os << ... << args);
    std::cout << os.str() << std::endl;
  }
  // The main process runs the block first, the others after it (e.g. to build a dataset cache once).
  class MainProcessFirst {
   public:
    explicit MainProcessFirst(Accelerator& a);
    ~MainProcessFirst() noexcept(false);

   private:
    Accelerator& a_;
  };
  [[nodiscard]] MainProcessFirst main_process_first() { return MainProcessFirst(*this); }
  // This rank's contiguous part of `items` (the first size % N ranks get one more). apply_padding:
  // every rank gets ceil(size / N) items, the short ones repeating the last item.
  template <class T>
  std::vector<T> split_between_processes(const std::vector<T>& items, bool apply_padding = false) const {
    auto [b, e] = split_range(static_cast<std::int64_t>(items.size()));
    std::vector<T> out(items.begin() + b, items.begin() + e);
    if (apply_padding && !items.empty()) {
      const std::int64_t want = (static_cast<std::int64_t>(items.size()) + num_processes() - 1) / num_processes();
      while (static_cast<std::int64_t>(out.size()) < want) out.push_back(items.back());
    }
    return out;
  }
  // Along dim 0 of a tensor.
  at::Tensor split_between_processes(const at::Tensor& t, bool apply_padding = false) const;

  // Early stopping across ranks: set_trigger() on any rank makes the next check_trigger() return
  // true on every rank (collective), then resets.
  void set_trigger() { trigger_ = true; }
  bool check_trigger();

  // --- the model --------------------------------------------------------------------------------
  // The model object is never wrapped: returns it as given.
  template <class M>
  M& unwrap_model(M& model) const {
    return model;
  }
  // Full weights (parameters, then buffers, by name), gathered unit by unit; on the main process
  // only (other ranks get an empty list). Collective.
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict();
  // Finishes the trackers (their files complete and closed), then waits for every rank; afterwards the
  // Accelerator does no more collectives.
  void end_training();

  // --- trackers and metrics (src/tracking/) --------------------------------------------------------
  // Collective. Builds the log_with trackers for a run named `project_name` (files go to
  // <project_dir>/<project_name>), starts them and stores `config` (the run's hyperparameters) in
  // each. Trackers that are main_process_only (the built-in ones) exist on the main process only.
  // init_kwargs: per tracker name, its options (e.g. {"jsonl", {{"filename", "train.jsonl"}}}); an
  // unknown option is an error. A tracker that cannot start (an unwritable directory) throws on every
  // rank. Calling it again replaces the trackers (the old ones are finished first).
  void init_trackers(const std::string& project_name, const tracking::Values& config = {},
                     const std::map<std::string, std::map<std::string, std::string>>& init_kwargs = {});
  // One record to every tracker this process runs (the main process, for the built-in ones);
  // `step` defaults to step() (optimizer steps). Not collective.
  void log(const tracking::Values& values, std::optional<std::int64_t> step = std::nullopt);
  // A histogram of a tensor's elements (e.g. a weight, a gradient) to the trackers that draw them
  // (tensorboard). Not collective: give a tensor this process holds whole.
  void log_histogram(const std::string& tag, const at::Tensor& values, std::optional<std::int64_t> step = std::nullopt);
  // The tracker of that name (or of that object's name()); throws naming the active ones.
  tracking::Tracker& get_tracker(const std::string& name);
  // <project_dir>/<project_name> once init_trackers ran ("" before, or without project_dir).
  const std::string& logging_dir() const { return logging_dir_; }
  // Where automatic checkpoints and the trackers' files go: AcceleratorOptions::project_dir, else the
  // config file's project_dir ("" when neither names one).
  const std::string& project_dir() const { return opts_.project_dir; }

  // What Accelerator::step_metrics reports, and what it needs told.
  struct StepMetricsOptions {
    std::optional<double> loss;          // the user's loss (e.g. averaged over the accumulation window)
    std::int64_t tokens_per_sample = 0;  // > 0: tokens_per_s too (samples_per_s * this)
    // Samples per optimizer step over all ranks; default: the prepared loader's batch per process x
    // processes x gradient_accumulation_steps.
    std::optional<std::int64_t> samples_per_step;
    // Every rank's peak memory by category (base/memory.h: needs the counting allocator installed).
    // Collective (one small all-gather) when on with more than one process.
    bool per_rank_memory = true;
  };
  // The metrics accel knows, as one record for log() (names as in docs/trackers.md):
  // optimizer_step, loss, lr (lr/group<i> for further groups), grad_norm (when clipped), loss_scale and
  // skipped_steps (fp16), and, over the optimizer steps since the previous call: step_time_s,
  // samples_per_s, tokens_per_s, comm/<group>/{sent,received}_bytes_per_step (this rank's
  // communicators: world, shard, replicate, gather, each once), memory/rank<r>/<category>_peak_mib.
  tracking::Values step_metrics(const StepMetricsOptions& options);
  tracking::Values step_metrics() { return step_metrics(StepMetricsOptions{}); }

  // --- sharded construction (DeepSpeed's zero.Init) --------------------------------------------------
  // Keep the returned scope alive while building the model: each module marked with accel::unit is
  // sharded over the ranks as soon as it is built (rank 0's values win), so a model larger than one
  // rank's memory can be constructed; prepare() gives each unit its values back one at a time while
  // sharding it. Collective (every rank builds the same model). On a device the model is built in host
  // memory, and prepare() moves each unit there as this rank's shard (ZeRO-3, FULL_SHARD, HYBRID_SHARD
  // over several ranks, and offloaded parameters); where nothing shards it there, the scope shards
  // nothing (each rank builds the model whole and prepare() moves it, with rank 0's values).
  [[nodiscard]] std::unique_ptr<sharding::ShardedInit> sharded_init();

  // --- checkpoints (src/checkpoint/) ----------------------------------------------------------------
  // Collective. Saves the model and optimizer state sharded (each rank writes its own shards, with
  // an index of every parameter's full shape and where each slice lives), the scheduler, the
  // loaders' positions, every rank's RNG state, the step counter and the registered objects.
  // Atomic: written beside `dir` and renamed into place, so a crash leaves the previous checkpoint
  // intact. Without `dir`: the next <project_dir>/checkpoints/checkpoint_<i>. Returns the directory.
  // full: rank 0 writes every tensor whole instead (gathered one unit at a time); load_state reads
  // either kind. Not given: the config decides (fsdp_state_dict_type FULL_STATE_DICT: full;
  // SHARDED_STATE_DICT, LOCAL_STATE_DICT or unset: sharded).
  std::string save_state(const std::string& dir = "", std::optional<bool> full = std::nullopt);
  // Collective. Loads a checkpoint saved at any world size under any strategy (resharding on load,
  // optimizer moments included); the prepared loaders resume where they were. Without `dir`: the
  // newest automatic checkpoint. Throws checkpoint::CheckpointError naming the file and the problem,
  // with nothing changed, for a missing, truncated or corrupted checkpoint.
  void load_state(const std::string& dir = "");
  // Saved by rank 0 with every checkpoint and handed back on load_state (on every rank).
  void register_for_checkpointing(const std::string& name, std::function<std::string()> save,
                                  std::function<void(const std::string&)> load);
  // Optimizer steps taken (restored by load_state).
  std::int64_t step() const { return state_->optimizer_steps; }
  // Collective. Full weights as Hugging Face safetensors in `dir` (model.safetensors, or
  // model-0000k-of-0000n.safetensors + model.safetensors.index.json past max_shard_size bytes),
  // gathered unit by unit: rank 0 never holds more than one unit beyond its shard. Returns the files.
  template <class M>
  std::vector<std::string> save_model(M& model, const std::string& dir, std::int64_t max_shard_size = 10'000'000'000) {
    check_prepared(module_ptr(model));
    return save_model_files(dir, max_shard_size);
  }
  // Accelerate's save(obj, f) for small objects (metrics, a tokenizer's vocabulary, an EMA copy):
  // written by the main process only, atomically (path.tmp, fsync, rename: a reader never sees half a
  // file, and a failed save leaves the old one). Not collective: the other ranks return at once, so
  // call wait_for_everyone() before another rank reads the file (Accelerate's rule too). Tensors go
  // as safetensors, copied to the CPU from any device: a map under its names, one tensor under the
  // name "tensor"; text as its bytes. The parent directory must exist. Throws std::runtime_error
  // naming the path on the main process when writing fails.
  void save(const std::map<std::string, at::Tensor>& tensors, const std::string& path) const;
  void save(const at::Tensor& tensor, const std::string& path) const;
  void save(std::string_view text, const std::string& path) const;
  // Collective. Loads safetensors weights (a file, or a directory as save_model writes it) into the
  // prepared model: each rank reads only the byte ranges of its own shards. Names and shapes must
  // match; errors name the tensor and the file, and change nothing.
  template <class M>
  void load_model(M& model, const std::string& path_or_dir) {
    check_prepared(module_ptr(model));
    load_model_files(path_or_dir);
  }

 private:
  template <class M>
  static std::shared_ptr<torch::nn::Module> module_ptr(torch::nn::ModuleHolder<M>& m) {
    return m.ptr();
  }
  template <class M>
  static std::shared_ptr<torch::nn::Module> module_ptr(std::shared_ptr<M>& m) {
    return m;
  }
  std::shared_ptr<AcceleratedOptimizer> prepare_model(std::shared_ptr<torch::nn::Module> model,
                                                      torch::optim::Optimizer& optimizer,
                                                      std::optional<std::int64_t> micro_batch);
  std::pair<std::int64_t, std::int64_t> split_range(std::int64_t n) const;
  void check_prepared(const std::shared_ptr<torch::nn::Module>& model) const;
  std::vector<std::string> save_model_files(const std::string& dir, std::int64_t max_shard_size);
  void load_model_files(const std::string& path_or_dir);
  void begin_micro_step();
  void end_micro_step();

  AcceleratorConfig cfg_;
  std::shared_ptr<comm::Communicator> world_;
  c10::Device device_ = c10::Device(c10::kCPU);
  std::shared_ptr<GradientState> state_ = std::make_shared<GradientState>();
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<zero::Engine> engine_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;  // the prepared (inner) optimizer
  std::shared_ptr<AcceleratedScheduler> scheduler_;
  std::weak_ptr<torch::optim::Optimizer> created_optimizer_;  // create_optimizer's latest
  bool creating_scheduler_ = false;                           // prepare_scheduler called by create_scheduler
  bool scheduler_block_noted_ = false;  // the first backward without a scheduler warned of an unused scheduler block
  std::int64_t resumed_scheduler_steps_ = 0;  // a load_state before prepare_scheduler: its steps
  // A loader's saved position: its epoch, the batches of it consumed, and the global batch then.
  struct SavedPosition {
    std::int64_t epoch = 0, batches = 0, global_batch = 0;
  };
  // Positions the automatic resume read for loaders not prepared yet (by prepare order: it runs in
  // prepare(model, optimizer), before a prepare_data_loader): each applies when its loader is. An
  // explicit load_state, as Accelerate's, restores the loaders prepared by then only.
  std::vector<std::optional<SavedPosition>> pending_positions_;
  // load_state; for_later_loaders (the automatic resume): positions of loaders not prepared yet wait
  // in pending_positions_.
  void restore_state(const std::string& dir, bool for_later_loaders);
  void resume_loader(std::size_t index, LoaderState& loader, const SavedPosition& saved);
  void loader_prepared();
  std::shared_ptr<LossScaling> scaling_;  // fp16 only
  struct Registered {
    std::function<std::string()> save;
    std::function<void(const std::string&)> load;
  };
  std::map<std::string, Registered> registered_;
  AcceleratorOptions opts_;
  std::optional<zero::Engine::NoSync> no_sync_;                   // micro-steps that do not step, either
  std::optional<zero::Engine::MoreMicroSteps> more_micro_steps_;  // way (sync_each_batch)
  bool trigger_ = false;
  bool ended_ = false;
  // Trackers and step metrics (accelerator_tracking.cpp).
  void finish_trackers();
  void maybe_auto_resume();                                   // end of prepare: AcceleratorOptions::auto_resume
  void check_log_with();                                      // at construction: names known, project_dir where needed
  std::vector<tracking::LogWith> log_with_;                   // options' or the config's
  std::vector<std::shared_ptr<tracking::Tracker>> trackers_;  // those this process runs
  std::string logging_dir_;
  // A job `accel launch --min_nodes` restarted on fewer ranks than it started with
  // (ACCEL_INITIAL_WORLD_SIZE): initial / now. Gradient accumulation is this many times the config's
  // and split_batches loaders read batches this many times smaller, so every rank's micro-batch and
  // every optimizer step's samples stay what they were.
  int shrink_factor_ = 1;
  std::int64_t micro_batch_ = 0;  // samples per process per micro-step (the prepared loader's), 0: unknown
  struct MetricsMark {
    bool set = false;
    std::int64_t step = 0;
    double time = 0;
    std::vector<std::pair<std::string, comm::Counters>> counters;
  } metrics_mark_;
};

}  // namespace accel
