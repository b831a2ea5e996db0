// What both config dialects share (accelerator/config.h): DeepSpeed's batch rule, names, "did you
// mean", resolve_config's precedence, the shipped configs, and the key table test that holds every
// key of both dialects to "acted on, or listed as ignored with its reason".
// Rank-independent: every rank runs the same checks on its own (temp files are per process).
#include "accelerator/config.h"

#include "accelerator/config_detail.h"
#include "accelerator/config_keys.h"
#include "config_test_support.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace accel {
namespace {

using namespace config_test;
using zero::Strategy;
using WrapKind = zero::WrapPolicy::Kind;

// ---------------------------------------------------------------------------------------------------
// resolve_batch: DeepSpeed's batch rule (deepspeed/runtime/config.py, _set_batch_related_parameters)

using OptI = std::optional<std::int64_t>;

// The key table's rows of one dialect (accelerator/config_keys.h), as the checks below walk them.
struct Row {
  std::string section, name;
  const char* ignored;
};
std::vector<Row> rows_of(config_keys::Dialect d) {
  std::vector<Row> rows;
  for (const auto& k : config_keys::all())
    if (k.dialect == d) rows.push_back({k.section, k.name, k.ignored});
  return rows;
}
BatchConfig triad(OptI t, OptI m, OptI g) { return BatchConfig{t, m, g}; }

TEST(ConfigBatch, AllThree) {
  const auto b = resolve_batch(triad(32, 4, 2), 4, std::nullopt, 1, "ds.json");
  EXPECT_EQ(b.train_batch_size, OptI(32));
  auto m = error_of([] { resolve_batch(triad(32, 4, 2), 2, std::nullopt, 1, "ds.json"); });
  EXPECT_HAS(m, "ds.json: batch sizes do not fit");
  EXPECT_HAS(m, "32 != 4 * 2 * 2");
}

TEST(ConfigBatch, Derivations) {
  auto b = resolve_batch(triad(32, 4, std::nullopt), 2, std::nullopt, 7, "s");  // TBS + MBS -> GAS (not the default)
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(4));
  b = resolve_batch(triad(32, std::nullopt, 2), 4, std::nullopt, 1, "s");  // TBS + GAS -> MBS
  EXPECT_EQ(b.micro_batch_per_gpu, OptI(4));
  b = resolve_batch(triad(std::nullopt, 4, 2), 3, std::nullopt, 1, "s");  // MBS + GAS -> TBS
  EXPECT_EQ(b.train_batch_size, OptI(24));
  b = resolve_batch(triad(16, std::nullopt, std::nullopt), 4, std::nullopt, 1, "s");  // TBS only
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(1));
  EXPECT_EQ(b.micro_batch_per_gpu, OptI(4));
  b = resolve_batch(triad(std::nullopt, 8, std::nullopt), 2, std::nullopt, 1, "s");  // MBS only
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(1));
  EXPECT_EQ(b.train_batch_size, OptI(16));
  // "auto" everywhere: the loader gives the micro batch, the Accelerator the accumulation.
  b = resolve_batch(triad(std::nullopt, std::nullopt, std::nullopt), 2, 8, 3, "s");
  EXPECT_EQ(b.micro_batch_per_gpu, OptI(8));
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(3));
  EXPECT_EQ(b.train_batch_size, OptI(48));
  // TBS given, micro from the loader: accumulation derived.
  b = resolve_batch(triad(64, std::nullopt, std::nullopt), 2, 8, 1, "s");
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(4));
}

TEST(ConfigBatch, Failures) {
  EXPECT_HAS(error_of([] { resolve_batch(triad(30, 4, std::nullopt), 2, std::nullopt, 1, "ds.json"); }),
             "ds.json: cannot derive gradient_accumulation_steps: train_batch_size is not a multiple of "
             "train_micro_batch_size_per_gpu * world size (train_batch_size 30, train_micro_batch_size_per_gpu 4");
  EXPECT_HAS(error_of([] { resolve_batch(triad(30, std::nullopt, 4), 2, std::nullopt, 1, "ds.json"); }),
             "cannot derive train_micro_batch_size_per_gpu");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, std::nullopt, 2), 2, std::nullopt, 1, "ds.json"); }),
             "ds.json: either train_batch_size or train_micro_batch_size_per_gpu needs to be given");
  EXPECT_HAS(error_of([] { resolve_batch(triad(0, 4, 1), 1, std::nullopt, 1, "ds.json"); }),
             "ds.json: train_batch_size is 0, expected a positive integer");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, -2, 1), 1, std::nullopt, 1, "ds.json"); }),
             "train_micro_batch_size_per_gpu is -2");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, 4, 0), 1, std::nullopt, 1, "ds.json"); }),
             "gradient_accumulation_steps is 0");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, std::nullopt, 1), 1, 0, 1, "ds.json"); }),
             "the prepared loader's batch size is 0");
  EXPECT_HAS(error_of([] { resolve_batch(triad(8, 4, 2), 0, std::nullopt, 1, "ds.json"); }), "world size is 0");
}

// ---------------------------------------------------------------------------------------------------
// Helpers

