#include "accelerator/accelerator.h"
#include "base/error.h"

#include "accelerator/precision.h"
#include "accelerator/tuning.h"
#include "base/env.h"
#include "base/log.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/model_export.h"
#include "checkpoint/sharded_state.h"
#include "comm/cuda_comm.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "dispatch/dispatch.h"
#include "mixed_precision/float8_linear.h"
#include "optim/lr_schedules.h"
#include "zero/host_copies.h"
#include "zero/optimizer_offload.h"
#include "zero/param_offload.h"
#include "zero/sharded_optimizer.h"
#include "zero/unit_report.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

namespace accel {

// ---------------------------------------------------------------------------------------------------
// GradientState, AcceleratedOptimizer, AcceleratedScheduler

namespace {
// The loader iterating now: of those inside an epoch, the one whose epoch began last (an eval loop
// inside a training epoch; a loop left by `break` stays "inside" but older).
const LoaderState* active_loader(const std::vector<std::shared_ptr<LoaderState>>& loaders) {
  const LoaderState* best = nullptr;
  for (const auto& l : loaders)
    if (l->in_epoch && (!best || l->started > best->started)) best = l.get();
  return best;
}
}  // namespace

bool GradientState::end_of_dataloader() const {
  const LoaderState* l = active_loader(loaders);
  return l && l->end_of_dataloader;
}

std::int64_t GradientState::remainder() const {
  const LoaderState* l = active_loader(loaders);
  return l ? l->remainder : -1;
}

AcceleratedOptimizer::AcceleratedOptimizer(std::shared_ptr<torch::optim::Optimizer> inner,
                                           std::shared_ptr<zero::Engine> engine, std::shared_ptr<GradientState> state,
                                           std::optional<double> clip, std::shared_ptr<LossScaling> scaling)
    : inner_(std::move(inner)),
      engine_(std::move(engine)),
      state_(std::move(state)),
      clip_(clip),
      scaling_(std::move(scaling)) {}

void AcceleratedOptimizer::step() {
  if (!state_->sync_gradients) return;
  state_->step_was_skipped = false;
  if (!state_->pending_lrs.empty()) {  // resumed, and no schedule was prepared after all: the saved rates
    auto& groups = inner_->param_groups();
    for (std::size_t g = 0; g < groups.size() && g < state_->pending_lrs.size(); ++g)
      groups[g].options().set_lr(state_->pending_lrs[g]);
    state_->pending_lrs.clear();
  }
  std::optional<double> clip;
  if (clip_ && *clip_ > 0) clip = clip_;
  if (scaling_) {
    if (scaling_->finish_step(clip)) {  // an overflow on some rank: every rank skips
      engine_->skip_step();
      state_->step_was_skipped = true;
      ++state_->skipped_steps;
      if (state_->tune) state_->tune->after_step();
      return;
    }
  } else if (clip) {
    state_->last_grad_norm = engine_->clip_grad_norm(*clip);
  }
  inner_->step();
  ++state_->optimizer_steps;
  if (state_->tune) state_->tune->after_step();
}

void AcceleratedOptimizer::zero_grad(bool set_to_none) {
  if (!state_->sync_gradients) return;
  inner_->zero_grad(set_to_none);
}

void AcceleratedScheduler::step() {
  if (!state_->sync_gradients || state_->step_was_skipped) return;
  inner_->step();
  ++steps_;
}

void AcceleratedScheduler::fast_forward(std::int64_t n) {
  if (auto* s = dynamic_cast<optim::IterationSchedule*>(inner_.get())) {  // accel's: either way, exactly
    s->set_steps(n);
    steps_ = n;
    return;
  }
  if (steps_ > n)
    log::warning(
        fmt::format("load_state: the scheduler has taken {} steps, past the checkpoint's {}; a libtorch "
                    "scheduler cannot go back (accel's schedules can), so its learning rates stay as they are",
                    steps_, n));
  for (; steps_ < n; ++steps_) inner_->step();
}

// ---------------------------------------------------------------------------------------------------
// Construction

namespace {
c10::Device pick_device(const AcceleratorConfig& cfg, comm::Communicator& world) {
  const bool cuda = at::detail::getCUDAHooks().hasCUDA();
  if (cfg.distributed_type == DistributedType::MultiGpu && (!cuda || cfg.use_cpu))
    throw ConfigError(
        fmt::format("{}: distributed_type MULTI_GPU needs CUDA devices{}; use MULTI_CPU (or FSDP / "
                    "DEEPSPEED, which run on either)",
                    cfg.source, cuda ? ", but use_cpu is true" : " and this machine has none"));
  if (!cuda || cfg.use_cpu || cfg.distributed_type == DistributedType::MultiCpu) return c10::Device(c10::kCPU);
  // Local rank k takes cuda:(k % devices). More ranks on a node than GPUs: they share them, and their
  // collectives on CUDA tensors are staged through host memory (comm/cuda_comm.h), since NCCL cannot
  // put two ranks on one device; refused where ACCEL_CUDA_COMM=nccl asks for NCCL anyway. A simulated
  // topology (ACCEL_RANKS_PER_NODE) says nothing about machines: every rank is then taken to be on
  // this one.
  const comm::Topology& topo = world.topology();
  const int n = at::detail::getCUDAHooks().deviceCount();
  const int ranks_here = topo.ranks_on_this_machine();
  const int index = topo.rank_on_this_machine();
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(index % n));
  // Who shares a GPU goes by the GPUs' UUIDs, as the Communicator decides: a rank given its own GPU by
  // CUDA_VISIBLE_DEVICES sees one device, though the node has more ranks than that. Where a rank does
  // not know its GPU's UUID (no NCCL in the build), by the count.
  int sharing = 0;
  if (world.size() > 1) {
    const std::string uuid = comm::cuda_device_uuid(device.index());
    sharing = std::max(comm::ranks_sharing_a_gpu(world, uuid), comm::ranks_sharing_by_count(topo, n, uuid));
  }
  if (sharing > 0) {
    const std::string where = cfg.source.empty() ? std::string("the configuration") : cfg.source;
    try {
      comm::choose_cuda_comm(comm::cuda_comm_requested(), comm::nccl_compiled(), sharing);
    } catch (const comm::InvalidArgument& e) {
      throw ConfigError(fmt::format(
          "{}: {} ranks share a CUDA device ({} on this node, {} device(s) visible here): {}. Launch at most one "
          "rank per GPU (accel launch --num_processes), make more devices visible (CUDA_VISIBLE_DEVICES), or train "
          "on the CPU (use_cpu: true, or ACCEL_USE_CPU=1)",
          where, sharing, ranks_here, n, e.what()));
    }
    if (world.rank() == 0)
      log::warning(fmt::format(
          "{} ranks share a CUDA device ({} on this node, {} device(s) visible): collectives on CUDA tensors "
          "are staged through host memory (ACCEL_CUDA_COMM; NCCL needs one GPU per rank), which is slower",
          sharing, ranks_here, n));
  }
  return device;
}

// Offloaded state brought into memory for a checkpoint's duration (Engine::stage_offloaded). What a
// load put there goes back to the files on commit(); anything else (a save, a load that threw) is
// dropped.
class OffloadStaging {
 public:
  OffloadStaging(zero::Engine* e, torch::optim::Optimizer* opt) : e_(e), opt_(opt) {
    if (e_) e_->stage_offloaded(opt_);
  }
  void commit() {
    if (e_) std::exchange(e_, nullptr)->unstage_offloaded(opt_, /*write_back=*/true);
  }
  ~OffloadStaging() {
    if (e_) e_->unstage_offloaded(opt_, /*write_back=*/false);
  }

