// DeepSpeed JSON, read as DeepSpeed reads it (docs/design.md, "Configuration"), into an AcceleratorConfig:
//   * zero_optimization, its offload blocks, fp16 and bf16 are strict like DeepSpeed's pydantic models:
//     an unknown key is an error; a field may be spelled by its name or its alias
//     (prefetch_bucket_size / stage3_prefetch_bucket_size); a value "auto" drops the key (default);
//     integers may be written as floats with no fraction (5e8), 1.5 is an error;
//     deprecated keys map onto their replacements (cpu_offload -> offload_optimizer.device cpu) and
//     giving both the old and the new key is an error.
//   * Top level: DeepSpeed itself reads it with dict.get and never complains about unknown keys.
//     accel is stricter on purpose: a misspelt top-level key (train_micro_batch_size_per_gpus) would
//     otherwise silently fall back to a default. Every key DeepSpeed documents is accepted; the ones
//     accel does not act on (optimizer, scheduler, monitors, ...) are listed in `ignored` with why;
//     anything else is an error with a "did you mean".
//   * Duplicate keys are an error (DeepSpeed loads with dict_raise_error_on_duplicate_keys).
#include "accelerator/config.h"

#include "accelerator/config_detail.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace accel {

namespace cd = config_detail;
using json = nlohmann::ordered_json;