TEST(ConfigHelpers, ClosestKey) {
  const std::vector<std::string> keys = {"num_processes", "num_machines", "machine_rank", "zero_stage"};
  EXPECT_EQ(closest_key("num_proceses", keys), "num_processes");
  EXPECT_EQ(closest_key("NUM_MACHINES", keys), "num_machines");
  EXPECT_EQ(closest_key("stage", keys), "zero_stage");
  EXPECT_EQ(closest_key("learning_rate", keys), "");
  EXPECT_EQ(closest_key("x", {}), "");
}

TEST(ConfigHelpers, Names) {
  EXPECT_STREQ(to_string(DistributedType::DeepSpeed), "DEEPSPEED");
  EXPECT_STREQ(to_string(DistributedType::MultiCpu), "MULTI_CPU");
  EXPECT_STREQ(to_string(MixedPrecision::Bf16), "bf16");
  EXPECT_EQ(parse_mixed_precision("FP16", "argument"), MixedPrecision::Fp16);
  EXPECT_HAS(error_of([] { parse_mixed_precision("half", "argument"); }),
             "argument: mixed_precision is 'half'; allowed values: no, fp16, bf16, fp8");
}

// Banners name the strategy as the config file does (a FULL_SHARD config is not "ZERO_3").
TEST(ConfigHelpers, StrategyInTheConfigsOwnTerms) {
  const std::vector<std::pair<std::string, std::string>> want = {
      {"configs/fsdp/full_shard.yaml", "FSDP FULL_SHARD"},
      {"configs/fsdp/shard_grad_op.yaml", "FSDP SHARD_GRAD_OP"},
      {"configs/fsdp/no_shard.yaml", "FSDP NO_SHARD"},
      {"configs/fsdp/hybrid_shard.yaml", "FSDP HYBRID_SHARD"},
      {"configs/fsdp/hsdp.yaml", "FSDP FULL_SHARD in groups of 2 ranks"},
      {"configs/deepspeed/zero1.yaml", "DeepSpeed ZeRO-1"},
      {"configs/deepspeed/zero3.yaml", "DeepSpeed ZeRO-3"},
      {"configs/deepspeed/zero2.json", "DeepSpeed ZeRO-2"},
      {"configs/ddp.yaml", "DDP"},
  };
  for (const auto& [file, name] : want) EXPECT_EQ(strategy_name(load_config_file(source_path(file))), name) << file;
  EXPECT_EQ(strategy_name(AcceleratorConfig{}), "single process");
}

// ---------------------------------------------------------------------------------------------------
// resolve_config: explicit argument > ACCEL_* environment > file > default

TEST(ConfigEnv, NoFileAnywhereGivesDefaults) {
  EnvGuard env;
  const auto c = resolve_config();
  EXPECT_EQ(c.source, "");
  EXPECT_EQ(c.distributed_type, DistributedType::No);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
}

TEST(ConfigEnv, ConfigFile) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/shard_grad_op.yaml"));
  EXPECT_EQ(resolve_config().spec.strategy, Strategy::Zero2);
  ConfigOverrides args;
  args.config_file = source_path("configs/ddp.yaml");
  EXPECT_EQ(resolve_config(args).distributed_type, DistributedType::MultiCpu);  // the argument wins
  env.set("ACCEL_CONFIG_FILE", "/nonexistent/x.yaml");
  EXPECT_HAS(error_of([] { resolve_config(); }), "/nonexistent/x.yaml: cannot read config file");
}

TEST(ConfigEnv, MixedPrecision) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/ddp.yaml"));
  EXPECT_EQ(resolve_config().mixed_precision, MixedPrecision::No);  // the file's
  env.set("ACCEL_MIXED_PRECISION", "bf16");
  EXPECT_EQ(resolve_config().mixed_precision, MixedPrecision::Bf16);  // environment > file
  ConfigOverrides args;
  args.mixed_precision = "fp16";
  EXPECT_EQ(resolve_config(args).mixed_precision, MixedPrecision::Fp16);  // argument > environment
  env.set("ACCEL_MIXED_PRECISION", "fp64");
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "ACCEL_MIXED_PRECISION (environment): mixed_precision is 'fp64'; did you mean 'fp16'?");
  EXPECT_HAS(error_of([] { resolve_config(); }), "allowed values: no, fp16, bf16, fp8");
  args.mixed_precision = "half";
  EXPECT_HAS(error_of([&] { resolve_config(args); }), "argument: mixed_precision is 'half'");
}

TEST(ConfigEnv, GradientAccumulationSteps) {
  EnvGuard env;
  env.set("ACCEL_GRADIENT_ACCUMULATION_STEPS", "4");
  auto c = resolve_config();
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  ConfigOverrides args;
  args.gradient_accumulation_steps = 2;
  EXPECT_EQ(resolve_config(args).gradient_accumulation_steps, 2);
  // Over a DeepSpeed JSON, the override is a given value of the batch triad.
  env.set("ACCEL_CONFIG_FILE", source_path("configs/deepspeed/zero1.yaml"));
  c = resolve_config();
  EXPECT_EQ(c.batch.gradient_accumulation_steps, OptI(4));
  env.set("ACCEL_GRADIENT_ACCUMULATION_STEPS", "x");
  EXPECT_HAS(
      error_of([] { resolve_config(); }),
      "ACCEL_GRADIENT_ACCUMULATION_STEPS (environment): gradient_accumulation_steps is 'x', expected an integer >= 1");
  env.set("ACCEL_GRADIENT_ACCUMULATION_STEPS", "0");
  EXPECT_HAS(error_of([] { resolve_config(); }), "gradient_accumulation_steps is '0'");
  args.gradient_accumulation_steps = 0;
  EXPECT_HAS(error_of([&] { resolve_config(args); }), "argument: gradient_accumulation_steps is '0'");
}