 private:
  zero::Engine* e_;
  torch::optim::Optimizer* opt_;
};

std::string where(const AcceleratorConfig& cfg) {
  return cfg.source.empty() ? std::string("the configuration") : cfg.source;
}

// Offload goes into the spec: to nvme from any device, to cpu from a device (the optimizer state and
// the parameter shards in host memory). CPU offload on a CPU run (no effect) is added to the ignored
// keys, with why. (Tests: a CPU run taking a device's path, zero::HostCopies' emulated device, keeps it.)
void check_supported(AcceleratorConfig& cfg, c10::Device device) {
  const bool host = device.is_cpu() && !zero::HostCopies::emulating_device_for_tests();
  auto to = [&](const std::string& d) {
    return d == "nvme"           ? zero::OffloadDevice::Nvme
           : d == "cpu" && !host ? zero::OffloadDevice::Cpu
                                 : zero::OffloadDevice::None;
  };
  cfg.spec.offload.optimizer = to(cfg.offload_optimizer_device);
  cfg.spec.offload.param = to(cfg.offload_param_device);
  if (host && (cfg.offload_optimizer_device == "cpu" || cfg.offload_param_device == "cpu"))
    cfg.ignored.push_back(
        "offload to cpu: training runs on the CPU, where parameters and optimizer state "
        "already live");
}
// Shard groups the world cannot hold, refused at construction with the config named (zero::groups_for
// refuses them too, for a program that builds an engine itself): HYBRID_SHARD on nodes of different
// sizes (collective), groups of n ranks that do not divide the world, and a parallelism_config whose
// dp_replicate_size x dp_shard_size is not the job's number of processes (`initial_world`: the size the
// job started with, which a job restarted on fewer ranks no longer has).
void check_shard_groups(const AcceleratorConfig& cfg, comm::Communicator& world, int initial_world) {
  const std::string source = shard_group_source(cfg);
  if (cfg.parallelism && cfg.parallelism->processes() != initial_world)
    throw ConfigError(fmt::format(
        "{}: {} is {} processes, but the job has {}; launch {} processes, or make the "
        "sizes multiply to {}",
        where(cfg), source, cfg.parallelism->processes(), initial_world, cfg.parallelism->processes(), initial_world));
  try {
    if (const int n = cfg.spec.groups_of_ranks()) zero::check_shard_groups(n, world.size());
  } catch (const accel::InvalidArgumentError& e) {
    throw ConfigError(fmt::format("{}: {}{}", where(cfg), source.empty() ? "" : source + ": ", e.what()));
  }
  try {
    if (cfg.spec.groups_by_node()) zero::check_hybrid_nodes(world, cfg.spec);
  } catch (const accel::InvalidArgumentError& e) {
    throw ConfigError(fmt::format("{}: {}", where(cfg), e.what()));
  }
}

// What the run decided, for ACCEL_LOG_LEVEL=info (the main process logs them once): the transport of
// each kind of tensor, this rank's cores and threads, the ACCEL_* variables set in the environment.
void log_start(comm::Communicator& world, c10::Device device) {
  if (!log::enabled(log::Level::Info)) return;
  const auto& topo = world.topology();
  std::string transport = fmt::format("transport: CPU collectives over {} ({} rank(s) on {} node(s))",
                                      world.backend_name(at::empty({0})), world.size(), topo.num_nodes);
  if (device.is_cuda())
    transport += "; CUDA collectives: " +
                 comm::describe_cuda_comm(topo.ranks_on_this_machine(), at::detail::getCUDAHooks().deviceCount());
  log::info(transport);
  cpu_set_t set;
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : -1;
  log::info(fmt::format("binding: rank {} on {} CPU(s), {} intra-op thread(s), device {}", world.rank(), cpus,
                        at::get_num_threads(), device.str()));
  std::string set_vars;
  for (const auto& v : env::table())
    if (env::is_set(v.name)) set_vars += fmt::format("{}{}={}", set_vars.empty() ? "" : ", ", v.name, env::get(v.name));
  log::info("environment: " + (set_vars.empty() ? std::string("no ACCEL_* variable set (every default)") : set_vars));
}

std::string offload_text(zero::OffloadDevice d, const std::string& path, std::uint64_t bytes,
                         std::uint64_t owned_bytes) {
  if (d == zero::OffloadDevice::None) return "none";
  if (path.empty() && bytes == 0) return zero::to_string(d);
  if (path.empty())  // host memory: the shards whose master is the same bytes keep no copy
    return fmt::format("{} ({:.1f} MiB per rank pinned, {:.1f} MiB of it the host masters')", zero::to_string(d),
                       static_cast<double>(bytes) / 1048576, static_cast<double>(bytes - owned_bytes) / 1048576);
  return fmt::format("{} ({}, {:.1f} MiB per rank)", zero::to_string(d), path, static_cast<double>(bytes) / 1048576);
}

// ACCEL_INITIAL_WORLD_SIZE (set by `accel launch --min_nodes` when it restarts a job on fewer hosts)
// over the ranks running now: 1 when unset or equal.
int shrink_factor(int world) {
  if (!env::is_set("ACCEL_INITIAL_WORLD_SIZE")) return 1;
  const long long initial = env::get_int("ACCEL_INITIAL_WORLD_SIZE");
  if (initial < 1) throw ConfigError(fmt::format("ACCEL_INITIAL_WORLD_SIZE must be >= 1, got {}", initial));
  if (initial % world != 0)
    throw ConfigError(fmt::format(
        "ACCEL_INITIAL_WORLD_SIZE is {} but {} ranks are running: the global batch can be kept only on a world "
        "size that divides the initial one",
        initial, world));
  return static_cast<int>(initial / world);
}

// The resolved plan, once the engine is built.
void log_plan(const AcceleratorConfig& cfg, const zero::Engine& e, c10::Device device) {
  if (!log::enabled(log::Level::Info)) return;
  const auto* po = e.param_offload();
  const auto* oo = e.optimizer_offload();
  const std::string spec = cfg.spec.to_string();  // "ZERO_3: ...": the strategy is said in config terms instead
  log::info(fmt::format(
      "plan: {} on {} rank(s) of {}, shard group of {}: {}; node-shared parameters {:.1f} MiB and gradient pool "
      "{:.1f} MiB per rank; offload: optimizer {}, parameters {}",
      strategy_name(cfg), e.world().size(), device.str(), e.shard_group()->size(), spec.substr(spec.find(": ") + 2),
      static_cast<double>(e.node_shared_bytes()) / 1048576 / std::max(1, e.shard_group()->size()),
      static_cast<double>(e.node_shared_grad_bytes()) / 1048576,
      offload_text(cfg.spec.offload.optimizer, oo ? oo->path() : "", oo ? oo->bytes() : 0, oo ? oo->bytes() : 0),
      offload_text(cfg.spec.offload.param, po ? po->path() : "", po ? po->bytes() : 0, po ? po->owned_bytes() : 0)));
}
}  // namespace

