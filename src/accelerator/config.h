// accel::AcceleratorConfig — what a config file decides, read strictly from either dialect:
//   * an Accelerate-style YAML (distributed_type, mixed_precision, fsdp_config, deepspeed_config,
//     fp8_config, ...), which may name a DeepSpeed JSON (deepspeed_config.deepspeed_config_file);
//   * a DeepSpeed JSON on its own (train_batch_size, zero_optimization, fp16, bf16, ...), read as
//     DeepSpeed reads it.
// Both end in one AcceleratorConfig, whose ShardingSpec the engine executes (docs/design.md, "The strategy table").
//
// Errors are ConfigError with one message that names the file, the key (dotted path), what is wrong,
// the allowed values and, for an unknown key, the closest valid key. Every key a dialect documents
// either does what that dialect says or is accepted and listed in `ignored` (each once, with the
// reason it has no effect in accel today): keys meaningful only for Python, TPUs, SageMaker or
// torchrun, and features accel does not have yet. `accel config explain` prints the whole account.
//
// Precedence (resolve_config): explicit argument > environment set by the launcher (ACCEL_*) >
// config file > default.
#pragma once

#include "base/error.h"

#include "mixed_precision/loss_scaler_options.h"
#include "optim/config_block.h"
#include "zero/spec.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel {

class ConfigError : public accel::InvalidArgumentError {
 public:
  using accel::InvalidArgumentError::InvalidArgumentError;
};

enum class DistributedType { No, MultiCpu, MultiGpu, DeepSpeed, Fsdp };
const char* to_string(DistributedType t);  // "NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP"

enum class MixedPrecision { No, Fp16, Bf16, Fp8 };
const char* to_string(MixedPrecision p);  // "no", "fp16", "bf16", "fp8"
// "no", "fp16", "bf16", "fp8" (case-insensitive); throws ConfigError naming `what` otherwise.
MixedPrecision parse_mixed_precision(const std::string& value, const std::string& what);

// DeepSpeed's batch triad. Unset = not given, or "auto" (filled at prepare() from the loader).
struct BatchConfig {
  std::optional<std::int64_t> train_batch_size;
  std::optional<std::int64_t> micro_batch_per_gpu;  // train_micro_batch_size_per_gpu
  std::optional<std::int64_t> gradient_accumulation_steps;
};
// DeepSpeed's derivation (runtime/config.py _set_batch_related_parameters): with all three given,
// train = micro * accumulation * world must hold; with two, the third is derived (and must divide
// evenly); train alone: accumulation 1, micro = train / world; micro alone: accumulation 1. Unset
// members are first taken from loader_micro_batch / accumulation_default when given. Throws
// ConfigError naming `source` and the three values when the rule fails or nothing is known.
BatchConfig resolve_batch(BatchConfig batch, int world, std::optional<std::int64_t> loader_micro_batch,
                          std::int64_t accumulation_default, const std::string& source);

// fp16 dynamic loss scaling, DeepSpeed's keys and defaults (fp16 block): the LossScaler's own options.
using LossScalerConfig = mixed_precision::LossScalerOptions;

// fp8_config (used by mixed_precision fp8): Float8Linear with dynamic scales, tensorwise or rowwise
// (`recipe`), e4m3 forward and e5m2 or e4m3 gradients (`fp8_format`). Accelerate's other recipe keys
// (backend, amax_*, margin, interval, pad_inner_dim, use_autocast_during_eval) are accepted and ignored.
struct Fp8Config {
  bool enable_fsdp_float8_all_gather = true;  // ZeRO-3 / FULL_SHARD units gathered as fp8 bytes
  std::string recipe = "tensorwise";          // Float8Linear's scaling: tensorwise | rowwise (torchao's names)
  std::string fp8_format = "HYBRID";          // tensorwise gradients: HYBRID (e5m2) | E4M3
};

// What save_state() writes when its `full` argument is not given (fsdp_state_dict_type).
enum class StateDictType {
  Sharded,  // each rank its own slices (SHARDED_STATE_DICT, LOCAL_STATE_DICT; accel's default)
  Full,     // rank 0 every tensor whole (FULL_STATE_DICT)
};
const char* to_string(StateDictType t);  // "sharded", "full"