TEST(ConfigEnv, UseCpu) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/full_shard.yaml"));
  EXPECT_FALSE(resolve_config().use_cpu);
  env.set("ACCEL_USE_CPU", "1");
  EXPECT_TRUE(resolve_config().use_cpu);
  ConfigOverrides args;
  args.use_cpu = false;
  EXPECT_FALSE(resolve_config(args).use_cpu);
  env.set("ACCEL_USE_CPU", "maybe");
  EXPECT_HAS(error_of([] { resolve_config(); }), "ACCEL_USE_CPU (environment): use_cpu is 'maybe', expected a boolean");
}

TEST(ConfigEnv, ZeroStageForcesDeepSpeed) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/ddp.yaml"));
  env.set("ACCEL_ZERO_STAGE", "3");
  auto c = resolve_config();
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  ConfigOverrides args;
  args.zero_stage = 1;
  EXPECT_EQ(resolve_config(args).spec.strategy, Strategy::Zero1);
  env.set("ACCEL_ZERO_STAGE", "7");
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "ACCEL_ZERO_STAGE (environment): zero_stage is '7', expected 0, 1, 2 or 3");
  args.zero_stage = -1;
  EXPECT_HAS(error_of([&] { resolve_config(args); }), "argument: zero_stage is '-1'");
}

TEST(ConfigEnv, FsdpStrategyForcesFsdp) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/ddp.yaml"));
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP");
  auto c = resolve_config();
  EXPECT_EQ(c.distributed_type, DistributedType::Fsdp);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  // Over an FSDP file, only the strategy changes; the wrap policy stays.
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/full_shard.yaml"));
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "3");
  c = resolve_config();
  EXPECT_EQ(c.spec.strategy, Strategy::NoShard);
  EXPECT_EQ(c.spec.wrap.kind, WrapKind::TypeName);
  // FSDP's fifth strategy: ZeRO-2 sharded inside each node; a strategy after it takes the node groups away.
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "HYBRID_SHARD_ZERO2");
  c = resolve_config();
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  EXPECT_TRUE(c.spec.groups_by_node());
  EXPECT_EQ(strategy_name(c), "FSDP HYBRID_SHARD_ZERO2");
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/hsdp.yaml"));
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP");  // over a parallelism_config: its groups stay
  c = resolve_config();
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  EXPECT_EQ(c.spec.shard_group_size, 2);
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "HYBRID_SHARD_ZERO2");  // the blocks take the place of the nodes
  c = resolve_config();
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  EXPECT_EQ(c.spec.shard_group_size, 2);
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "NO_SHARD");
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "hsdp.yaml (with the strategy from ACCEL_FSDP_SHARDING_STRATEGY (environment)): parallelism_config's "
             "dp_replicate_size x dp_shard_size (2 x 2) shards each copy over 2 ranks, but fsdp_sharding_strategy "
             "NO_SHARD shards nothing");
  env.unset("ACCEL_FSDP_SHARDING_STRATEGY");
  env.set("ACCEL_ZERO_STAGE", "3");  // DeepSpeed cannot hold 2 copies: refused, not dropped
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "(2 x 2) replicates the model 2 times, but DeepSpeed's ZeRO stage 3 shards over every rank");
  env.unset("ACCEL_ZERO_STAGE");
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/full_shard.yaml"));
  // Both at the same level is ambiguous; an argument beats the environment.
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "FULL_SHARD");
  env.set("ACCEL_ZERO_STAGE", "2");
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "zero_stage (DEEPSPEED) and fsdp_sharding_strategy (FSDP) are both given");
  ConfigOverrides args;
  args.zero_stage = 1;
  c = resolve_config(args);
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero1);
  EXPECT_TRUE(ignored(c, "fsdp_sharding_strategy (ACCEL_FSDP_SHARDING_STRATEGY (environment))"));
}

// ---------------------------------------------------------------------------------------------------
// The shipped configs