AcceleratorConfig resolve_config(const AcceleratorOptions& options) {
  ConfigOverrides ov;
  ov.config_file = options.config_file;
  ov.mixed_precision = options.mixed_precision;
  ov.gradient_accumulation_steps = options.gradient_accumulation_steps;
  ov.use_cpu = options.cpu;
  return resolve_config(ov);
}

Accelerator::Accelerator(AcceleratorOptions opts) : opts_(opts) {
  cfg_ = resolve_config(opts);
  world_ = comm::Communicator::world();
  device_ = pick_device(cfg_, *world_);
  // This rank's GPU becomes the current device (as Accelerate's PartialState does with
  // torch.cuda.set_device): what the program allocates on "cuda", and every allocator that goes by the
  // current device, lands on it rather than on GPU 0.
  if (device_.is_cuda()) c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(device_);
  // No config (or distributed_type NO) but several ranks: they train as DDP, so say so (Accelerate's
  // PartialState turns a world of more than one process into MULTI_CPU / MULTI_GPU the same way).
  if (cfg_.distributed_type == DistributedType::No && world_->size() > 1)
    cfg_.distributed_type = device_.is_cuda() ? DistributedType::MultiGpu : DistributedType::MultiCpu;
  check_supported(cfg_, device_);
  apply_precision_policy(cfg_);
  shrink_factor_ = shrink_factor(world_->size());
  check_shard_groups(cfg_, *world_, world_->size() * shrink_factor_);
  if (shrink_factor_ > 1) {
    const std::int64_t before = cfg_.gradient_accumulation_steps;
    cfg_.gradient_accumulation_steps *= shrink_factor_;
    if (cfg_.batch.gradient_accumulation_steps) *cfg_.batch.gradient_accumulation_steps *= shrink_factor_;
    if (world_->rank() == 0)
      log::warning(fmt::format(
          "running on {} of the {} ranks this job started with: gradient accumulation {} -> {} (and split_batches "
          "loaders read {}x smaller global batches), so every rank's micro-batch and every optimizer step's samples "
          "stay as they were",
          world_->size(), world_->size() * shrink_factor_, before, cfg_.gradient_accumulation_steps, shrink_factor_));
  }
  state_->accumulation_steps = cfg_.gradient_accumulation_steps;
  check_log_with();  // trackers: accelerator_tracking.cpp
  if (opts.report_ignored_keys && is_main_process() && !cfg_.ignored.empty()) {
    // One line: the keys only (their reasons: cfg_.ignored, or `accel config explain`).
    std::string keys;
    for (const auto& k : cfg_.ignored) keys += (keys.empty() ? "" : ", ") + k.substr(0, k.find(':'));
    log::warning(
        fmt::format("{}: {} key(s) accepted but without effect here: {}", where(cfg_), cfg_.ignored.size(), keys));
  }
  if (is_main_process()) log_start(*world_, device_);
  if (is_main_process() && num_processes() > 1 && cfg_.num_processes && *cfg_.num_processes != num_processes())
    log::warning(fmt::format("{} says num_processes {}, running with {} (the launcher's count wins)", cfg_.source,
                             *cfg_.num_processes, num_processes()));
}