struct AcceleratorConfig {
  std::string source;  // the file(s) read, "" when everything is a default
  DistributedType distributed_type = DistributedType::No;
  MixedPrecision mixed_precision = MixedPrecision::No;
  // As the file says (total over all machines); unset where it says nothing (a DeepSpeed JSON never
  // does): the launcher's --num_processes or hostfile decides, else 1.
  std::optional<int> num_processes;
  std::optional<int> num_machines;
  int max_restarts = 0;  // accel launch: starts of the job again after a failure
  bool use_cpu = false;
  // Resolved once the batch triad is known; until then the value the files gave (or 1).
  std::int64_t gradient_accumulation_steps = 1;
  BatchConfig batch;                        // DeepSpeed's triad as written ("auto" = unset)
  std::optional<double> gradient_clipping;  // DeepSpeed: clip every step to this global norm
  zero::ShardingSpec spec;                  // strategy, wrap policy, prefetch, buckets, dtypes
  // Accelerate's parallelism_config as copies x shards (FSDP2's HSDP mesh), unset where it gives no size
  // other than 1. The strategy's shard groups come from it (config_detail::apply_parallelism, again after
  // an override of the strategy); its product must be the job's number of processes.
  struct DataParallelSizes {
    int replicate = 1, shard = 1;
    int processes() const { return replicate * shard; }
  };
  std::optional<DataParallelSizes> parallelism;
  // DeepSpeed's zero_optimization.mics_shard_size as the JSON gives it (> 0): at stage 3 it is the spec's
  // shard group size (config_detail::apply_mics, again after an override of the strategy), otherwise it
  // is listed as ignored.
  std::optional<int> mics_shard_size;
  std::string offload_optimizer_device = "none";           // none | cpu | nvme
  std::string offload_param_device = "none";               // none | cpu | nvme
  StateDictType state_dict_type = StateDictType::Sharded;  // fsdp_state_dict_type
  int fsdp_version = 1;
  // DeepSpeed's gather_16bit_weights_on_model_save (zero3_save_16bit_model in the YAML): save_model
  // writes the weights in the compute dtype (bf16/fp16 under mixed precision), not the fp32 masters.
  bool zero3_save_16bit_model = false;
  std::string deepspeed_config_file;  // as resolved (absolute, or relative to the working directory)
  LossScalerConfig loss_scaler;
  Fp8Config fp8;
  // DeepSpeed's optimizer and scheduler blocks, checked (optim/from_config.h); Accelerator::
  // create_optimizer and create_scheduler build them. Unset without the block.
  std::optional<optim::ConfigBlock> optimizer;
  std::optional<optim::ConfigBlock> scheduler;
  std::vector<std::string> ignored;  // "KEY: reason", in file order, each key once
  // Trackers (accel extensions of the YAML: log_with, project_dir; DeepSpeed JSON: the tensorboard
  // and csv_monitor blocks with enabled: true). AcceleratorOptions' own values win.
  std::vector<std::string> log_with;
  std::string project_dir;
  // After prepare(): "latest" loads the newest checkpoint of project_dir when there is one (a job
  // started again by accel launch --max_restarts goes on from it); a directory loads that checkpoint;
  // "" nothing. ACCEL_AUTO_RESUME and AcceleratorOptions::auto_resume win over it.
  std::string resume_from_checkpoint;
};

// What set spec.shard_group_size, for messages: "parallelism_config's dp_replicate_size x dp_shard_size
// (2 x 4)", "zero_optimization.mics_shard_size", or "" (nothing in the config did).
std::string shard_group_source(const AcceleratorConfig& cfg);

// The strategy as the config's own dialect names it, for logs and banners: "FSDP FULL_SHARD",
// "DeepSpeed ZeRO-3", "DDP" (MULTI_CPU / MULTI_GPU), "single process" (NO).
std::string strategy_name(const AcceleratorConfig& cfg);

// Whether micro-steps that do not step reduce their gradients (Accelerate's sync_each_batch) when
// AcceleratorOptions::sync_each_batch leaves it unset: on under a DeepSpeed config whose strategy
// shards the gradients (ZeRO-2/3 refuse no_sync in DeepSpeed), off otherwise (Accelerate's default).
bool default_sync_each_batch(const AcceleratorConfig& cfg);

// A file of either dialect, told apart by content: a JSON object without `distributed_type` is a
// DeepSpeed config; anything else is Accelerate YAML (JSON is valid YAML, and Accelerate accepts
// .json configs). Relative paths inside (deepspeed_config_file) are tried against the working
// directory, then the config file's directory. Throws ConfigError (missing file too).
AcceleratorConfig load_config_file(const std::string& path);
AcceleratorConfig parse_accelerate_yaml(const std::string& text, const std::string& source,
                                        const std::string& base_dir = ".");
AcceleratorConfig parse_deepspeed_json(const std::string& text, const std::string& source);

// Explicit arguments (the Accelerator's constructor, `accel launch` flags).
struct ConfigOverrides {
  std::optional<std::string> config_file;
  std::optional<std::string> mixed_precision;
  std::optional<std::int64_t> gradient_accumulation_steps;
  std::optional<bool> use_cpu;
  std::optional<int> zero_stage;                      // forces DEEPSPEED with this stage
  std::optional<std::string> fsdp_sharding_strategy;  // forces FSDP with this strategy
};
// Explicit argument > environment (ACCEL_CONFIG_FILE, ACCEL_MIXED_PRECISION,
// ACCEL_GRADIENT_ACCUMULATION_STEPS, ACCEL_USE_CPU, ACCEL_ZERO_STAGE, ACCEL_FSDP_SHARDING_STRATEGY;
// see base/env.cpp) > config file > default. Bad values name where they came from.
AcceleratorConfig resolve_config(const ConfigOverrides& args = {});

// The candidate closest to `key` by edit distance (for "did you mean"); "" when none is close.
std::string closest_key(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace accel