// DeepSpeed's MiCS acts at stage 3 only, also when an override sets the stage: a stage-3 file overridden
// to stage 2 (or to FSDP) lists the key as ignored, naming what is in force; a stage-2 file overridden to
// stage 3 gets its groups, and the key leaves the ignored list.
TEST(ConfigEnv, MicsFollowsTheStageInForce) {
  EnvGuard env;
  TempDir dir;
  env.set("ACCEL_CONFIG_FILE", dir.write("m3.json", R"({"zero_optimization": {"stage": 3, "mics_shard_size": 2}})"));
  auto c = resolve_config();
  EXPECT_EQ(c.spec.shard_group_size, 2);
  EXPECT_EQ(ignored_entry(c, "zero_optimization.mics_shard_size"), "");
  env.set("ACCEL_ZERO_STAGE", "2");
  c = resolve_config();
  EXPECT_EQ(c.spec.shard_group_size, zero::ShardingSpec::kStrategyGroup);
  EXPECT_HAS(ignored_entry(c, "zero_optimization.mics_shard_size"), "the stage in force is 2");
  env.unset("ACCEL_ZERO_STAGE");
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "FULL_SHARD");
  c = resolve_config();
  EXPECT_EQ(c.spec.shard_group_size, zero::ShardingSpec::kStrategyGroup);
  EXPECT_HAS(ignored_entry(c, "zero_optimization.mics_shard_size"), "the distributed type in force is FSDP");
  env.unset("ACCEL_FSDP_SHARDING_STRATEGY");
  env.set("ACCEL_CONFIG_FILE", dir.write("m2.json", R"({"zero_optimization": {"stage": 2, "mics_shard_size": 2}})"));
  c = resolve_config();
  EXPECT_EQ(c.spec.shard_group_size, zero::ShardingSpec::kStrategyGroup);
  EXPECT_HAS(ignored_entry(c, "zero_optimization.mics_shard_size"), "the stage in force is 2");
  env.set("ACCEL_ZERO_STAGE", "3");
  c = resolve_config();
  EXPECT_EQ(c.spec.shard_group_size, 2);
  EXPECT_EQ(ignored_entry(c, "zero_optimization.mics_shard_size"), "");
}

TEST(ConfigShipped, Ddp) {
  const auto c = load_config_file(source_path("configs/ddp.yaml"));
  EXPECT_EQ(c.distributed_type, DistributedType::MultiCpu);
  EXPECT_EQ(c.spec.strategy, Strategy::NoShard);
  EXPECT_EQ(c.num_processes, 2);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_TRUE(c.use_cpu);
}

TEST(ConfigShipped, Fsdp) {
  const std::pair<const char*, Strategy> files[] = {{"full_shard", Strategy::Zero3},
                                                    {"shard_grad_op", Strategy::Zero2},
                                                    {"no_shard", Strategy::NoShard},
                                                    {"hybrid_shard", Strategy::HybridShard}};
  for (const auto& [name, strategy] : files) {
    SCOPED_TRACE(name);
    const auto c = load_config_file(source_path(std::string("configs/fsdp/") + name + ".yaml"));
    EXPECT_EQ(c.distributed_type, DistributedType::Fsdp);
    EXPECT_EQ(c.spec.strategy, strategy);
    EXPECT_EQ(c.spec.wrap.kind, WrapKind::TypeName);
    EXPECT_EQ(c.spec.wrap.type_names, std::vector<std::string>{"BlockImpl"});
    EXPECT_EQ(c.num_processes, 2);
    EXPECT_EQ(c.num_machines, 1);
    EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
    EXPECT_EQ(c.offload_param_device, "none");
    EXPECT_EQ(c.state_dict_type, StateDictType::Sharded);  // save_state keeps writing sharded checkpoints
  }
}

TEST(ConfigShipped, DeepSpeed) {
  const std::pair<const char*, Strategy> files[] = {{"zero1", Strategy::Zero1},
                                                    {"zero2", Strategy::Zero2},
                                                    {"zero3", Strategy::Zero3},
                                                    {"zero3_offload", Strategy::Zero3}};
  for (const auto& [name, strategy] : files) {
    SCOPED_TRACE(name);
    const auto c = load_config_file(source_path(std::string("configs/deepspeed/") + name + ".yaml"));
    EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
    EXPECT_EQ(c.spec.strategy, strategy);
    EXPECT_EQ(c.num_processes, 2);
    EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
    EXPECT_EQ(file_name(c.deepspeed_config_file), std::string(name) + ".json");
    EXPECT_FALSE(c.batch.train_batch_size || c.batch.micro_batch_per_gpu || c.batch.gradient_accumulation_steps);
    EXPECT_FALSE(c.gradient_clipping.has_value());
    const bool offload = std::string(name) == "zero3_offload";
    EXPECT_EQ(c.offload_optimizer_device, offload ? "cpu" : "none");
    EXPECT_EQ(c.offload_param_device, offload ? "cpu" : "none");
    // The JSON alone reads the same.
    EXPECT_EQ(load_config_file(c.deepspeed_config_file).spec.strategy, strategy);
    // With a loader of 4 samples per process on 2 ranks, "auto" resolves.
    const auto b = resolve_batch(c.batch, 2, 4, c.gradient_accumulation_steps, c.source);
    EXPECT_EQ(b.train_batch_size, OptI(8));
  }
  EXPECT_EQ(load_config_file(source_path("configs/deepspeed/zero1.yaml")).spec.bucket_bytes, 20000000);
  EXPECT_TRUE(load_config_file(source_path("configs/deepspeed/zero3.yaml")).zero3_save_16bit_model);
}

// ---------------------------------------------------------------------------------------------------
// Every key of both dialects is acted on or listed as ignored with its reason