Accelerator::~Accelerator() = default;

// ---------------------------------------------------------------------------------------------------
// prepare

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_model(std::shared_ptr<torch::nn::Module> model,
                                                                 torch::optim::Optimizer& optimizer,
                                                                 std::optional<std::int64_t> micro_batch) {
  if (model_)
    throw accel::LogicError(
        "Accelerator::prepare: this Accelerator already prepared a model (one model per "
        "Accelerator)");
  // As Accelerate refuses a model loaded with a device_map: its units carry dispatch hooks, and its
  // weights may be memory-mapped from disk or spread over devices.
  if (is_dispatched(*model))
    throw accel::InvalidArgumentError(fmt::format(
        "Accelerator::prepare: this model was dispatched by load_checkpoint_and_dispatch (device map {}); a "
        "dispatched model is for inference only and cannot be trained. Build the model normally (or under "
        "Accelerator::sharded_init), load the checkpoint with Accelerator::load_model after prepare, and train that",
        to_string(*dispatched_device_map(*model), model.get())));
  if (cfg_.distributed_type == DistributedType::DeepSpeed) {
    BatchConfig b =
        resolve_batch(cfg_.batch, num_processes(), micro_batch, cfg_.gradient_accumulation_steps, where(cfg_));
    if (micro_batch && b.micro_batch_per_gpu && *b.micro_batch_per_gpu != *micro_batch)
      throw ConfigError(
          fmt::format("{}: train_micro_batch_size_per_gpu is {} but the prepared loader gives {} "
                      "samples per process; make them agree (or write \"auto\")",
                      where(cfg_), *b.micro_batch_per_gpu, *micro_batch));
    cfg_.batch = b;
    cfg_.gradient_accumulation_steps = *b.gradient_accumulation_steps;
    state_->accumulation_steps = cfg_.gradient_accumulation_steps;
  }
  // (Parameters sharded on a device: they stay on the host until the engine moves each flat's shard.)
  zero::ShardingSpec spec = cfg_.spec;
  zero::check_optimizer(optimizer);  // (a refused optimizer leaves the model where it was)
  if (cfg_.optimizer && &optimizer != created_optimizer_.lock().get() && is_main_process())
    log::warning(
        fmt::format("{}: the optimizer block ({}) is not used: the program passed its own optimizer to "
                    "prepare(); Accelerator::create_optimizer builds the block's",
                    where(cfg_), cfg_.optimizer->type));
  zero::place_model(*model, spec, device_, zero::groups_for(spec, world_).shard->size());
  {
    // Every rank starts from rank 0's weights (as DDP does), whatever each rank's seed was. The
    // engine broadcasts the contiguous parameters itself; the rest, and the buffers, are sent here.
    c10::NoGradGuard no_grad;
    auto sync = [&](const at::Tensor& t) {
      if (!t.defined() || num_processes() == 1) return;
      at::Tensor c = t.detach().contiguous();
      world_->broadcast(c);
      if (!c.is_same(t)) t.detach().copy_(c);
    };
    for (const auto& p : model->parameters())
      if (!p.is_contiguous()) sync(p);
    for (const auto& b : model->buffers()) sync(b);
  }
  if (cfg_.mixed_precision == MixedPrecision::Fp8)  // the config's recipe for the model's Float8Linear layers
    nn::set_float8_recipe(
        *model, mixed_precision::float8_recipe_from_string(cfg_.fp8.recipe),
        cfg_.fp8.fp8_format == "E4M3" ? mixed_precision::Fp8Format::E4M3 : mixed_precision::Fp8Format::E5M2);
  if (env::get_int("ACCEL_STEP_IN_BACKWARD") != 0) {  // (an integer: "true" is an error, not off)
    // The step runs as each gradient is final: nothing may change the gradients between backward and step.
    if (cfg_.mixed_precision == MixedPrecision::Fp16)
      throw ConfigError(
          "ACCEL_STEP_IN_BACKWARD=1 steps the optimizer during backward, before fp16's loss scaler could check "
          "the gradients for overflow: use bf16, or turn it off");
    if (cfg_.gradient_clipping && *cfg_.gradient_clipping > 0)
      throw ConfigError(fmt::format(
          "{}: gradient_clipping {} clips the gradients before the step, and ACCEL_STEP_IN_BACKWARD=1 steps during "
          "backward: turn one of them off",
          where(cfg_), *cfg_.gradient_clipping));
    spec.step_in_backward = true;
  }
  zero::EngineAndOptimizer p = zero::prepare(model, optimizer, spec, world_);
  model_ = std::move(model);
  engine_ = p.engine;
  micro_batch_ = micro_batch.value_or(0);  // step_metrics' samples per step
  // A sharded strategy that keeps most of the model whole on every rank says so, once.
  if (auto report = zero::unit_report(*engine_); report && is_main_process()) log::warning(*report);
  if (is_main_process()) log_plan(cfg_, *engine_, device_);
  std::optional<double> clip;
  if (cfg_.gradient_clipping && *cfg_.gradient_clipping > 0) clip = cfg_.gradient_clipping;
  optimizer_ = p.optimizer;
  if (cfg_.mixed_precision == MixedPrecision::Fp16)
    scaling_ = std::make_shared<LossScaling>(cfg_.loss_scaler, engine_, device_);
  auto prepared = std::make_shared<AcceleratedOptimizer>(p.optimizer, engine_, state_, clip, scaling_);
  if (auto tune = tune_spec_from_env()) {  // `accel tune` measures this run (accelerator/tuning.h)
    std::int64_t params = 0;
    for (const auto& t : model_->parameters()) params += t.numel();
    const std::int64_t mb = micro_batch_ > 0 ? micro_batch_ : cfg_.batch.micro_batch_per_gpu.value_or(0);
    state_->tune =
        std::make_shared<TuneRun>(*tune, world_, device_, mb * state_->accumulation_steps * num_processes(), params);
    state_->tune->after_prepare(mb, state_->accumulation_steps);
  }
  maybe_auto_resume();
  return prepared;
}