namespace {

enum class Kind { Bool, Int, Number, String, Object, Any };

// One key of a block. `ignored` == nullptr: accel acts on it; otherwise why it is accepted but ignored.
struct Key {
  const char* name;
  const char* alias;  // "" when none
  Kind kind;
  const char* ignored;
};

constexpr const char* kOptimizer = "accel uses the optimizer/scheduler passed to prepare()";
constexpr const char* kMonitor =
    "DeepSpeed's own logging/monitoring; accel's trackers are log_with (tensorboard, jsonl, csv: docs/trackers.md)";
constexpr const char* kNoCounterpart = "a DeepSpeed feature with no accel counterpart";
constexpr const char* kAverage = "accel averages gradients once, in the reduction";
constexpr const char* kFetcher =
    "tunes DeepSpeed's per-parameter ZeRO-3 fetcher; accel gathers whole units and prefetches the next one";
constexpr const char* kGather = "accel all-gathers each unit's flat parameter in one collective";
constexpr const char* kDetail = "a DeepSpeed implementation detail with no accel counterpart";
constexpr const char* kZeroPP = "ZeRO++ is not implemented in accel";
constexpr const char* kMics = "MiCS is not implemented in accel";
constexpr const char* kPinned =
    "accel always pins the host memory it offloads to from a GPU (a model on the CPU needs no pinning)";
constexpr const char* kAioThreads =
    "accel's io_uring path completes each file's requests on one thread, its fallback pool runs queue_depth "
    "threads";
constexpr const char* kPipelined = "accel always reads the next sub-group ahead and writes the last one behind";
constexpr const char* kOffloadCpu = "applies to offload to cpu, which on a CPU run changes nothing";
constexpr const char* kBufferSize = "accel sizes each staging buffer to the largest unit shard";
constexpr const char* kInit = "accel writes the initial state in one sequential pass";
constexpr const char* kMaster = "accel keeps fp32 master weights and optimizer state";

const std::vector<Key>& top_keys() {
  static const std::vector<Key> keys = {
      {"train_batch_size", "", Kind::Any, nullptr},
      {"train_micro_batch_size_per_gpu", "", Kind::Any, nullptr},
      {"gradient_accumulation_steps", "", Kind::Any, nullptr},
      {"gradient_clipping", "", Kind::Any, nullptr},
      {"fp16", "", Kind::Object, nullptr},
      {"bf16", "bfloat16", Kind::Object, nullptr},
      {"zero_optimization", "", Kind::Any, nullptr},
      {"communication_data_type", "", Kind::Any, nullptr},
      {"gradient_allreduce_op", "", Kind::String, nullptr},
      {"amp", "", Kind::Object, nullptr},
      {"optimizer", "", Kind::Any, kOptimizer},
      {"scheduler", "", Kind::Any, kOptimizer},
      {"steps_per_print", "", Kind::Any, kMonitor},
      {"wall_clock_breakdown", "", Kind::Any, kMonitor},
      {"memory_breakdown", "", Kind::Any, kMonitor},
      {"dump_state", "", Kind::Any, kMonitor},
      {"flops_profiler", "", Kind::Any, kMonitor},
      {"tensorboard", "", Kind::Object, nullptr},  // enabled: true = log_with tensorboard
      {"wandb", "", Kind::Any,
       "accel has no W&B tracker; log_with tensorboard, then `wandb sync --sync-tensorboard` (docs/trackers.md)"},
      {"csv_monitor", "", Kind::Object, nullptr},  // enabled: true = log_with csv
      {"comet", "", Kind::Any, kMonitor},
      {"comms_logger", "", Kind::Any, kMonitor},
      {"prescale_gradients", "", Kind::Any, kAverage},
      {"gradient_predivide_factor", "", Kind::Any, kAverage},
      {"zero_allow_untested_optimizer", "", Kind::Any, "accel shards any torch::optim optimizer"},
      {"zero_force_ds_cpu_optimizer", "", Kind::Any,
       "DeepSpeedCPUAdam belongs to DeepSpeed's Python package; accel steps the optimizer passed to prepare()"},
      {"activation_checkpointing", "", Kind::Object, nullptr},
      {"data_types", "", Kind::Any, "accel accumulates gradients in the parameters' dtype"},
      {"checkpoint", "", Kind::Any, "DeepSpeed checkpoint-engine options; accel writes its own checkpoint format"},
      {"managed_gradient_accumulation", "", Kind::Any, "accel's accumulate() always owns the accumulation boundary"},
      {"sparse_gradients", "", Kind::Any, kNoCounterpart},
      {"disable_allgather", "", Kind::Any, kNoCounterpart},
      {"elasticity", "", Kind::Any, kNoCounterpart},
      {"autotuning", "", Kind::Any, kNoCounterpart},
      {"compression_training", "", Kind::Any, kNoCounterpart},
      {"data_efficiency", "", Kind::Any, kNoCounterpart},
      {"curriculum_learning", "", Kind::Any, kNoCounterpart},
      {"pipeline", "", Kind::Any, kNoCounterpart},
      {"aio", "", Kind::Object, nullptr},
      {"nebula", "", Kind::Any, kNoCounterpart},
      {"quantize_training", "", Kind::Any, kNoCounterpart},
      {"sequence_parallel_size", "", Kind::Any, kNoCounterpart},
      {"torch_autocast", "", Kind::Any, "accel's autocast follows mixed_precision"},
      {"compile", "", Kind::Any, "torch.compile is Python only"},
      {"hybrid_engine", "", Kind::Any, kNoCounterpart},
      {"weight_quantization", "", Kind::Any, kNoCounterpart},
      {"sparse_attention", "", Kind::Any, kNoCounterpart},
      {"eigenvalue", "", Kind::Any, kNoCounterpart},
      {"progressive_layer_drop", "", Kind::Any, kNoCounterpart},
  };
  return keys;
}

const std::vector<Key>& zero_keys() {
  static const std::vector<Key> keys = {
      {"stage", "", Kind::Int, nullptr},
      {"reduce_bucket_size", "", Kind::Int, nullptr},
      {"offload_optimizer", "", Kind::Object, nullptr},
      {"offload_param", "", Kind::Object, nullptr},
      {"cpu_offload", "", Kind::Bool, nullptr},        // deprecated: offload_optimizer.device cpu
      {"cpu_offload_param", "", Kind::Bool, nullptr},  // deprecated: offload_param.device cpu
      {"cpu_offload_use_pin_memory", "", Kind::Bool, kPinned},
      {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save", Kind::Bool, nullptr},
      {"stage3_gather_fp16_weights_on_model_save", "", Kind::Bool, nullptr},  // deprecated name of the above
      {"contiguous_gradients", "", Kind::Bool, "accel's gradients always live in flat contiguous buffers"},
      {"reduce_scatter", "", Kind::Bool, "accel reduce-scatters whenever the stage shards gradients"},
      {"overlap_comm", "", Kind::Bool, "accel always overlaps gradient reduction with backward"},
      {"use_multi_rank_bucket_allreduce", "", Kind::Bool, kDetail},
      {"allgather_partitions", "", Kind::Bool, kGather},
      {"allgather_bucket_size", "", Kind::Int, kGather},
      {"load_from_fp32_weights", "", Kind::Bool, kDetail},
      {"elastic_checkpoint", "", Kind::Bool, kDetail},
      {"sub_group_size", "", Kind::Int, nullptr},
      {"prefetch_bucket_size", "stage3_prefetch_bucket_size", Kind::Int, kFetcher},
      {"param_persistence_threshold", "stage3_param_persistence_threshold", Kind::Int, kFetcher},
      {"model_persistence_threshold", "stage3_model_persistence_threshold", Kind::Int, kFetcher},
      {"max_live_parameters", "stage3_max_live_parameters", Kind::Int, kFetcher},
      {"max_reuse_distance", "stage3_max_reuse_distance", Kind::Int, kFetcher},
      {"module_granularity_threshold", "stage3_module_granularity_threshold", Kind::Int, kFetcher},
      {"use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params", Kind::Bool, kFetcher},
      {"allgather_sequential", "stage3_allgather_sequential", Kind::Bool, kFetcher},
      {"ignore_unused_parameters", "", Kind::Bool, kDetail},
      {"legacy_stage1", "", Kind::Bool, kDetail},
      {"round_robin_gradients", "", Kind::Bool, kDetail},
      {"memory_efficient_linear", "", Kind::Bool, kDetail},
      {"override_module_apply", "", Kind::Bool, kDetail},
      {"log_trace_cache_warnings", "", Kind::Bool, kDetail},
      {"enable_sanity_checks", "", Kind::Bool, kDetail},
      {"pipeline_loading_checkpoint", "", Kind::Bool, kDetail},
      {"zero_hpz_partition_size", "", Kind::Int, kZeroPP},
      {"zero_quantized_weights", "", Kind::Bool, kZeroPP},
      {"zero_quantized_nontrainable_weights", "", Kind::Bool, kZeroPP},
      {"zero_quantized_gradients", "", Kind::Bool, kZeroPP},
      {"zeropp_loco_param", "", Kind::Any, kZeroPP},
      {"mics_shard_size", "", Kind::Int, kMics},
      {"mics_hierarchical_params_gather", "", Kind::Bool, kMics},
  };
  return keys;
}

const std::vector<Key>& offload_optimizer_keys() {
  static const std::vector<Key> keys = {
      {"device", "", Kind::String, nullptr},
      {"nvme_path", "", Kind::String, nullptr},
      {"buffer_count", "", Kind::Int, nullptr},
      {"pin_memory", "", Kind::Bool, kPinned},
      {"pipeline", "", Kind::Bool, kPipelined},
      {"pipeline_read", "", Kind::Bool, kPipelined},
      {"pipeline_write", "", Kind::Bool, kPipelined},
      {"fast_init", "", Kind::Bool, kInit},
      {"ratio", "", Kind::Number, "accel offloads all of the optimizer state (ratio 1)"},
      {"super_offload", "", Kind::Bool, kNoCounterpart},
      {"cpuadam_cores_perc", "", Kind::Number, "accel's CPU step uses the rank's intra-op threads"},
  };
  return keys;
}

const std::vector<Key>& offload_param_keys() {
  static const std::vector<Key> keys = {
      {"device", "", Kind::String, nullptr},      {"nvme_path", "", Kind::String, nullptr},
      {"buffer_count", "", Kind::Int, nullptr},   {"buffer_size", "", Kind::Int, kBufferSize},
      {"max_in_cpu", "", Kind::Int, kOffloadCpu}, {"pin_memory", "", Kind::Bool, kPinned},
  };
  return keys;
}

// DeepSpeed's asynchronous I/O block (offload to nvme).
const std::vector<Key>& aio_keys() {
  static const std::vector<Key> keys = {
      {"block_size", "", Kind::Int, nullptr},
      {"queue_depth", "", Kind::Int, nullptr},
      {"thread_count", "", Kind::Int, kAioThreads},
      {"intra_op_parallelism", "", Kind::Int, kAioThreads},
      {"single_submit", "", Kind::Bool, nullptr},
      {"overlap_events", "", Kind::Bool, nullptr},
      {"use_gds", "", Kind::Bool, "GPUDirect Storage is not used by accel"},
  };
  return keys;
}

const std::vector<Key>& fp16_keys() {
  static const std::vector<Key> keys = {
      {"enabled", "", Kind::Bool, nullptr},
      {"loss_scale", "", Kind::Number, nullptr},
      {"initial_scale_power", "", Kind::Int, nullptr},
      {"loss_scale_window", "", Kind::Int, nullptr},
      {"hysteresis", "", Kind::Int, nullptr},
      {"consecutive_hysteresis", "", Kind::Bool, nullptr},
      {"min_loss_scale", "", Kind::Number, nullptr},
      {"auto_cast", "", Kind::Bool, "accel's autocast follows mixed_precision"},
      {"fp16_master_weights_and_grads", "", Kind::Bool, kMaster},
  };
  return keys;
}

const std::vector<Key>& bf16_keys() {
  static const std::vector<Key> keys = {
      {"enabled", "", Kind::Bool, nullptr},
      {"immediate_grad_update", "", Kind::Bool, kDetail},
      {"check_grad_overflow", "", Kind::Bool, kDetail},
      {"bf16_master_weights_and_grads", "", Kind::Bool, nullptr},
      {"bf16_optimizer_states", "", Kind::Bool,
       "the optimizer state follows the master dtype (bf16_master_weights_and_grads)"},
  };
  return keys;
}

// DeepSpeed's activation_checkpointing block. Its presence turns checkpointing on for every unit
// (the blocks a DeepSpeed model wraps in deepspeed.checkpointing.checkpoint are accel's units); what
// its keys tune is partitioning across model-parallel ranks, which accel does not have.
constexpr const char* kNoModelParallel =
    "acts only with partition_activations, which partitions activations across model-parallel ranks; accel "
    "has no model parallelism, so a unit's checkpointed inputs stay whole on their device";
const std::vector<Key>& activation_checkpointing_keys() {
  static const std::vector<Key> keys = {
      {"partition_activations", "", Kind::Bool,
       "partitions the checkpointed activations across model-parallel ranks; accel has no model parallelism"},
      {"cpu_checkpointing", "", Kind::Bool, kNoModelParallel},
      {"contiguous_memory_optimization", "", Kind::Bool, kNoModelParallel},
      {"number_checkpoints", "", Kind::Int, kNoModelParallel},
      {"synchronize_checkpoint_boundary", "", Kind::Bool,
       "a device synchronize at each checkpoint boundary, for profiling; accel's checkpoints do not synchronize"},
      {"profile", "", Kind::Bool, "DeepSpeed's per-checkpoint forward/backward timers; accel has none"},
  };
  return keys;
}

// DeepSpeed's tensorboard and csv_monitor blocks.
const std::vector<Key>& monitor_keys() {
  static const std::vector<Key> keys = {
      {"enabled", "", Kind::Bool, nullptr},
      {"output_path", "", Kind::String, "accel's trackers write to <project_dir>/<project_name> (init_trackers)"},
      {"job_name", "", Kind::String, "accel's trackers write to <project_dir>/<project_name> (init_trackers)"},
  };
  return keys;
}

const char* kind_text(Kind k) {
  switch (k) {
    case Kind::Bool: return "a boolean (true or false)";
    case Kind::Int: return "an integer";
    case Kind::Number: return "a number";
    case Kind::String: return "a string";
    case Kind::Object: return "an object ({...})";
    case Kind::Any: return "a value";
  }
  return "?";
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

std::string show(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// JSON number -> int64, accepting integral floats (5e8), else nullopt.
std::optional<std::int64_t> as_integer(const json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= 9.2e18) return static_cast<std::int64_t>(d);
  }
  return std::nullopt;
}

bool has_kind(const json& v, Kind k) {
  switch (k) {
    case Kind::Bool: return v.is_boolean();
    case Kind::Int: return as_integer(v).has_value();
    case Kind::Number: return v.is_number();
    case Kind::String: return v.is_string();
    case Kind::Object: return v.is_object();
    case Kind::Any: return true;
  }
  return false;
}

// A block's entries under their canonical names, type-checked, with "auto" and null values dropped.
class Block {
 public:
  Block(const json& obj, const std::string& file, const std::string& prefix, const std::vector<Key>& keys,
        AcceleratorConfig& cfg)
      : file_(file), prefix_(prefix) {
    std::vector<std::string> valid;
    for (const auto& k : keys) {
      valid.emplace_back(k.name);
      if (*k.alias) valid.emplace_back(k.alias);
    }
    for (const auto& [written, value] : obj.items()) {
      const Key* key = nullptr;
      for (const auto& k : keys)
        if (written == k.name || written == k.alias) key = &k;
      if (!key) cd::fail_unknown_key(file, prefix + written, valid);
      if (!entries_.emplace(key->name, Entry{written, value}).second)
        cd::fail(file, fmt::format("both '{}{}' and its alias '{}{}' are given; keep one", prefix, key->name, prefix,
                                   key->alias));
      if (value.is_null() || is_auto(value)) {
        dropped_.insert(key->name);
        continue;
      }
      if (!has_kind(value, key->kind)) cd::fail_value(file, prefix + written, show(value), kind_text(key->kind));
      if (key->ignored) cd::note_ignored(cfg, prefix + written, key->ignored);
    }
  }

  // Present with a value other than null/"auto".
  bool has(const std::string& name) const { return entries_.count(name) && !dropped_.count(name); }
  // Written at all (also null or "auto").
  bool written(const std::string& name) const { return entries_.count(name) > 0; }
  bool written_auto(const std::string& name) const {
    auto it = entries_.find(name);
    return it != entries_.end() && is_auto(it->second.value);
  }
  const json& value(const std::string& name) const { return entries_.at(name).value; }
  std::string path(const std::string& name) const {
    auto it = entries_.find(name);
    return prefix_ + (it == entries_.end() ? name : it->second.written);
  }

  std::optional<std::int64_t> integer(const std::string& name, std::int64_t lo, std::int64_t hi,
                                      const std::string& expected) const {
    if (!has(name)) return std::nullopt;
    const auto v = as_integer(value(name));
    if (!v || *v < lo || *v > hi) cd::fail_value(file_, path(name), show(value(name)), expected);
    return v;
  }
  std::optional<double> number(const std::string& name, double lo, const std::string& expected) const {
    if (!has(name)) return std::nullopt;
    const double d = value(name).get<double>();
    if (!std::isfinite(d) || d < lo) cd::fail_value(file_, path(name), show(value(name)), expected);
    return d;
  }
  std::optional<bool> boolean(const std::string& name) const {
    if (!has(name)) return std::nullopt;
    return value(name).get<bool>();
  }

 private:
  struct Entry {
    std::string written;
    json value;
  };
  std::string file_, prefix_;
  std::map<std::string, Entry> entries_;
  std::set<std::string> dropped_;
};

// Parses with DeepSpeed's duplicate-key rule; syntax errors name the file and the position.
json parse_strict(const std::string& text, const std::string& file) {
  struct Frame {
    std::set<std::string> keys;
    std::string last;
  };
  std::vector<Frame> frames;
  auto path_of = [&](const std::string& key) {
    std::string p;
    for (std::size_t i = 0; i + 1 < frames.size(); ++i)
      if (!frames[i].last.empty()) p += frames[i].last + ".";
    return p + key;
  };
  json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: frames.emplace_back(); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string k = parsed.get<std::string>();
        if (!frames.back().keys.insert(k).second)
          cd::fail(file, fmt::format("duplicate key '{}' (DeepSpeed rejects duplicate keys too)", path_of(k)));
        frames.back().last = k;
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::exception& e) {
    cd::fail(file, std::string("not valid JSON: ") + e.what());
  }
}

std::optional<std::int64_t> batch_value(const Block& top, const std::string& name) {
  return top.integer(name, 1, std::numeric_limits<std::int64_t>::max(), "a positive integer or \"auto\"");
}

// An offload block, or null; returns the device. The deprecated bool (cpu_offload) maps onto it.
// nvme_path and buffer_count land in the given fields.
std::string read_offload(const Block& zero, const std::string& block, const std::string& deprecated,
                         const std::vector<Key>& keys, const std::string& file, AcceleratorConfig& cfg,
                         std::string& nvme_path, int& buffer_count) {
  if (zero.has(deprecated) && zero.written(block))
    cd::fail(file, fmt::format("both the deprecated '{}' and its replacement '{}' are given; keep {}",
                               zero.path(deprecated), zero.path(block), zero.path(block)));
  if (zero.has(deprecated)) return *zero.boolean(deprecated) ? "cpu" : "none";
  if (!zero.has(block)) return "none";
  Block b(zero.value(block), file, zero.path(block) + ".", keys, cfg);
  if (b.has("nvme_path")) nvme_path = b.value("nvme_path").get<std::string>();
  if (auto n = b.integer("buffer_count", 2, 1 << 20, "an integer >= 2")) buffer_count = static_cast<int>(*n);
  if (!b.has("device")) return "none";
  const std::string device = cd::offload_device(file, b.path("device"), b.value("device").get<std::string>());
  if (device == "nvme" && nvme_path.empty())
    cd::fail(file, fmt::format("{} is \"nvme\" but {}.nvme_path is not set; give the directory to offload into",
                               b.path("device"), zero.path(block)));
  return device;
}

void read_zero(const json& z, const std::string& file, AcceleratorConfig& cfg) {
  if (z.is_boolean()) {  // legacy form: true = stage 1
    cfg.spec = zero::ShardingSpec::zero(z.get<bool>() ? 1 : 0);
    return;
  }
  if (z.is_null() || is_auto(z)) {
    cfg.spec = zero::ShardingSpec::zero(0);
    return;
  }
  if (!z.is_object()) cd::fail_value(file, "zero_optimization", show(z), "an object ({\"stage\": ...}) or a boolean");
  Block zero(z, file, "zero_optimization.", zero_keys(), cfg);

  const int stage = static_cast<int>(zero.integer("stage", 0, 3, "0, 1, 2 or 3").value_or(0));
  cfg.spec = zero::ShardingSpec::zero(stage);
  if (auto n = zero.integer("reduce_bucket_size", 0, std::numeric_limits<std::int64_t>::max() / 4,
                            "a number of elements >= 0"))
    cfg.spec.bucket_bytes = *n * 4;

  auto& off = cfg.spec.offload;
  cfg.offload_optimizer_device = read_offload(zero, "offload_optimizer", "cpu_offload", offload_optimizer_keys(), file,
                                              cfg, off.optimizer_nvme_path, off.optimizer_buffer_count);
  cfg.offload_param_device = read_offload(zero, "offload_param", "cpu_offload_param", offload_param_keys(), file, cfg,
                                          off.param_nvme_path, off.param_buffer_count);
  if (auto n = zero.integer("sub_group_size", 1, std::numeric_limits<std::int64_t>::max(), "a number of elements >= 1"))
    off.sub_group_size = *n;
  if (cfg.offload_param_device != "none" && stage != 3)
    cd::fail(file, fmt::format("{} offloads parameters to '{}', which needs stage 3 (zero_optimization.stage is {}); "
                               "use stage 3 or set the device to \"none\"",
                               zero.path("offload_param"), cfg.offload_param_device, stage));

  const std::string g16 = "gather_16bit_weights_on_model_save", old16 = "stage3_gather_fp16_weights_on_model_save";
  if (zero.has(old16) && zero.has(g16))
    cd::fail(file, fmt::format("both the deprecated '{}' and its replacement '{}' are given; keep {}", zero.path(old16),
                               zero.path(g16), zero.path(g16)));
  if (auto b = zero.boolean(zero.has(g16) ? g16 : old16)) cfg.zero3_save_16bit_model = *b;
}

void read_fp16(const json& obj, const std::string& file, AcceleratorConfig& cfg, bool& enabled, bool& is_auto_enabled) {
  Block b(obj, file, "fp16.", fp16_keys(), cfg);
  enabled = b.boolean("enabled").value_or(false);
  is_auto_enabled = b.written_auto("enabled");
  LossScalerConfig& s = cfg.loss_scaler;
  if (auto v = b.number("loss_scale", 0, "a number >= 0 (0: dynamic)")) s.loss_scale = *v;
  if (auto v = b.integer("initial_scale_power", 0, 64, "an integer in 0..64"))
    s.initial_scale_power = static_cast<int>(*v);
  if (auto v = b.integer("loss_scale_window", 1, std::numeric_limits<int>::max(), "an integer >= 1"))
    s.loss_scale_window = static_cast<int>(*v);
  if (auto v = b.integer("hysteresis", 1, std::numeric_limits<int>::max(), "an integer >= 1"))
    s.hysteresis = static_cast<int>(*v);
  if (auto v = b.boolean("consecutive_hysteresis")) s.consecutive_hysteresis = *v;
  if (auto v = b.number("min_loss_scale", 0, "a number > 0")) {
    if (*v <= 0) cd::fail_value(file, b.path("min_loss_scale"), show(b.value("min_loss_scale")), "a number > 0");
    s.min_loss_scale = *v;
  }
}

void read_bf16(const json& obj, const std::string& file, const std::string& name, AcceleratorConfig& cfg, bool& enabled,
               bool& is_auto_enabled) {
  Block b(obj, file, name + ".", bf16_keys(), cfg);
  enabled = b.boolean("enabled").value_or(false);
  is_auto_enabled = b.written_auto("enabled");
  // bf16 master weights (and with them the optimizer state): half the memory of fp32 masters.
  if (auto m = b.boolean("bf16_master_weights_and_grads"); m && *m && (enabled || is_auto_enabled))
    cfg.spec.master_dtype = c10::ScalarType::BFloat16;
}

std::optional<c10::ScalarType> comm_dtype(const Block& top, const std::string& file) {
  if (!top.has("communication_data_type")) return std::nullopt;
  const json& v = top.value("communication_data_type");
  const std::string path = top.path("communication_data_type");
  if (!v.is_string()) cd::fail_value(file, path, show(v), "a string: fp32, fp16 or bf16");
  std::string s = cd::lower(v.get<std::string>());
  if (s == "bfp16") s = "bf16";  // DeepSpeed's older spelling
  s = cd::match_enum(file, path, s, {"fp32", "fp16", "bf16"});
  if (s == "fp16") return c10::ScalarType::Half;
  if (s == "bf16") return c10::ScalarType::BFloat16;
  return c10::ScalarType::Float;
}

}  // namespace