// Everything a config decides (all but `source` and `ignored`), as text: two configs that print the
// same decide the same.
std::string decisions(const AcceleratorConfig& c) {
  auto opt = [](const auto& v) { return v ? fmt::format("{}", *v) : std::string("-"); };
  auto dt = [](const std::optional<c10::ScalarType>& t) {
    return t ? std::string(c10::toString(*t)) : std::string("-");
  };
  const auto& s = c.spec;
  std::string wrap = fmt::format("{}:{}:", static_cast<int>(s.wrap.kind), s.wrap.min_num_params);
  for (const auto& t : s.wrap.type_names) wrap += t + ",";
  const auto& l = c.loss_scaler;
  const auto& o = s.offload;
  const std::string offload =
      fmt::format("{}|{}|{}/{}|{}|{}/{}/{}/{}", o.optimizer_nvme_path, o.param_nvme_path, o.optimizer_buffer_count,
                  o.param_buffer_count, o.sub_group_size, o.aio.block_size, o.aio.queue_depth, o.aio.single_submit,
                  o.aio.overlap_events);
  std::string trackers = "log_with";  // (trackers: log_with and project_dir)
  for (const auto& n : c.log_with) trackers += " " + n;
  return offload + " " + trackers + " project_dir '" + c.project_dir + "' resume '" + c.resume_from_checkpoint + "' " +
         fmt::format(
             "type {} mp {} procs {} machines {} restarts {} cpu {} accum {} batch {}/{}/{} clip {} | {} prefetch "
             "{}/{} "
             "align {} "
             "wrap {} "
             "dtypes {}/{}/{}/{} fp8ag {} | offload {}/{} state {} fsdp_v {} save16 {} dsfile '{}' | scaler {} {} {} "
             "{} "
             "{} {} | fp8 {}",
             to_string(c.distributed_type), to_string(c.mixed_precision), opt(c.num_processes), opt(c.num_machines),
             c.max_restarts, c.use_cpu, c.gradient_accumulation_steps, opt(c.batch.train_batch_size),
             opt(c.batch.micro_batch_per_gpu), opt(c.batch.gradient_accumulation_steps), opt(c.gradient_clipping),
             s.to_string(), s.forward_prefetch, s.backward_prefetch, s.align_elements, wrap, dt(s.param_dtype),
             dt(s.reduce_dtype), dt(s.master_dtype), dt(s.accumulate_dtype), s.fp8_all_gather,
             c.offload_optimizer_device, c.offload_param_device, to_string(c.state_dict_type), c.fsdp_version,
             c.zero3_save_16bit_model, c.deepspeed_config_file, l.loss_scale, l.initial_scale_power,
             l.loss_scale_window, l.hysteresis, l.consecutive_hysteresis, l.min_loss_scale,
             c.fp8.enable_fsdp_float8_all_gather) +
         " recipe " + c.fp8.recipe + " format " + c.fp8.fp8_format +
         fmt::format(" groups {} of '{}' dp {}", s.shard_group_size, c.mics_shard_size.value_or(0),
                     c.parallelism ? c.parallelism->processes() : 0) +
         " optimizer " + (c.optimizer ? c.optimizer->type : "-") + " scheduler " +
         (c.scheduler ? c.scheduler->type : "-");
}

// What setting one key to a non-default value must do, when it is not simply "changes the config".
struct KeyCase {
  std::string value;         // the value written (YAML text, or JSON text)
  std::string base = "";     // extra lines (YAML) / a JSON object merged first, for keys that need context
  std::string refused = "";  // non-empty: the only non-default values are refused; the error says this
};