void Accelerator::maybe_auto_resume() {
  // The config's resume_from_checkpoint, unless ACCEL_AUTO_RESUME says, unless the option says.
  std::string from = cfg_.resume_from_checkpoint;
  if (env::is_set("ACCEL_AUTO_RESUME")) from = env::get_int("ACCEL_AUTO_RESUME") != 0 ? "latest" : "";
  if (opts_.auto_resume) from = *opts_.auto_resume ? "latest" : "";
  if (from.empty()) return;
  if (from != "latest") {  // a directory: that checkpoint, at every start
    restore_state(from, /*for_later_loaders=*/true);
    print("accel: resumed from ", from, " at step ", state_->optimizer_steps);
    return;
  }
  if (opts_.project_dir.empty()) {
    if (is_main_process()) log::warning("auto_resume: no project_dir, so no checkpoints to resume from");
    return;
  }
  const auto existing = checkpoint::automatic_checkpoints(opts_.project_dir);
  if (existing.empty()) {
    if (is_main_process()) log::info("auto_resume: no checkpoint in " + opts_.project_dir + "/checkpoints yet");
    return;
  }
  restore_state(existing.back().second, /*for_later_loaders=*/true);
  const std::string restart = env::get("ACCEL_RESTART_COUNT");
  print("accel: resumed from ", existing.back().second, " at step ", state_->optimizer_steps,
        restart.empty() ? std::string() : " (restart " + restart + ")");
}

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler(std::shared_ptr<torch::optim::LRScheduler> s) {
  if (!s) throw accel::InvalidArgumentError("Accelerator::prepare_scheduler: null scheduler");
  if (cfg_.scheduler && !creating_scheduler_ && is_main_process())
    log::warning(
        fmt::format("{}: the scheduler block ({}) is not used: the program prepared its own scheduler; "
                    "Accelerator::create_scheduler builds the block's",
                    where(cfg_), cfg_.scheduler->type));
  scheduler_ = std::make_shared<AcceleratedScheduler>(std::move(s), state_);
  state_->pending_lrs.clear();  // (the fast-forward below reaches the saved rates from the program's)
  // (prepare() with a scheduler makes it after the model: a resume there leaves it to catch up here.)
  if (resumed_scheduler_steps_ > 0) scheduler_->fast_forward(resumed_scheduler_steps_);
  return scheduler_;
}

// ---------------------------------------------------------------------------------------------------
// The step

void Accelerator::backward(const at::Tensor& loss) {
  if (cfg_.scheduler && !scheduler_ && !scheduler_block_noted_) {  // (the other ways are noted where they pass)
    scheduler_block_noted_ = true;
    if (is_main_process())
      log::warning(
          fmt::format("{}: the scheduler block ({}) is not used: the program trains without a prepared "
                      "scheduler; Accelerator::create_scheduler builds the block's",
                      where(cfg_), cfg_.scheduler->type));
  }
  at::Tensor l = state_->accumulation_steps > 1 ? loss / static_cast<double>(state_->accumulation_steps) : loss;
  if (scaling_) {
    scaling_->new_backward();
    l = scaling_->scale_loss(l);
  }
  if (engine_)
    engine_->backward(l);
  else
    l.backward();
}

Accelerator::AccumulateScope::AccumulateScope(Accelerator& a) : a_(a) { a_.begin_micro_step(); }
Accelerator::AccumulateScope::~AccumulateScope() {
  if (active_) a_.end_micro_step();
}

void Accelerator::begin_micro_step() {
  GradientState& s = *state_;
  if (s.end_of_dataloader()) {
    s.micro_step = 0;
    s.sync_gradients = true;
  } else {
    s.micro_step += 1;
    s.sync_gradients = s.micro_step % s.accumulation_steps == 0;
  }
  end_micro_step();
  if (s.sync_gradients || !engine_) return;
  if (sync_each_batch())
    more_micro_steps_.emplace(*engine_);
  else
    no_sync_.emplace(*engine_);
}

void Accelerator::end_micro_step() {
  no_sync_.reset();
  more_micro_steps_.reset();
}

bool Accelerator::sync_each_batch() const {
  if (opts_.sync_each_batch) return *opts_.sync_each_batch;
  return default_sync_each_batch(cfg_);
}

Accelerator::AutocastGuard Accelerator::autocast(bool force_fp32) {
  if (force_fp32) return AutocastGuard(mixed_precision::AutocastScope(device_.type(), std::nullopt));
  const auto dtype = autocast_dtype(cfg_.mixed_precision);
  if (!dtype) return AutocastGuard();
  return AutocastGuard(mixed_precision::AutocastScope(device_.type(), dtype));
}

std::optional<double> Accelerator::loss_scale() const {
  if (!scaling_) return std::nullopt;
  return scaling_->scale();
}

double Accelerator::clip_grad_norm_(double max_norm, double norm_type) {
  if (!engine_) throw accel::LogicError("Accelerator::clip_grad_norm_: prepare a model first");
  if (!state_->sync_gradients) return std::numeric_limits<double>::quiet_NaN();
  const bool measure_only =
      cfg_.distributed_type == DistributedType::DeepSpeed && cfg_.gradient_clipping && *cfg_.gradient_clipping > 0;
  // fp16: check for overflow and unscale first (inf on overflow; the step will then be skipped).
  // DeepSpeed clips inside the step to its configured gradient_clipping (Accelerate then only
  // reports the norm): measure without clipping here, so gradients are not clipped twice.
  const double norm = scaling_
                          ? scaling_->unscale(measure_only ? std::nullopt : std::optional<double>(max_norm), norm_type)
                      : measure_only ? engine_->clip_grad_norm(std::numeric_limits<double>::infinity(), norm_type)
                                     : engine_->clip_grad_norm(max_norm, norm_type);
  state_->last_grad_norm = norm;  // step_metrics' grad_norm
  return norm;
}