namespace config_detail {

DeepSpeedJson read_deepspeed_json(const std::string& text, const std::string& source) {
  const json root = parse_strict(text, source);
  if (!root.is_object())
    fail(source, fmt::format("a DeepSpeed config is a JSON object ({{\"train_batch_size\": ..., "
                             "\"zero_optimization\": ...}}), got {}",
                             root.type_name()));
  DeepSpeedJson out;
  AcceleratorConfig& cfg = out.cfg;
  cfg.source = source;
  cfg.distributed_type = DistributedType::DeepSpeed;
  Block top(root, source, "", top_keys(), cfg);

  // The batch triad; "auto" (Hugging Face's convention) is filled at prepare().
  cfg.batch.train_batch_size = batch_value(top, "train_batch_size");
  cfg.batch.micro_batch_per_gpu = batch_value(top, "train_micro_batch_size_per_gpu");
  cfg.batch.gradient_accumulation_steps = batch_value(top, "gradient_accumulation_steps");
  const BatchConfig& b = cfg.batch;
  if (b.train_batch_size && b.micro_batch_per_gpu && b.gradient_accumulation_steps &&
      *b.train_batch_size % (*b.micro_batch_per_gpu * *b.gradient_accumulation_steps) != 0)
    fail(source, fmt::format("train_batch_size {} must equal train_micro_batch_size_per_gpu * "
                             "gradient_accumulation_steps * world size, but {} * {} does not divide it",
                             *b.train_batch_size, *b.micro_batch_per_gpu, *b.gradient_accumulation_steps));
  if (b.gradient_accumulation_steps) cfg.gradient_accumulation_steps = *b.gradient_accumulation_steps;
  if (top.has("gradient_clipping")) {
    const json& v = top.value("gradient_clipping");
    if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>()))
      fail_value(source, "gradient_clipping", show(v), "a number >= 0 (0: off) or \"auto\"");
    cfg.gradient_clipping = v.get<double>();
  }

  read_zero(top.has("zero_optimization") ? top.value("zero_optimization") : json(), source, cfg);

  // DeepSpeed's monitors that accel has a tracker for: enabled: true adds it to log_with.
  for (const auto& [block, tracker] :
       {std::pair<const char*, const char*>{"tensorboard", "tensorboard"}, {"csv_monitor", "csv"}}) {
    if (!top.has(block)) continue;
    const Block m(top.value(block), source, top.path(block) + ".", monitor_keys(), cfg);
    if (m.boolean("enabled").value_or(false))
      cfg.log_with.emplace_back(tracker);
    else
      note_ignored(cfg, block, "enabled is not true: no tracker");
  }

  bool fp16 = false, bf16 = false, fp16_auto = false, bf16_auto = false;
  if (top.has("fp16")) read_fp16(top.value("fp16"), source, cfg, fp16, fp16_auto);
  if (top.has("bf16")) read_bf16(top.value("bf16"), source, top.path("bf16"), cfg, bf16, bf16_auto);
  if (fp16 && bf16)
    fail(source, fmt::format("fp16.enabled and {}.enabled are both true; enable at most one", top.path("bf16")));
  cfg.mixed_precision = fp16 ? MixedPrecision::Fp16 : bf16 ? MixedPrecision::Bf16 : MixedPrecision::No;
  out.precision_given = fp16 || bf16;
  out.precision_auto = !out.precision_given && (fp16_auto || bf16_auto);

  if (top.has("amp")) {
    const json& amp = top.value("amp");
    if (amp.contains("enabled") && amp["enabled"].is_boolean() && amp["enabled"].get<bool>())
      fail(source, "amp.enabled is true: NVIDIA Apex AMP is Python only; use \"fp16\" or \"bf16\" instead");
    note_ignored(cfg, "amp", "NVIDIA Apex AMP is Python only");
  }
  if (top.has("gradient_allreduce_op")) {
    const std::string op = top.value("gradient_allreduce_op").get<std::string>();
    if (lower(op) != "mean")
      fail_value(source, "gradient_allreduce_op", op, "\"mean\" (accel averages gradients; \"sum\" is not supported)");
  }
  cfg.spec.reduce_dtype = comm_dtype(top, source);
  if (top.has("aio")) {
    Block aio(top.value("aio"), source, top.path("aio") + ".", aio_keys(), cfg);
    auto& o = cfg.spec.offload.aio;
    if (auto n = aio.integer("block_size", 4096, 1LL << 30, "a number of bytes from 4096 to 1 GiB"))
      o.block_size = static_cast<std::size_t>(*n);
    if (auto n = aio.integer("queue_depth", 1, 1024, "an integer from 1 to 1024")) o.queue_depth = static_cast<int>(*n);
    if (auto b = aio.boolean("single_submit")) o.single_submit = *b;
    if (auto b = aio.boolean("overlap_events")) o.overlap_events = *b;
  }
  if (top.has("activation_checkpointing")) {
    Block ac(top.value("activation_checkpointing"), source, top.path("activation_checkpointing") + ".",
             activation_checkpointing_keys(), cfg);
    cfg.spec.activation_checkpointing = true;
  }
  return out;
}

std::vector<KeyRow> deepspeed_json_keys() {
  std::vector<KeyRow> rows;
  for (const auto& [section, keys] : {std::pair<const char*, const std::vector<Key>*>{"", &top_keys()},
                                      {"zero_optimization", &zero_keys()},
                                      {"zero_optimization.offload_optimizer", &offload_optimizer_keys()},
                                      {"zero_optimization.offload_param", &offload_param_keys()},
                                      {"aio", &aio_keys()},
                                      {"fp16", &fp16_keys()},
                                      {"bf16", &bf16_keys()},
                                      {"activation_checkpointing", &activation_checkpointing_keys()},
                                      {"tensorboard", &monitor_keys()},
                                      {"csv_monitor", &monitor_keys()}})
    for (const auto& k : *keys) rows.push_back({section, k.name, k.ignored});
  return rows;
}

}  // namespace config_detail

AcceleratorConfig parse_deepspeed_json(const std::string& text, const std::string& source) {
  return config_detail::read_deepspeed_json(text, source).cfg;
}

}  // namespace accel