// YAML: a value for every key accel acts on (ignored keys get "true", which each of them accepts).
const std::map<std::string, KeyCase>& yaml_cases() {
  static const std::map<std::string, KeyCase> cases = {
      {"compute_environment", {"AMAZON_SAGEMAKER", "", "accel does not launch SageMaker jobs"}},
      {"distributed_type", {"FSDP"}},
      {"mixed_precision", {"bf16"}},
      {"use_cpu", {"true"}},
      {"num_processes", {"4"}},
      {"num_machines", {"2"}},
      {"machine_rank", {"1", "num_machines: 2\n"}},
      {"max_restarts", {"3"}},
      {"main_process_ip", {"10.0.0.1"}},
      {"main_process_port", {"29501"}},
      {"gradient_accumulation_steps", {"4"}},
      {"log_with", {"[tensorboard, jsonl]"}},
      {"project_dir", {"/tmp/runs"}},
      {"resume_from_checkpoint", {"latest"}},
      {"fsdp_config", {"{fsdp_version: 2}", "", "fsdp_config is set but distributed_type is"}},
      {"deepspeed_config", {"{zero_stage: 1}", "", "deepspeed_config is set but distributed_type is"}},
      {"fp8_config", {"{margin: 1}", "", "fp8_config is set but mixed_precision is"}},
      {"fp16", {"true"}},
      // (at the top level under MULTI_CPU: DDP copies only, so a shard size is refused)
      {"parallelism_config",
       {"{dp_shard_size: 2}", "",
        "dp_shard_size (1 x 2) shards each copy over 2 ranks, but MULTI_CPU (DDP) shards nothing"}},
      {"parallelism_config.parallelism_config_dp_replicate_size", {"2", "  parallelism_config_dp_shard_size: 2\n"}},
      {"parallelism_config.parallelism_config_dp_shard_size", {"2", "  parallelism_config_dp_replicate_size: 2\n"}},
      {"parallelism_config.parallelism_config_tp_size", {"2", "", "accel has no tensor, context or sequence"}},
      {"parallelism_config.parallelism_config_cp_size", {"2", "", "accel has no tensor, context or sequence"}},
      {"parallelism_config.parallelism_config_sp_size", {"2", "", "accel has no tensor, context or sequence"}},
      {"fsdp_config.fsdp_version", {"2"}},
      {"fsdp_config.fsdp_sharding_strategy", {"SHARD_GRAD_OP"}},
      {"fsdp_config.fsdp_reshard_after_forward", {"false"}},
      {"fsdp_config.fsdp_offload_params", {"true"}},
      {"fsdp_config.fsdp_auto_wrap_policy", {"NO_WRAP"}},
      {"fsdp_config.fsdp_transformer_layer_cls_to_wrap", {"BlockImpl"}},  // listed: no TRANSFORMER_BASED_WRAP
      {"fsdp_config.fsdp_min_num_params", {"1000"}},                      // listed: no SIZE_BASED_WRAP
      {"fsdp_config.fsdp_backward_prefetch", {"NO_PREFETCH"}},
      {"fsdp_config.fsdp_forward_prefetch", {"false"}},
      {"fsdp_config.fsdp_state_dict_type", {"FULL_STATE_DICT"}},
      {"fsdp_config.fsdp_activation_checkpointing", {"true"}},
      {"deepspeed_config.zero_stage", {"3"}},
      {"deepspeed_config.offload_optimizer_device", {"cpu"}},
      {"deepspeed_config.offload_param_device", {"cpu", "  zero_stage: 3\n"}},
      {"deepspeed_config.offload_optimizer_nvme_path", {"/nvme"}},
      {"deepspeed_config.offload_param_nvme_path", {"/nvme"}},
      {"deepspeed_config.gradient_accumulation_steps", {"4"}},
      {"deepspeed_config.gradient_clipping", {"1.0"}},
      {"deepspeed_config.zero3_save_16bit_model", {"true"}},
      {"fp8_config.enable_fsdp_float8_all_gather", {"false"}},
      {"fp8_config.recipe", {"rowwise"}},
      // Ignored, but their values are still checked: a valid non-default value each.
      {"fp8_config.backend", {"TE"}},
      {"fp8_config.fp8_format", {"E4M3"}},
      {"fp8_config.amax_history_len", {"16"}},
      {"fp8_config.amax_compute_algo", {"most_recent"}},
      {"fp8_config.margin", {"1"}},
      {"fp8_config.interval", {"2"}},
      {"fp8_config.pad_inner_dim", {"false"}},
      {"fp8_config.use_autocast_during_eval", {"true"}},
  };
  return cases;
}

std::string yaml_doc(const std::string& section, const std::string& key_lines, const std::string& base) {
  if (section.empty()) return "distributed_type: MULTI_CPU\n" + base + key_lines;
  if (section == "fsdp_config") return "distributed_type: FSDP\nfsdp_config:\n" + base + key_lines;
  if (section == "deepspeed_config") return "distributed_type: DEEPSPEED\ndeepspeed_config:\n" + base + key_lines;
  if (section == "parallelism_config") return "distributed_type: FSDP\nparallelism_config:\n" + base + key_lines;
  return "distributed_type: FSDP\nmixed_precision: fp8\nfp8_config:\n" + base + key_lines;
}

TEST(ConfigKeys, TheTableListsEachKeyOnceWithATypeAndAMeaningAndPrintsThemAll) {
  std::set<std::string> seen;
  for (const auto& k : config_keys::all()) {
    const std::string path = fmt::format("{}: {}.{}", config_keys::dialect_name(k.dialect), k.section, k.name);
    EXPECT_TRUE(seen.insert(path).second) << path << " is listed twice";
    EXPECT_GT(std::strlen(k.meaning), 0U) << path << " has no meaning";
    if (k.ignored) EXPECT_GT(std::strlen(k.ignored), 0U) << path;
    for (const auto& a : config_keys::aliases(k)) EXPECT_NE(a, k.name) << path;
  }
  const std::string both = config_keys::text(), yaml = config_keys::text(config_keys::Dialect::Accelerate),
                    json = config_keys::text(config_keys::Dialect::DeepSpeed);
  for (const auto& k : config_keys::all()) {
    EXPECT_NE(both.find(k.name), std::string::npos) << k.name;
    EXPECT_NE((k.dialect == config_keys::Dialect::Accelerate ? yaml : json).find(k.name), std::string::npos) << k.name;
  }
  EXPECT_EQ(json.find("fsdp_config"), std::string::npos);
  EXPECT_EQ(yaml.find("zero_optimization"), std::string::npos);
}