void Accelerator::clip_grad_value_(double clip_value) {
  if (cfg_.distributed_type == DistributedType::DeepSpeed || cfg_.distributed_type == DistributedType::Fsdp)
    throw accel::LogicError(
        fmt::format("Accelerator::clip_grad_value_ is not supported with distributed_type {} "
                    "(gradients are sharded, as in Accelerate); use clip_grad_norm_ instead",
                    to_string(cfg_.distributed_type)));
  if (!engine_) throw accel::LogicError("Accelerator::clip_grad_value_: prepare a model first");
  if (!state_->sync_gradients) return;
  if (scaling_ && std::isinf(scaling_->unscale(std::nullopt))) return;  // overflow: the step is skipped
  engine_->clip_grad_value(clip_value);
}

// ---------------------------------------------------------------------------------------------------
// Collectives on tensors

at::Tensor Accelerator::gather(const at::Tensor& t) {
  at::Tensor x = (t.dim() == 0 ? t.reshape({1}) : t).contiguous();
  if (num_processes() == 1) return x.clone();
  std::vector<std::int64_t> sizes = x.sizes().vec();
  sizes[0] *= num_processes();
  at::Tensor out = at::empty(sizes, x.options());
  world_->all_gather(x.reshape({-1}), out.view({-1}));
  return out;
}

at::Tensor Accelerator::gather_for_metrics(const at::Tensor& t) {
  at::Tensor g = gather(t);
  const std::int64_t r = state_->remainder();  // the active loader's batch holds padding
  if (r >= 0 && r < g.size(0)) g = g.narrow(0, 0, r);
  return g;
}

at::Tensor Accelerator::reduce(const at::Tensor& t, const std::string& reduction) {
  comm::ReduceOp op;
  if (reduction == "sum" || reduction == "mean")
    op = comm::ReduceOp::Sum;
  else if (reduction == "max")
    op = comm::ReduceOp::Max;
  else if (reduction == "min")
    op = comm::ReduceOp::Min;
  else
    throw accel::InvalidArgumentError(
        fmt::format("Accelerator::reduce: reduction '{}' is not one of sum, mean, max, min", reduction));
  at::Tensor x = t.contiguous().clone();
  if (num_processes() > 1) world_->all_reduce(x, {op});
  if (reduction == "mean")
    x = x.is_floating_point() ? x.div_(num_processes()) : x.to(at::kDouble).div_(num_processes());
  return x;
}

at::Tensor Accelerator::pad_across_processes(const at::Tensor& t, std::int64_t dim, double pad_value, bool pad_first) {
  if (t.dim() == 0) return t.clone();
  const std::int64_t d = dim < 0 ? dim + t.dim() : dim;
  if (d < 0 || d >= t.dim())
    throw accel::InvalidArgumentError(
        fmt::format("Accelerator::pad_across_processes: dim {} is out of range for a tensor of {} dims", dim, t.dim()));
  at::Tensor n = at::full({1}, t.size(d), at::kLong);
  if (num_processes() > 1) world_->all_reduce(n, {comm::ReduceOp::Max});
  const std::int64_t max = n.item<std::int64_t>();
  if (max == t.size(d)) return t.clone();
  std::vector<std::int64_t> sizes = t.sizes().vec();
  sizes[d] = max;
  at::Tensor out = at::full(sizes, pad_value, t.options());
  out.narrow(d, pad_first ? max - t.size(d) : 0, t.size(d)).copy_(t);
  return out;
}

void Accelerator::wait_for_everyone() {
  if (num_processes() > 1) world_->barrier();
}

// ---------------------------------------------------------------------------------------------------
// Processes

Accelerator::MainProcessFirst::MainProcessFirst(Accelerator& a) : a_(a) {
  if (!a_.is_main_process()) a_.wait_for_everyone();
}

Accelerator::MainProcessFirst::~MainProcessFirst() noexcept(false) {
  if (a_.is_main_process()) a_.wait_for_everyone();
}

std::pair<std::int64_t, std::int64_t> Accelerator::split_range(std::int64_t n) const {
  const std::int64_t N = num_processes(), r = process_index();
  const std::int64_t base = n / N, extra = n % N;
  const std::int64_t b = r * base + std::min(r, extra);
  return {b, b + base + (r < extra ? 1 : 0)};
}

at::Tensor Accelerator::split_between_processes(const at::Tensor& t, bool apply_padding) const {
  if (t.dim() == 0)
    throw accel::InvalidArgumentError("Accelerator::split_between_processes: needs a tensor with a dim 0");
  auto [b, e] = split_range(t.size(0));
  at::Tensor out = t.narrow(0, b, e - b);
  if (apply_padding && t.size(0) > 0) {
    const std::int64_t want = (t.size(0) + num_processes() - 1) / num_processes();
    if (out.size(0) < want) {
      at::Tensor last = t.narrow(0, t.size(0) - 1, 1);
      std::vector<at::Tensor> parts{out};
      for (std::int64_t i = out.size(0); i < want; ++i) parts.push_back(last);
      out = at::cat(parts, 0);
    }
  }
  return out;
}

bool Accelerator::check_trigger() {
  at::Tensor t = at::full({1}, trigger_ ? 1 : 0, at::kInt);
  if (num_processes() > 1) world_->all_reduce(t);
  const bool any = t.item<int>() > 0;
  if (any) trigger_ = false;
  return any;
}

// ---------------------------------------------------------------------------------------------------
// The model

std::vector<std::pair<std::string, at::Tensor>> Accelerator::get_state_dict() {
  if (!model_) throw accel::LogicError("Accelerator::get_state_dict: prepare a model first");
  const bool keep = is_main_process();
  std::map<std::string, at::Tensor> full;
  c10::NoGradGuard no_grad;
  for (const auto& f : engine_->flats()) {
    const sharding::FlatParam& fp = *f.flat_param;
    // A sharded unit at rest is gathered into a temporary, one flat parameter at a time.
    const at::Tensor buffer = engine_->whole_values(f, zero::Engine::Source::Compute);
    if (!keep) continue;
    for (std::size_t i = 0; i < fp.params().size(); ++i) {
      const at::Tensor& p = fp.params()[i];
      full[fp.names()[i]] = buffer.narrow(0, fp.layout().offset(i), p.numel()).view(p.sizes()).to(c10::kCPU).clone();
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (!keep) return out;
  for (const auto& kv : model_->named_parameters()) {
    auto it = full.find(kv.key());
    out.emplace_back(kv.key(), it != full.end() ? it->second : kv.value().detach().to(c10::kCPU).clone());
  }
  for (const auto& kv : model_->named_buffers()) out.emplace_back(kv.key(), kv.value().detach().to(c10::kCPU).clone());
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Sharded construction

std::unique_ptr<sharding::ShardedInit> Accelerator::sharded_init() {
  // On a device the model is built on the host, and prepare() moves each unit there as this rank's
  // shard (zero::place_model). Where nothing shards it there (a strategy that keeps whole parameters,
  // or a shard group of one), prepare() moves it whole: sharding it while it is built would only add a
  // gather of all of it on the host, so each rank builds it whole and prepare() takes rank 0's values,
  // as for a model built without the scope. On the CPU it is sharded under every strategy: the engine
  // gives each unit its values back into the node-shared parameters one at a time, so a node never
  // holds a copy a rank.
  const auto group = zero::groups_for(cfg_.spec, world_).shard;
  const bool shard = device_.is_cpu() || zero::builds_on_the_host(cfg_.spec, group->size());
  return std::make_unique<sharding::ShardedInit>(world_, group, shard);
}

// ---------------------------------------------------------------------------------------------------
// Checkpoints

std::string Accelerator::save_state(const std::string& dir_in, std::optional<bool> full_arg) {
  const bool full = full_arg.value_or(cfg_.state_dict_type == StateDictType::Full);
  if (!model_) throw accel::LogicError("Accelerator::save_state: prepare a model first");
  std::string dir = dir_in;
  if (dir.empty()) {
    if (opts_.project_dir.empty())
      throw accel::InvalidArgumentError(
          "Accelerator::save_state: give a directory, or set AcceleratorOptions::project_dir");
    // Rank 0's view of the next name decides (the others may list the directory a moment later).
    at::Tensor next = at::full({1}, 0, at::kLong);
    if (is_main_process()) {
      const auto existing = checkpoint::automatic_checkpoints(opts_.project_dir);
      next.fill_(existing.empty() ? 0 : existing.back().first + 1);
    }
    if (num_processes() > 1) world_->broadcast(next, {0});
    dir = fmt::format("{}/checkpoints/checkpoint_{}", opts_.project_dir, next.item<std::int64_t>());
  }
  checkpoint::TrainingState t;
  t.step = state_->optimizer_steps;
  t.accumulation_steps = state_->accumulation_steps;
  t.micro_step = state_->micro_step % std::max<std::int64_t>(state_->accumulation_steps, 1);
  if (state_->accumulation_steps > 1 && state_->micro_step % state_->accumulation_steps != 0 && is_main_process())
    log::warning(fmt::format(
        "save_state: micro-step {} of an accumulation window of {}: the gradients accumulated so far are not "
        "saved (save where sync_gradients() is true, after the optimizer step, to resume exactly)",
        state_->micro_step % state_->accumulation_steps, state_->accumulation_steps));
  if (scheduler_) t.scheduler_steps = scheduler_->steps();
  if (!state_->pending_lrs.empty()) {  // resumed, neither a schedule nor a step since: still what was loaded
    if (!scheduler_) t.scheduler_steps = resumed_scheduler_steps_;
    t.lrs = state_->pending_lrs;
  } else if (optimizer_) {
    for (auto& g : optimizer_->param_groups()) t.lrs.push_back(g.options().get_lr());
  }
  for (const auto& l : state_->loaders)  // a resume not yet started is still the position
    t.loaders.push_back(l->resume_epoch >= 0
                            ? checkpoint::LoaderPosition{l->resume_epoch, l->resume_skip, l->global_batch}
                            : checkpoint::LoaderPosition{l->epoch, l->batches_consumed, l->global_batch});
  for (std::size_t i = t.loaders.size(); i < pending_positions_.size(); ++i)  // loaded, not prepared yet
    if (pending_positions_[i])
      t.loaders.push_back(
          {pending_positions_[i]->epoch, pending_positions_[i]->batches, pending_positions_[i]->global_batch});
  if (scaling_) t.loss_scaler = scaling_->state_text();
  if (is_main_process())
    for (const auto& [name, r] : registered_) t.objects[name] = r.save();
  {
    OffloadStaging staged(engine_.get(), optimizer_.get());
    checkpoint::save_atomically(dir, *world_, [&](const std::string& partial) {
      checkpoint::write_state(partial, *engine_, *model_, optimizer_.get(), t, *world_, full);
    });
  }
  if (dir_in.empty() && opts_.total_limit > 0 && is_main_process())
    checkpoint::apply_total_limit(opts_.project_dir, opts_.total_limit);
  if (num_processes() > 1) world_->barrier();
  return dir;
}

void Accelerator::load_state(const std::string& dir) { restore_state(dir, /*for_later_loaders=*/false); }

void Accelerator::restore_state(const std::string& dir_in, bool for_later_loaders) {
  if (!model_) throw accel::LogicError("Accelerator::load_state: prepare the model (and optimizer) first");
  std::string dir = dir_in;
  if (dir.empty()) {
    if (opts_.project_dir.empty())
      throw accel::InvalidArgumentError(
          "Accelerator::load_state: give a directory, or set AcceleratorOptions::project_dir");
    const auto existing = checkpoint::automatic_checkpoints(opts_.project_dir);
    if (existing.empty())
      throw checkpoint::CheckpointError(fmt::format("no checkpoint in {}/checkpoints to load", opts_.project_dir));
    dir = existing.back().second;
  }
  OffloadStaging staged(engine_.get(), optimizer_.get());
  const checkpoint::TrainingState t = checkpoint::read_state(dir, *engine_, *model_, optimizer_.get(), *world_);
  staged.commit();
  state_->optimizer_steps = t.step;
  if (scaling_ && !t.loss_scaler.empty()) scaling_->load_state_text(t.loss_scaler);
  if (scheduler_ && t.scheduler_steps) scheduler_->fast_forward(*t.scheduler_steps);
  if (!scheduler_ && t.scheduler_steps) resumed_scheduler_steps_ = *t.scheduler_steps;
  // A schedule prepared after this (prepare_scheduler fast-forwards it) takes the learning rates the
  // program set as its base, and steps them to the saved ones: those, already scheduled, would scale
  // the whole schedule a second time (or, saved at a warmup's 0, stop it). Where the saving run had a
  // schedule and none is prepared yet, the saved rates wait for the first optimizer step.
  const bool schedule_follows = !scheduler_ && t.scheduler_steps.has_value();
  state_->pending_lrs.clear();
  if (optimizer_ && t.lrs.size() == optimizer_->param_groups().size()) {
    if (schedule_follows)
      state_->pending_lrs = t.lrs;  // (set by the first step if no schedule comes; prepare_scheduler drops them)
    else
      for (std::size_t g = 0; g < t.lrs.size(); ++g) optimizer_->param_groups()[g].options().set_lr(t.lrs[g]);
  }
  // Mid-window where the window is as long as it was; at a window's start otherwise (a job restarted
  // on fewer ranks accumulates more micro-steps a window).
  state_->micro_step = t.accumulation_steps == state_->accumulation_steps ? t.micro_step : 0;
  pending_positions_.clear();
  for (std::size_t i = 0; i < t.loaders.size(); ++i) {
    const SavedPosition saved{t.loaders[i].epoch, t.loaders[i].batches_consumed, t.loaders[i].global_batch};
    if (i < state_->loaders.size()) {
      resume_loader(i, *state_->loaders[i], saved);
    } else if (for_later_loaders) {  // its loader is prepared later
      pending_positions_.resize(i + 1);
      pending_positions_[i] = saved;
    }
  }
  for (const auto& [name, bytes] : t.objects)
    if (auto it = registered_.find(name); it != registered_.end()) it->second.load(bytes);
  for (const auto& tracker : trackers_) tracker->resume(t.step);  // (init_trackers came first)
}

void Accelerator::resume_loader(std::size_t i, LoaderState& l, const SavedPosition& p) {
  l.resume_epoch = p.epoch;
  l.resume_skip = p.batches;
  // Saved with another global batch (another world size without split_batches, or a job shrunk by
  // `accel launch --min_nodes`): the position is the same sample of the epoch's order.
  const std::int64_t saved = p.global_batch, now = l.global_batch;
  if (saved <= 0 || now <= 0 || saved == now) return;
  const std::int64_t samples = l.resume_skip * saved;
  if (l.dataset_size > 0 && samples >= l.dataset_size) {  // the epoch was done: the next one, from its start
    l.resume_epoch += 1;
    l.resume_skip = 0;
    return;
  }
  l.resume_skip = samples / now;
  if (samples % now != 0 && is_main_process())
    log::warning(fmt::format(
        "load_state: loader {} stopped after {} samples of epoch {}, not a multiple of its global batch of {} "
        "now (it was {}): it resumes at sample {}, reading {} samples again",
        i, samples, l.resume_epoch, now, saved, l.resume_skip * now, samples - l.resume_skip * now));
}

void Accelerator::loader_prepared() {
  const std::size_t i = state_->loaders.size() - 1;
  if (i < pending_positions_.size() && pending_positions_[i]) {
    resume_loader(i, *state_->loaders[i], *pending_positions_[i]);
    pending_positions_[i].reset();
  }
}

void Accelerator::check_prepared(const std::shared_ptr<torch::nn::Module>& model) const {
  if (!model_) throw accel::LogicError("Accelerator: prepare the model first");
  if (model.get() != model_.get()) throw accel::InvalidArgumentError("Accelerator: that model is not the prepared one");
}

std::vector<std::string> Accelerator::save_model_files(const std::string& dir, std::int64_t max_shard_size) {
  checkpoint::SaveModelOptions o;
  o.progress = is_main_process();
  o.compute_dtype = cfg_.zero3_save_16bit_model;
  return checkpoint::save_model(*engine_, *model_, dir, max_shard_size, o).files;
}

void Accelerator::load_model_files(const std::string& path_or_dir) {
  checkpoint::LoadModelOptions o;
  o.progress = is_main_process();
  OffloadStaging staged(engine_.get(), nullptr);
  checkpoint::load_model(*engine_, *model_, path_or_dir, o);
  staged.commit();
}

void Accelerator::register_for_checkpointing(const std::string& name, std::function<std::string()> save,
                                             std::function<void(const std::string&)> load) {
  if (name.empty() || name.find_first_of("/\\") != std::string::npos)
    throw accel::InvalidArgumentError(fmt::format(
        "Accelerator::register_for_checkpointing: '{}' is not a usable name (non-empty, no slashes)", name));
  if (!save || !load) throw accel::InvalidArgumentError("Accelerator::register_for_checkpointing: give both functions");
  registered_[name] = {std::move(save), std::move(load)};
}

void Accelerator::end_training() {
  if (ended_) return;
  finish_trackers();  // the trackers' files complete before the ranks part
  wait_for_everyone();
  ended_ = true;
}

}  // namespace accel