// The values the table lists for a choice are the ones the reader names when it refuses a bad value.
TEST(ConfigKeys, EveryChoiceListsTheValuesTheYamlReaderAccepts) {
  int checked = 0;
  for (const auto& k : config_keys::all()) {
    if (k.dialect != config_keys::Dialect::Accelerate || k.type != config_keys::Type::Choice) continue;
    const std::string path = *k.section ? std::string(k.section) + "." + k.name : std::string(k.name);
    SCOPED_TRACE(path);
    const std::string indent = *k.section ? "  " : "";
    const std::string doc = std::string(k.name) == "distributed_type"
                                ? "distributed_type: NOT_A_VALUE\n"
                                : yaml_doc(k.section, indent + k.name + ": NOT_A_VALUE\n", "");
    const std::string m = yaml_error(doc);
    std::string value;
    for (const char* c = k.range;; ++c) {
      if (*c == ',' || *c == '\0') {
        while (!value.empty() && value.front() == ' ') value.erase(value.begin());
        if (!value.empty()) EXPECT_HAS(m, value);
        value.clear();
        if (*c == '\0') break;
      } else {
        value += *c;
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 3);
}

TEST(ConfigKeys, EveryAccelerateKeyIsActedOnOrIgnoredWithItsReason) {
  TempDir dir;
  const std::string json = dir.write("z1.json", R"({"zero_optimization": {"stage": 1}})");
  for (const auto& row : rows_of(config_keys::Dialect::Accelerate)) {
    const std::string path = row.section.empty() ? row.name : row.section + "." + row.name;
    SCOPED_TRACE(path);
    KeyCase kc{"true"};
    if (auto it = yaml_cases().find(path); it != yaml_cases().end()) {
      kc = it->second;
    } else if (path == "deepspeed_config.deepspeed_config_file") {
      kc = {json};
    } else {
      ASSERT_NE(row.ignored, nullptr) << "accel acts on " << path << ": give it a value in yaml_cases()";
    }
    if (row.section == "" && row.name == "distributed_type") {  // required: compare two types
      EXPECT_NE(decisions(yaml("distributed_type: FSDP\n")), decisions(yaml("distributed_type: MULTI_CPU\n")));
      continue;
    }
    const std::string indent = row.section.empty() ? "" : "  ";
    const std::string with = yaml_doc(row.section, indent + row.name + ": " + kc.value + "\n", kc.base);
    const std::string without = yaml_doc(row.section, "", kc.base);
    if (!kc.refused.empty()) {
      EXPECT_HAS(yaml_error(with), kc.refused);
      continue;
    }
    const AcceleratorConfig c = yaml(with, dir.str()), plain = yaml(without, dir.str());
    const std::string entry = ignored_entry(c, path);
    if (row.ignored) {
      EXPECT_EQ(entry, path + ": " + row.ignored);
      EXPECT_EQ(decisions(c), decisions(plain)) << "an ignored key changed the config";
    } else {
      EXPECT_TRUE(decisions(c) != decisions(plain) || !entry.empty())
          << path << " changed nothing and is not listed as ignored";
    }
  }
}

// JSON: a value for every key accel acts on; the section's base object comes first. Ignored keys
// get a value of their kind.
const std::map<std::string, KeyCase>& json_cases() {
  static const std::map<std::string, KeyCase> cases = {
      {"train_batch_size", {"16"}},
      {"train_micro_batch_size_per_gpu", {"4"}},
      {"gradient_accumulation_steps", {"2"}},
      {"gradient_clipping", {"1.0"}},
      {"fp16", {R"({"enabled": true})"}},
      {"bf16", {R"({"enabled": true})"}},
      {"zero_optimization", {R"({"stage": 2})"}},
      {"communication_data_type", {R"("fp16")"}},
      {"data_types", {R"({"grad_accum_dtype": "bf16"})"}},
      {"data_types.grad_accum_dtype", {R"("bf16")"}},
      {"gradient_allreduce_op", {R"("sum")", "", "\"mean\" (accel averages gradients; \"sum\" is not supported)"}},
      {"amp", {R"({"enabled": true})", "", "NVIDIA Apex AMP is Python only"}},
      {"zero_optimization.stage", {"1"}},
      {"zero_optimization.mics_shard_size", {"2"}},
      {"zero_optimization.reduce_bucket_size", {"1000"}},
      {"zero_optimization.offload_optimizer", {R"({"device": "cpu"})"}},
      {"zero_optimization.offload_param", {R"({"device": "cpu"})"}},
      {"zero_optimization.cpu_offload", {"true"}},
      {"zero_optimization.cpu_offload_param", {"true"}},
      {"zero_optimization.offload_optimizer.device", {R"("cpu")"}},
      {"zero_optimization.offload_param.device", {R"("cpu")"}},
      {"zero_optimization.cpu_offload_use_pin_memory", {"true"}},
      {"zero_optimization.sub_group_size", {"1000"}},
      {"zero_optimization.offload_optimizer.nvme_path", {R"("/nvme")"}},
      {"zero_optimization.offload_optimizer.buffer_count", {"3"}},
      {"zero_optimization.offload_optimizer.pin_memory", {"true"}},
      {"zero_optimization.offload_param.nvme_path", {R"("/nvme")"}},
      {"zero_optimization.offload_param.buffer_count", {"3"}},
      {"zero_optimization.offload_param.pin_memory", {"true"}},
      {"aio", {R"({"block_size": 8192})"}},
      {"aio.block_size", {"8192"}},
      {"aio.queue_depth", {"4"}},
      {"aio.thread_count", {"2"}},
      {"aio.intra_op_parallelism", {"2"}},
      {"aio.single_submit", {"true"}},
      {"aio.overlap_events", {"false"}},
      {"zero_optimization.gather_16bit_weights_on_model_save", {"true"}},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", {"true"}},
      {"fp16.enabled", {"false"}},
      {"fp16.loss_scale", {"128"}},
      {"fp16.initial_scale_power", {"8"}},
      {"fp16.loss_scale_window", {"100"}},
      {"fp16.hysteresis", {"5"}},
      {"fp16.consecutive_hysteresis", {"true"}},
      {"fp16.min_loss_scale", {"0.5"}},
      {"bf16.enabled", {"false"}},
      {"bf16.bf16_master_weights_and_grads", {"true"}},
      {"activation_checkpointing", {R"({"number_checkpoints": 4})"}},
      {"tensorboard", {R"({"enabled": true})"}},
      {"tensorboard.enabled", {"true"}},
      {"csv_monitor", {R"({"enabled": true})"}},
      {"csv_monitor.enabled", {"true"}},
      {"optimizer", {R"({"type": "SGD", "params": {"lr": 0.1}})"}},
      {"scheduler", {R"({"type": "WarmupLR"})"}},
  };
  return cases;
}

TEST(ConfigKeys, EveryDeepSpeedKeyIsActedOnOrIgnoredWithItsReason) {
  using json = nlohmann::ordered_json;
  // Each section inside a context where its keys can take effect.
  const std::map<std::string, json> bases = {
      {"", json::object()},
      {"zero_optimization", json::parse(R"({"zero_optimization": {"stage": 3}})")},
      {"zero_optimization.offload_optimizer",
       json::parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none"}}})")},
      {"zero_optimization.offload_param",
       json::parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "none"}}})")},
      {"fp16", json::parse(R"({"fp16": {"enabled": true}})")},
      {"bf16", json::parse(R"({"bf16": {"enabled": true}})")},
      {"activation_checkpointing", json::parse(R"({"activation_checkpointing": {}})")},
      {"aio", json::parse(R"({"aio": {}})")},
      {"data_types", json::parse(R"({"data_types": {}})")},
      {"tensorboard", json::parse(R"({"tensorboard": {}})")},
      {"csv_monitor", json::parse(R"({"csv_monitor": {}})")},
  };
  auto kind_value = [](const std::string& name) -> std::string {
    // Ignored keys: a value each accepts (booleans for flags, numbers for sizes, objects for blocks).
    static const std::map<std::string, std::string> values = {
        {"nvme_path", R"("/nvme")"}, {"ratio", "0.5"}, {"cpuadam_cores_perc", "0.5"}, {"zeropp_loco_param", "{}"}};
    if (auto it = values.find(name); it != values.end()) return it->second;
    return "";
  };
  for (const auto& row : rows_of(config_keys::Dialect::DeepSpeed)) {
    const std::string path = row.section.empty() ? row.name : row.section + "." + row.name;
    SCOPED_TRACE(path);
    KeyCase kc{""};
    if (auto it = json_cases().find(path); it != json_cases().end()) {
      kc = it->second;
    } else {
      ASSERT_NE(row.ignored, nullptr) << "accel acts on " << path << ": give it a value in json_cases()";
      kc.value = kind_value(row.name);
    }
    json plain = bases.at(row.section);
    std::string ptr = "/";
    for (char ch : row.section) ptr += ch == '.' ? '/' : ch;
    if (!row.section.empty()) ptr += "/";
    ptr += row.name;
    // An ignored key without an explicit value: try the kinds a DeepSpeed key may have, in turn.
    std::vector<std::string> values =
        kc.value.empty() ? std::vector<std::string>{"true", "7", "{}", R"("x")"} : std::vector<std::string>{kc.value};
    bool checked = false;
    for (const auto& v : values) {
      json with = plain;
      with[json::json_pointer(ptr)] = json::parse(v);
      if (!kc.refused.empty()) {
        EXPECT_HAS(ds_error(with.dump()), kc.refused);
        checked = true;
        break;
      }
      if (row.ignored && ds_error(with.dump()).find("expected") != std::string::npos) continue;  // wrong kind
      const AcceleratorConfig c = ds(with.dump()), base = ds(plain.dump());
      const std::string entry = ignored_entry(c, path);
      if (row.ignored) {
        EXPECT_EQ(entry, path + ": " + row.ignored);
        EXPECT_EQ(decisions(c), decisions(base)) << "an ignored key changed the config";
      } else {
        EXPECT_TRUE(decisions(c) != decisions(base) || !entry.empty())
            << path << " changed nothing and is not listed as ignored";
      }
      checked = true;
      break;
    }
    EXPECT_TRUE(checked) << "no value of any kind was accepted for " << path;
  }
}

}  // namespace
}  // namespace accel
