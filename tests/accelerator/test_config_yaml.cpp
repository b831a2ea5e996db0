// The Accelerate YAML dialect (accelerator/config_yaml.cpp), strictly: every key has a valid and an
// invalid value; errors are checked for the file, the dotted key, the value and what is allowed.
// Rank-independent: every rank runs the same checks on its own (temp files are per process).
#include "accelerator/config.h"

#include "config_test_support.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace accel {
namespace {

using namespace config_test;
using zero::Strategy;
using WrapKind = zero::WrapPolicy::Kind;

// ---------------------------------------------------------------------------------------------------
// Top-level keys

TEST(ConfigYaml, MinimalIsDefaults) {
  const auto c = yaml("distributed_type: NO\n");
  EXPECT_EQ(c.distributed_type, DistributedType::No);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_FALSE(c.num_processes);  // (unset: the launcher decides)
  EXPECT_FALSE(c.num_machines);
  EXPECT_FALSE(c.use_cpu);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.spec.strategy, Strategy::NoShard);
  EXPECT_EQ(c.source, "t.yaml");
  EXPECT_TRUE(c.ignored.empty());
}

TEST(ConfigYaml, DistributedTypeValid) {
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\n").distributed_type, DistributedType::MultiCpu);
  EXPECT_EQ(yaml("distributed_type: multi_gpu\n").distributed_type, DistributedType::MultiGpu);
  const auto d = yaml("distributed_type: DEEPSPEED\n");
  EXPECT_EQ(d.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(d.spec.strategy, Strategy::Zero2);  // Accelerate's plugin default stage
  const auto f = yaml("distributed_type: FSDP\n");
  EXPECT_EQ(f.distributed_type, DistributedType::Fsdp);
  EXPECT_EQ(f.spec.strategy, Strategy::Zero3);  // FULL_SHARD
  EXPECT_TRUE(f.spec.reshard_after_forward);
  EXPECT_EQ(f.spec.wrap.kind, WrapKind::Marked);
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\n").spec.strategy, Strategy::NoShard);
}

TEST(ConfigYaml, DistributedTypeInvalid) {
  auto m = yaml_error("distributed_type: MULTI_CPUS\n");
  EXPECT_HAS(m, "t.yaml: distributed_type is 'MULTI_CPUS'");
  EXPECT_HAS(m, "did you mean 'MULTI_CPU'?");
  EXPECT_HAS(m, "allowed values: NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP");
  m = yaml_error("distributed_type: XLA\n");
  EXPECT_HAS(m, "t.yaml: distributed_type is 'XLA', which accel does not support");
  EXPECT_HAS(m, "allowed values: NO, MULTI_CPU");
}

TEST(ConfigYaml, MissingDistributedType) {
  auto m = yaml_error("num_processes: 2\nmixed_precision: 'no'\n");
  EXPECT_HAS(m, "t.yaml: missing required key 'distributed_type'");
  EXPECT_HAS(m, "allowed values: NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP");
  EXPECT_HAS(yaml_error(""), "missing required key 'distributed_type'");
}

TEST(ConfigYaml, MixedPrecisionValid) {
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: 'no'\n").mixed_precision, MixedPrecision::No);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: no\n").mixed_precision, MixedPrecision::No);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: fp16\n").mixed_precision, MixedPrecision::Fp16);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: BF16\n").mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: fp8\n").mixed_precision, MixedPrecision::Fp8);
  // Accelerate's legacy key.
  EXPECT_EQ(yaml("distributed_type: NO\nfp16: true\n").mixed_precision, MixedPrecision::Fp16);
}

TEST(ConfigYaml, MixedPrecisionInvalid) {
  auto m = yaml_error("distributed_type: NO\nmixed_precision: fp32\n");
  EXPECT_HAS(m, "t.yaml: mixed_precision is 'fp32'");
  EXPECT_HAS(m, "allowed values: no, fp16, bf16, fp8");
  m = yaml_error("distributed_type: NO\nmixed_precision: bf16\nfp16: true\n");
  EXPECT_HAS(m, "t.yaml: fp16 is true but mixed_precision is 'bf16'");
}

TEST(ConfigYaml, NumProcesses) {
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\nnum_processes: 4\n").num_processes, 4);
  auto m = yaml_error("distributed_type: MULTI_CPU\nnum_processes: two\n");
  EXPECT_HAS(m, "t.yaml: num_processes is 'two', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: 0\n"),
             "num_processes is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: 1.5\n"), "num_processes is '1.5'");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: [1, 2]\n"), "num_processes is '[1, 2]'");
}

TEST(ConfigYaml, NumMachinesAndMachineRank) {
  const auto c = yaml("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmachine_rank: 1\n");
  EXPECT_EQ(c.num_machines, 2);
  // accel launch places the ranks on machines (one mpirun); machine_rank is checked, then ignored.
  EXPECT_HAS(ignored_entry(c, "machine_rank"), "accel launch starts the ranks of every machine from one mpirun");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_machines: 0\n"),
             "t.yaml: num_machines is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: 3\nnum_machines: 2\n"),
             "num_processes is 3, expected a multiple of num_machines (2)");
  auto m = yaml_error("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmachine_rank: 2\n");
  EXPECT_HAS(m, "t.yaml: machine_rank is 2, expected 0..1 (num_machines is 2)");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmachine_rank: -1\n"),
             "machine_rank is '-1', expected an integer >= 0");
}

TEST(ConfigYaml, MainProcessIpAndPort) {
  // torchrun's rendezvous address: accel's ranks find each other through MPI. Checked, then ignored.
  const auto c = yaml("distributed_type: MULTI_CPU\nmain_process_ip: 10.1.2.3\nmain_process_port: 29500\n");
  EXPECT_HAS(ignored_entry(c, "main_process_ip"), "a torchrun rendezvous setting");
  EXPECT_HAS(ignored_entry(c, "main_process_port"), "a torchrun rendezvous setting");
  EXPECT_TRUE(ignored(yaml("distributed_type: MULTI_CPU\nmain_process_ip: node-0.cluster\n"), "main_process_ip"));
  // null, as older `accelerate config` wrote, is absent.
  const auto n = yaml("distributed_type: MULTI_CPU\nmain_process_ip: null\nmain_process_port: null\n");
  EXPECT_FALSE(ignored(n, "main_process_ip"));
  EXPECT_FALSE(ignored(n, "main_process_port"));
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmain_process_ip: my host\n"),
             "t.yaml: main_process_ip is 'my host', expected a host name or IP address");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmain_process_port: 70000\n"),
             "t.yaml: main_process_port is '70000', expected a port number 0..65535");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmain_process_port: http\n"), "main_process_port is 'http'");
}

TEST(ConfigYaml, UseCpu) {
  EXPECT_TRUE(yaml("distributed_type: MULTI_CPU\nuse_cpu: true\n").use_cpu);
  EXPECT_FALSE(yaml("distributed_type: MULTI_CPU\nuse_cpu: false\n").use_cpu);
  EXPECT_TRUE(yaml("distributed_type: MULTI_CPU\nuse_cpu: yes\n").use_cpu);
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nuse_cpu: maybe\n"),
             "t.yaml: use_cpu is 'maybe', expected a boolean (true or false)");
}

TEST(ConfigYaml, GradientAccumulationSteps) {
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\ngradient_accumulation_steps: 4\n").gradient_accumulation_steps, 4);
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\ngradient_accumulation_steps: 0\n"),
             "t.yaml: gradient_accumulation_steps is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\ngradient_accumulation_steps: many\n"),
             "gradient_accumulation_steps is 'many'");
}

TEST(ConfigYaml, ComputeEnvironment) {
  EXPECT_EQ(yaml("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\n").distributed_type, DistributedType::No);
  EXPECT_HAS(yaml_error("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: NO\n"),
             "t.yaml: compute_environment is 'AMAZON_SAGEMAKER': accel does not launch SageMaker jobs");
  EXPECT_HAS(yaml_error("compute_environment: CLOUD\ndistributed_type: NO\n"),
             "compute_environment is 'CLOUD'; allowed values: LOCAL_MACHINE, AMAZON_SAGEMAKER");
}

TEST(ConfigYaml, UnknownKeyDidYouMean) {
  auto m = yaml_error("distributed_type: MULTI_CPU\nnum_proceses: 2\n");
  EXPECT_HAS(m, "t.yaml: unknown key 'num_proceses'; did you mean 'num_processes'?");
  EXPECT_HAS(m, "(valid keys: compute_environment, distributed_type,");
  m = yaml_error("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n");
  EXPECT_HAS(m, "t.yaml: unknown key 'fsdp_config.fsdp_sharding_stratgy'; did you mean 'fsdp_sharding_strategy'?");
  EXPECT_HAS(m, "valid keys: fsdp_version, fsdp_sharding_strategy");
  m = yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  stage: 3\n");
  EXPECT_HAS(m, "unknown key 'deepspeed_config.stage'; did you mean 'zero_stage'?");
  m = yaml_error("distributed_type: NO\ncompletely_unrelated_thing: 1\n");
  EXPECT_HAS(m, "unknown key 'completely_unrelated_thing' (valid keys:");
}

TEST(ConfigYaml, WrongShapeDuplicateAndSyntax) {
  EXPECT_HAS(yaml_error("distributed_type: FSDP\nfsdp_config: FULL_SHARD\n"),
             "t.yaml: fsdp_config is 'FULL_SHARD', expected a mapping of keys");
  EXPECT_HAS(yaml_error("- a\n- b\n"), "t.yaml: the file is '[a, b]', expected a mapping of keys");
  EXPECT_HAS(yaml_error("distributed_type: NO\ndistributed_type: FSDP\n"), "t.yaml: distributed_type is given twice");
  EXPECT_HAS(yaml_error("distributed_type: [NO\n"), "t.yaml: not valid YAML at line");
}

TEST(ConfigYaml, PythonOnlyKeysAreIgnoredOnce) {
  const auto c = yaml(R"(compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
dynamo_config:
  dynamo_backend: INDUCTOR
enable_cpu_affinity: false
gpu_ids: all
main_training_function: main
megatron_lm_config: {}
rdzv_backend: static
same_network: true
tpu_env: []
tpu_name: my-tpu
tpu_use_cluster: false
tpu_use_sudo: false
)");
  for (const char* k :
       {"debug", "downcast_bf16", "dynamo_config", "enable_cpu_affinity", "gpu_ids", "main_training_function",
        "megatron_lm_config", "rdzv_backend", "same_network", "tpu_env", "tpu_name", "tpu_use_cluster", "tpu_use_sudo"})
    EXPECT_TRUE(ignored(c, k)) << k;
  EXPECT_EQ(c.ignored.front().rfind("debug:", 0), 0u) << "file order";
  EXPECT_HAS(ignored_entry(c, "tpu_name"), "TPU only");
  EXPECT_HAS(ignored_entry(c, "dynamo_config"), "Python only");
}

TEST(ConfigYaml, EmptyBlocksOfOtherTypesAreFine) {
  // Older `accelerate config` wrote these empty blocks for every distributed type.
  const auto c = yaml("distributed_type: MULTI_GPU\nfsdp_config: {}\ndeepspeed_config: {}\nfp8_config: {}\n");
  EXPECT_EQ(c.distributed_type, DistributedType::MultiGpu);
}

TEST(ConfigYaml, BlocksUnderTheWrongDistributedType) {
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"),
             "t.yaml: fsdp_config is set but distributed_type is MULTI_CPU; set distributed_type: FSDP");
  EXPECT_HAS(yaml_error("distributed_type: FSDP\ndeepspeed_config:\n  zero_stage: 3\n"),
             "t.yaml: deepspeed_config is set but distributed_type is FSDP; set distributed_type: DEEPSPEED");
  EXPECT_HAS(yaml_error("distributed_type: FSDP\nparallelism_config:\n  parallelism_config_tp_size: 2\n"),
             "t.yaml: parallelism_config.parallelism_config_tp_size is 2: accel has no tensor, context or sequence "
             "parallelism");
}

// ---------------------------------------------------------------------------------------------------
// parallelism_config: data parallelism as dp_replicate_size copies of dp_shard_size ranks (FSDP2's HSDP)

AcceleratorConfig parallel(const std::string& head, const std::string& block) {
  return yaml(head + "parallelism_config:\n" + block);
}
std::string parallel_error(const std::string& head, const std::string& block) {
  return yaml_error(head + "parallelism_config:\n" + block);
}

TEST(ConfigParallelism, CopiesOfShardGroupsUnderFsdp) {
  const std::string fsdp = "distributed_type: FSDP\nnum_processes: 4\n";
  // Accelerate's FSDP2 file: 2 copies, each FULL_SHARD over a block of 2 consecutive ranks.
  auto c = parallel(fsdp,
                    "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n"
                    "  parallelism_config_tp_size: 1\n  parallelism_config_cp_size: 1\n");
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(c.spec.shard_group_size, 2);
  ASSERT_TRUE(c.parallelism);
  EXPECT_EQ(c.parallelism->replicate, 2);
  EXPECT_EQ(c.parallelism->shard, 2);
  EXPECT_TRUE(c.ignored.empty());
  EXPECT_HAS(c.spec.to_string(), "in groups of 2 ranks replicated across the groups");
  // Without the prefix too (Accelerate adds it); SHARD_GRAD_OP in groups (FSDP's HYBRID_SHARD_ZERO2 shape).
  c = parallel(fsdp + "fsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n",
               "  dp_replicate_size: 2\n  dp_shard_size: 2\n");
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  EXPECT_EQ(c.spec.shard_group_size, 2);
  // HYBRID_SHARD takes the block instead of the node.
  c = parallel(fsdp + "fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n",
               "  dp_replicate_size: 4\n  dp_shard_size: 1\n");
  EXPECT_EQ(c.spec.strategy, Strategy::HybridShard);
  EXPECT_EQ(c.spec.shard_group_size, 1);
  EXPECT_FALSE(c.spec.groups_by_node());
  // One copy over every rank: FSDP as it is, the process count still checked.
  c = parallel(fsdp, "  dp_shard_size: 4\n");
  EXPECT_EQ(c.spec.shard_group_size, 4);
  EXPECT_EQ(c.parallelism->processes(), 4);
  // Sizes of 1 (or none) say nothing.
  c = parallel(fsdp, "  dp_replicate_size: 1\n  dp_shard_size: 1\n  tp_size: 1\n");
  EXPECT_EQ(c.spec.shard_group_size, zero::ShardingSpec::kStrategyGroup);
  EXPECT_FALSE(c.parallelism);
  // Context and sequence settings are listed as ignored, with why.
  c = parallel(fsdp, "  dp_shard_size: 4\n  cp_comm_strategy: alltoall\n  sp_seq_length_is_variable: true\n");
  EXPECT_HAS(ignored_entry(c, "parallelism_config.cp_comm_strategy"), "no context or sequence parallelism");
  EXPECT_HAS(ignored_entry(c, "parallelism_config.sp_seq_length_is_variable"), "no context or sequence");
  // DDP and DeepSpeed: copies only as they already are.
  c = parallel("distributed_type: MULTI_CPU\n", "  dp_replicate_size: 2\n");
  EXPECT_EQ(c.spec.strategy, Strategy::NoShard);
  EXPECT_EQ(c.parallelism->processes(), 2);
  c = parallel("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n", "  dp_shard_size: 2\n");
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(c.spec.shard_group_size, zero::ShardingSpec::kStrategyGroup);
}

TEST(ConfigParallelism, WhatCannotBeDoneIsRefused) {
  const std::string fsdp = "distributed_type: FSDP\n";
  EXPECT_HAS(parallel_error(fsdp + "num_processes: 8\n", "  dp_replicate_size: 2\n  dp_shard_size: 2\n"),
             "t.yaml: parallelism_config's dp_replicate_size x dp_shard_size (2 x 2) is 4 processes, but "
             "num_processes is 8");
  for (const char* k : {"tp_size", "cp_size", "sp_size"})
    EXPECT_HAS(parallel_error(fsdp, std::string("  ") + k + ": 2\n"),
               "is 2: accel has no tensor, context or sequence parallelism");
  EXPECT_HAS(parallel_error(fsdp, "  dp_shard_size: 0\n"),
             "parallelism_config.dp_shard_size is '0', expected an integer >= 1");
  EXPECT_HAS(parallel_error(fsdp + "fsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n",
                            "  dp_replicate_size: 2\n  dp_shard_size: 2\n"),
             "but fsdp_sharding_strategy NO_SHARD shards nothing");
  EXPECT_HAS(parallel_error("distributed_type: MULTI_GPU\n", "  dp_shard_size: 2\n"),
             "shards each copy over 2 ranks, but MULTI_GPU (DDP) shards nothing; use FSDP with FULL_SHARD or "
             "SHARD_GRAD_OP");
  EXPECT_HAS(parallel_error("distributed_type: DEEPSPEED\n", "  dp_replicate_size: 2\n  dp_shard_size: 2\n"),
             "replicates the model 2 times, but DeepSpeed's ZeRO stage 2 shards over every rank; use distributed_type "
             "FSDP for copies sharded in groups, or ZeRO-3 with zero_optimization.mics_shard_size");
  EXPECT_HAS(parallel_error(fsdp, "  dp_sharding: 2\n"), "parallelism_config.dp_sharding");
  // DeepSpeed's stage 0 shards nothing: copies are DDP, a shard size is refused.
  EXPECT_HAS(
      parallel_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 0\n", "  dp_shard_size: 4\n"),
      "shards each copy over 4 ranks, but DeepSpeed's stage 0 shards nothing; use a ZeRO stage");
  EXPECT_EQ(parallel("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 0\n", "  dp_replicate_size: 4\n")
                .spec.strategy,
            Strategy::NoShard);
  // A DeepSpeed JSON's MiCS: the same blocks agree (2 copies of 2), other blocks do not.
  TempDir dir;
  const std::string yaml = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: " +
                           dir.write("mics.json", R"({"zero_optimization": {"stage": 3, "mics_shard_size": 2}})") +
                           "\n";
  const auto agree = parallel(yaml, "  dp_replicate_size: 2\n  dp_shard_size: 2\n");
  EXPECT_EQ(agree.spec.shard_group_size, 2);
  EXPECT_EQ(agree.parallelism->processes(), 4);
  EXPECT_HAS(parallel_error(yaml, "  dp_shard_size: 4\n"),
             "(1 x 4) shards each copy over 4 ranks, but zero_optimization.mics_shard_size is 2; make them agree");
}

TEST(ConfigYaml, JsonSyntaxAccelerateConfig) {
  // Accelerate accepts .json configs: a JSON object with distributed_type is the YAML dialect.
  TempDir dir;
  const auto c = load_config_file(dir.write("acc.json", R"({"distributed_type": "FSDP", "num_processes": 2,
    "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}})"));
  EXPECT_EQ(c.distributed_type, DistributedType::Fsdp);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  EXPECT_EQ(c.num_processes, 2);
}

TEST(ConfigYaml, MissingFile) {
  auto m = error_of([] { load_config_file("/nonexistent/accel.yaml"); });
  EXPECT_HAS(m, "/nonexistent/accel.yaml: cannot read config file");
}

TEST(ConfigYaml, AccelerateTemplatesLoad) {
  // The shape of Accelerate's FSDP template (no layer class names) and of `accelerate config default`.
  const auto f = yaml(R"(compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
)");
  EXPECT_EQ(f.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(f.spec.wrap.kind, WrapKind::Marked);
  EXPECT_FALSE(f.spec.forward_prefetch);
  EXPECT_EQ(f.state_dict_type, StateDictType::Sharded);
  EXPECT_EQ(f.mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(f.num_processes, 8);
  const auto d = yaml(R"({"compute_environment": "LOCAL_MACHINE", "debug": false, "distributed_type": "MULTI_GPU",
    "downcast_bf16": false, "enable_cpu_affinity": false, "machine_rank": 0, "main_training_function": "main",
    "mixed_precision": "no", "num_machines": 1, "num_processes": 8, "rdzv_backend": "static",
    "same_network": false, "tpu_use_cluster": false, "tpu_use_sudo": false, "use_cpu": false})");
  EXPECT_EQ(d.distributed_type, DistributedType::MultiGpu);
  // The DeepSpeed plugin form (no JSON).
  const auto z = yaml(R"(compute_environment: LOCAL_MACHINE
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
mixed_precision: bf16
num_processes: 2
)");
  EXPECT_EQ(z.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(z.gradient_clipping, std::optional<double>(1.0));
}

// ---------------------------------------------------------------------------------------------------
// fsdp_config

AcceleratorConfig fsdp(const std::string& block) { return yaml("distributed_type: FSDP\nfsdp_config:\n" + block); }
std::string fsdp_error(const std::string& block) {
  return yaml_error("distributed_type: FSDP\nfsdp_config:\n" + block);
}

TEST(ConfigFsdp, ShardingStrategyNamesAndNumbers) {
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: FULL_SHARD\n").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: SHARD_GRAD_OP\n").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: no_shard\n").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: HYBRID_SHARD\n").spec.strategy, Strategy::HybridShard);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 1\n").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 2\n").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 3\n").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 4\n").spec.strategy, Strategy::HybridShard);
  // Accelerate adds the fsdp_ prefix to keys without it.
  EXPECT_EQ(fsdp("  sharding_strategy: SHARD_GRAD_OP\n").spec.strategy, Strategy::Zero2);
}

TEST(ConfigFsdp, ShardingStrategyInvalid) {
  auto m = fsdp_error("  fsdp_sharding_strategy: FULL\n");
  EXPECT_HAS(m, "t.yaml: fsdp_config.fsdp_sharding_strategy is 'FULL'");
  EXPECT_HAS(m, "allowed values: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2");
  EXPECT_HAS(fsdp_error("  fsdp_sharding_strategy: 7\n"),
             "fsdp_config.fsdp_sharding_strategy is '7', expected a strategy name");
}

// FSDP's fifth strategy: SHARD_GRAD_OP inside each node, replicated across nodes (ZeRO-2 with the node
// as its shard group).
TEST(ConfigFsdp, HybridShardZero2IsZero2InsideEachNode) {
  for (const char* v : {"HYBRID_SHARD_ZERO2", "5", "hybrid_shard_zero2"}) {
    SCOPED_TRACE(v);
    const auto c = fsdp(std::string("  fsdp_sharding_strategy: ") + v + "\n");
    EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
    EXPECT_EQ(c.spec.shard_group_size, zero::ShardingSpec::kNodeGroup);
    EXPECT_TRUE(c.spec.groups_by_node());
    EXPECT_HAS(c.spec.to_string(), "replicated across nodes");
    EXPECT_EQ(strategy_name(c), "FSDP HYBRID_SHARD_ZERO2");
  }
  EXPECT_HAS(fsdp_error("  fsdp_sharding_strategy: 6\n"), "5 HYBRID_SHARD_ZERO2");
}

TEST(ConfigFsdp, ReshardAfterForward) {
  auto c = fsdp("  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n");
  EXPECT_EQ(c.fsdp_version, 2);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_FALSE(c.spec.reshard_after_forward);
  EXPECT_TRUE(fsdp("  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n").spec.reshard_after_forward);
  // FSDP1: Accelerate's newer questionnaire writes the strategy under this key.
  EXPECT_EQ(fsdp("  fsdp_version: 1\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(fsdp("  fsdp_reshard_after_forward: HYBRID_SHARD\n  fsdp_sharding_strategy: HYBRID_SHARD\n").spec.strategy,
            Strategy::HybridShard);
  EXPECT_HAS(fsdp_error("  fsdp_version: 2\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"),
             "t.yaml: fsdp_config.fsdp_reshard_after_forward is 'SHARD_GRAD_OP', expected a boolean (true or false) "
             "with fsdp_version 2");
  EXPECT_HAS(
      fsdp_error("  fsdp_reshard_after_forward: NO_SHARD\n  fsdp_sharding_strategy: FULL_SHARD\n"),
      "fsdp_config.fsdp_reshard_after_forward is 'NO_SHARD' but fsdp_config.fsdp_sharding_strategy is 'FULL_SHARD'");
  EXPECT_HAS(fsdp_error("  fsdp_reshard_after_forward: sometimes\n"),
             "fsdp_config.fsdp_reshard_after_forward is 'sometimes'");
}

TEST(ConfigFsdp, AutoWrapPolicy) {
  auto c = fsdp(
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: BlockImpl, MlpImpl\n");
  EXPECT_EQ(c.spec.wrap.kind, WrapKind::TypeName);
  EXPECT_EQ(c.spec.wrap.type_names, (std::vector<std::string>{"BlockImpl", "MlpImpl"}));
  c = fsdp(
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: [BlockImpl, MlpImpl]\n");
  EXPECT_EQ(c.spec.wrap.type_names, (std::vector<std::string>{"BlockImpl", "MlpImpl"}));
  // No names (as Accelerate's own template writes it): the modules the model marked with accel::unit,
  // accel's counterpart of Transformers' _no_split_modules.
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n").spec.wrap.kind, WrapKind::Marked);
  c = fsdp("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1e8\n");
  EXPECT_EQ(c.spec.wrap.kind, WrapKind::Size);
  EXPECT_EQ(c.spec.wrap.min_num_params, 100000000);
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 2000\n").spec.wrap.min_num_params,
            2000);
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n").spec.wrap.min_num_params, 100000000);
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: NO_WRAP\n").spec.wrap.kind, WrapKind::None);
  EXPECT_EQ(fsdp("  fsdp_offload_params: false\n").spec.wrap.kind, WrapKind::Marked);
  // A layer list without the transformer policy is reported, not silently used.
  c = fsdp("  fsdp_auto_wrap_policy: NO_WRAP\n  fsdp_transformer_layer_cls_to_wrap: BlockImpl\n");
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_transformer_layer_cls_to_wrap"));
  c = fsdp(
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: BlockImpl\n"
      "  fsdp_min_num_params: 0\n");
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_min_num_params"));
}

TEST(ConfigFsdp, AutoWrapPolicyInvalid) {
  auto m = fsdp_error("  fsdp_auto_wrap_policy: LAYER_WRAP\n");
  EXPECT_HAS(m, "t.yaml: fsdp_config.fsdp_auto_wrap_policy is 'LAYER_WRAP'");
  EXPECT_HAS(m, "allowed values: TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP");
  EXPECT_HAS(
      fsdp_error("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: {a: b}\n"),
      "t.yaml: fsdp_config.fsdp_transformer_layer_cls_to_wrap is '{a: b}', expected module type names");
  EXPECT_HAS(
      fsdp_error("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: [[A]]\n"),
      "fsdp_config.fsdp_transformer_layer_cls_to_wrap is '[[A]]'");
  EXPECT_HAS(fsdp_error("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1.5\n"),
             "t.yaml: fsdp_config.fsdp_min_num_params is '1.5', expected an integer >= 0");
  EXPECT_HAS(fsdp_error("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: -5\n"),
             "fsdp_config.fsdp_min_num_params is '-5'");
}

TEST(ConfigFsdp, Prefetch) {
  EXPECT_TRUE(fsdp("  fsdp_backward_prefetch: BACKWARD_PRE\n").spec.backward_prefetch);
  // BACKWARD_POST prefetches as BACKWARD_PRE does, and says so.
  const auto post = fsdp("  fsdp_backward_prefetch: BACKWARD_POST\n");
  EXPECT_TRUE(post.spec.backward_prefetch);
  EXPECT_HAS(ignored_entry(post, "fsdp_config.fsdp_backward_prefetch"), "BACKWARD_POST is taken as BACKWARD_PRE");
  EXPECT_FALSE(ignored(fsdp("  fsdp_backward_prefetch: BACKWARD_PRE\n"), "fsdp_config.fsdp_backward_prefetch"));
  EXPECT_FALSE(fsdp("  fsdp_backward_prefetch: NO_PREFETCH\n").spec.backward_prefetch);
  EXPECT_FALSE(fsdp("  fsdp_backward_prefetch_policy: NO_PREFETCH\n").spec.backward_prefetch);  // old name
  EXPECT_HAS(fsdp_error("  fsdp_backward_prefetch: BEFORE\n"),
             "t.yaml: fsdp_config.fsdp_backward_prefetch is 'BEFORE'; allowed values: BACKWARD_PRE, BACKWARD_POST, "
             "NO_PREFETCH");
  EXPECT_FALSE(fsdp("  fsdp_forward_prefetch: false\n").spec.forward_prefetch);
  EXPECT_TRUE(fsdp("  fsdp_forward_prefetch: true\n").spec.forward_prefetch);
  EXPECT_HAS(fsdp_error("  fsdp_forward_prefetch: often\n"),
             "fsdp_config.fsdp_forward_prefetch is 'often', expected a boolean");
}

TEST(ConfigFsdp, OffloadParams) {
  auto c = fsdp("  fsdp_offload_params: true\n");
  EXPECT_EQ(c.offload_param_device, "cpu");
  EXPECT_EQ(c.offload_optimizer_device, "cpu");
  EXPECT_EQ(fsdp("  fsdp_offload_params: false\n").offload_param_device, "none");
  EXPECT_HAS(fsdp_error("  fsdp_offload_params: cpu\n"),
             "fsdp_config.fsdp_offload_params is 'cpu', expected a boolean");
}

TEST(ConfigFsdp, StateDictType) {
  // What save_state() writes by default: FULL whole tensors; SHARDED and LOCAL (and unset) each
  // rank's own slices.
  EXPECT_EQ(fsdp("  fsdp_state_dict_type: FULL_STATE_DICT\n").state_dict_type, StateDictType::Full);
  EXPECT_EQ(fsdp("  fsdp_state_dict_type: full_state_dict\n").state_dict_type, StateDictType::Full);
  EXPECT_EQ(fsdp("  fsdp_state_dict_type: SHARDED_STATE_DICT\n").state_dict_type, StateDictType::Sharded);
  EXPECT_EQ(fsdp("  fsdp_state_dict_type: LOCAL_STATE_DICT\n").state_dict_type, StateDictType::Sharded);
  EXPECT_EQ(fsdp("  fsdp_version: 1\n").state_dict_type, StateDictType::Sharded);
  EXPECT_HAS(fsdp_error("  fsdp_state_dict_type: FULL\n"),
             "fsdp_config.fsdp_state_dict_type is 'FULL'; did you mean 'FULL_STATE_DICT'?");
  EXPECT_HAS(fsdp_error("  fsdp_version: 2\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n"),
             "which FSDP version 2 does not have; allowed values: FULL_STATE_DICT, SHARDED_STATE_DICT");
}

TEST(ConfigFsdp, ActivationCheckpointingAndVersion) {
  EXPECT_TRUE(fsdp("  fsdp_activation_checkpointing: true\n").spec.activation_checkpointing);
  EXPECT_FALSE(fsdp("  fsdp_activation_checkpointing: false\n").spec.activation_checkpointing);
  EXPECT_FALSE(fsdp("  fsdp_version: 2\n").spec.activation_checkpointing);
  EXPECT_HAS(fsdp_error("  fsdp_activation_checkpointing: 2\n"),
             "fsdp_config.fsdp_activation_checkpointing is '2', expected a boolean");
  EXPECT_EQ(fsdp("  fsdp_version: 2\n").fsdp_version, 2);
  EXPECT_EQ(fsdp("  fsdp_version: '1'\n").fsdp_version, 1);
  EXPECT_HAS(fsdp_error("  fsdp_version: 3\n"), "t.yaml: fsdp_config.fsdp_version is '3', expected 1 or 2");
}

TEST(ConfigFsdp, PythonOnlyKeysAreIgnored) {
  const auto c = fsdp(
      "  fsdp_sync_module_states: true\n  fsdp_use_orig_params: true\n"
      "  fsdp_cpu_ram_efficient_loading: false\n");
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_sync_module_states"));
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_use_orig_params"));
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_cpu_ram_efficient_loading"));
  EXPECT_HAS(ignored_entry(c, "fsdp_config.fsdp_sync_module_states"), "rank 0's weights");
  EXPECT_HAS(fsdp_error("  fsdp_use_orig_params: perhaps\n"),
             "fsdp_config.fsdp_use_orig_params is 'perhaps', expected a boolean");
}

// ---------------------------------------------------------------------------------------------------
// deepspeed_config (without a JSON)

AcceleratorConfig dsy(const std::string& block) {
  return yaml("distributed_type: DEEPSPEED\ndeepspeed_config:\n" + block);
}
std::string dsy_error(const std::string& block) {
  return yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n" + block);
}

TEST(ConfigDeepSpeedYaml, ZeroStage) {
  EXPECT_EQ(dsy("  zero_stage: 0\n").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(dsy("  zero_stage: 1\n").spec.strategy, Strategy::Zero1);
  EXPECT_EQ(dsy("  zero_stage: 3\n").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(dsy("  zero3_init_flag: false\n").spec.strategy, Strategy::Zero2);
  EXPECT_HAS(dsy_error("  zero_stage: 4\n"), "t.yaml: deepspeed_config.zero_stage is '4', expected 0, 1, 2 or 3");
  EXPECT_HAS(dsy_error("  zero_stage: three\n"), "deepspeed_config.zero_stage is 'three'");
}

TEST(ConfigDeepSpeedYaml, OffloadDevices) {
  auto c = dsy("  zero_stage: 3\n  offload_optimizer_device: cpu\n  offload_param_device: cpu\n");
  EXPECT_EQ(c.offload_optimizer_device, "cpu");
  EXPECT_EQ(c.offload_param_device, "cpu");
  c = dsy("  offload_optimizer_device: nvme\n  offload_optimizer_nvme_path: /nvme\n");
  EXPECT_EQ(c.offload_optimizer_device, "nvme");
  EXPECT_EQ(c.spec.offload.optimizer_nvme_path, "/nvme");
  EXPECT_HAS(
      dsy_error("  offload_optimizer_device: nvme\n"),
      "deepspeed_config.offload_optimizer_device is nvme but deepspeed_config.offload_optimizer_nvme_path is not "
      "set");
  EXPECT_EQ(dsy("  offload_optimizer_device: none\n").offload_optimizer_device, "none");
  EXPECT_HAS(dsy_error("  offload_optimizer_device: disk\n"),
             "t.yaml: deepspeed_config.offload_optimizer_device is 'disk'; allowed values: none, cpu, nvme");
  EXPECT_HAS(dsy_error("  offload_param_device: gpu\n"), "deepspeed_config.offload_param_device is 'gpu'");
  EXPECT_HAS(dsy_error("  zero_stage: 2\n  offload_param_device: cpu\n"),
             "deepspeed_config.offload_param_device is 'cpu', which needs zero_stage 3 (zero_stage is 2)");
}

TEST(ConfigDeepSpeedYaml, AccumulationClippingAndSave) {
  auto c = dsy("  gradient_accumulation_steps: 4\n  gradient_clipping: 1.0\n  zero3_save_16bit_model: true\n");
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, std::optional<std::int64_t>(4));
  EXPECT_EQ(c.gradient_clipping, std::optional<double>(1.0));
  EXPECT_TRUE(c.zero3_save_16bit_model);
  EXPECT_EQ(ignored_entry(c, "deepspeed_config.zero3_save_16bit_model"), "");  // save_model acts on it
  c = dsy("  gradient_accumulation_steps: auto\n  gradient_clipping: auto\n");
  EXPECT_FALSE(c.batch.gradient_accumulation_steps.has_value());
  EXPECT_FALSE(c.gradient_clipping.has_value());
  EXPECT_HAS(dsy_error("  gradient_accumulation_steps: 0\n"),
             "t.yaml: deepspeed_config.gradient_accumulation_steps is '0', expected an integer >= 1 or auto");
  EXPECT_HAS(dsy_error("  gradient_clipping: -1\n"),
             "deepspeed_config.gradient_clipping is '-1', expected a number >= 0");
  EXPECT_HAS(dsy_error("  gradient_clipping: big\n"), "deepspeed_config.gradient_clipping is 'big'");
  EXPECT_HAS(dsy_error("  zero3_save_16bit_model: maybe\n"),
             "deepspeed_config.zero3_save_16bit_model is 'maybe', expected a boolean");
  // The top-level accumulation (accel extension) and the DeepSpeed one must agree.
  EXPECT_EQ(yaml("distributed_type: DEEPSPEED\ngradient_accumulation_steps: 2\n").batch.gradient_accumulation_steps,
            std::optional<std::int64_t>(2));
  EXPECT_HAS(yaml_error("distributed_type: DEEPSPEED\ngradient_accumulation_steps: 2\ndeepspeed_config:\n"
                        "  gradient_accumulation_steps: 4\n"),
             "gradient_accumulation_steps is 2 but deepspeed_config.gradient_accumulation_steps is 4");
}

TEST(ConfigDeepSpeedYaml, LauncherKeysAreIgnored) {
  const auto c =
      dsy("  zero3_init_flag: true\n  deepspeed_multinode_launcher: standard\n  deepspeed_hostfile: /job/hostfile\n");
  EXPECT_TRUE(ignored(c, "deepspeed_config.zero3_init_flag"));
  EXPECT_TRUE(ignored(c, "deepspeed_config.deepspeed_multinode_launcher"));
  EXPECT_TRUE(ignored(c, "deepspeed_config.deepspeed_hostfile"));
}

// ---------------------------------------------------------------------------------------------------
// deepspeed_config.deepspeed_config_file: the YAML names a DeepSpeed JSON

const char* kZero3Json = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": 1e6},
  "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}
})";

TEST(ConfigDeepSpeedFile, LoadsTheJsonBesideTheYaml) {
  TempDir dir;
  dir.write("z3.json", kZero3Json);
  const std::string yml = dir.write("z3.yaml",
                                    "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                    "  deepspeed_config_file: z3.json\n  zero3_init_flag: false\n");
  const auto c = load_config_file(yml);
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(c.spec.bucket_bytes, 4000000);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, std::optional<std::int64_t>(4));
  EXPECT_EQ(c.gradient_clipping, std::optional<double>(1.0));
  EXPECT_EQ(c.num_processes, 2);
  EXPECT_EQ(c.deepspeed_config_file, dir.str() + "/z3.json");
  EXPECT_HAS(c.source, "z3.yaml");
  EXPECT_HAS(c.source, "z3.json");
  EXPECT_TRUE(ignored(c, "zero_optimization.overlap_comm"));
  EXPECT_TRUE(ignored(c, "deepspeed_config.zero3_init_flag"));
  ASSERT_TRUE(c.optimizer && c.scheduler);  // the JSON's blocks come along
  EXPECT_EQ(c.optimizer->type, "SGD");
  EXPECT_EQ(c.scheduler->type, "WarmupLR");
}

TEST(ConfigDeepSpeedFile, MissingJson) {
  TempDir dir;
  auto m =
      yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nope.json\n", dir.str());
  EXPECT_HAS(
      m, "t.yaml: deepspeed_config.deepspeed_config_file is 'nope.json', which is neither in the working directory");
  m = yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: /nonexistent/ds.json\n");
  EXPECT_HAS(m, "deepspeed_config.deepspeed_config_file is '/nonexistent/ds.json', which does not exist");
}

TEST(ConfigDeepSpeedFile, ErrorsInTheJsonNameTheJson) {
  TempDir dir;
  const std::string json = dir.write("bad.json", R"({"zero_optimization": {"stage": 5}})");
  auto m = yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: " + json + "\n");
  EXPECT_HAS(m, json + ": zero_optimization.stage is '5', expected 0, 1, 2 or 3");
}

TEST(ConfigDeepSpeedFile, KeysTheJsonDecidesAreContradictions) {
  TempDir dir;
  const std::string json = dir.write("z3.json", kZero3Json);
  const std::string head = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: " + json + "\n";
  for (const char* line :
       {"  zero_stage: 3\n", "  offload_optimizer_device: cpu\n", "  offload_param_device: none\n",
        "  gradient_accumulation_steps: 2\n", "  gradient_clipping: 1.0\n", "  zero3_save_16bit_model: true\n"}) {
    const std::string key = std::string(line).substr(2, std::string(line).find(':') - 2);
    auto m = yaml_error(head + line);
    EXPECT_HAS(m, "t.yaml: the following keys are set in both t.yaml and " + json);
    EXPECT_HAS(m, "deepspeed_config." + key);
    EXPECT_HAS(m, "remove them from the YAML");
  }
  auto m = yaml_error(head + "  zero_stage: 3\n  gradient_clipping: 1.0\n");
  EXPECT_HAS(m, "deepspeed_config.zero_stage, deepspeed_config.gradient_clipping");
}

TEST(ConfigDeepSpeedFile, MixedPrecisionAgainstTheJson) {
  TempDir dir;
  const std::string bf16 = dir.write("bf16.json", kZero3Json);
  const std::string autop = dir.write("auto.json", R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})");
  const std::string fp32 = dir.write("fp32.json", R"({"zero_optimization": {"stage": 1}})");
  auto with = [](const std::string& mp, const std::string& json) {
    return "distributed_type: DEEPSPEED\nmixed_precision: " + mp +
           "\ndeepspeed_config:\n  deepspeed_config_file: " + json + "\n";
  };
  EXPECT_EQ(yaml(with("'no'", bf16)).mixed_precision, MixedPrecision::Bf16);   // 'no' = not set: the JSON decides
  EXPECT_EQ(yaml(with("bf16", bf16)).mixed_precision, MixedPrecision::Bf16);   // agree
  EXPECT_EQ(yaml(with("fp16", autop)).mixed_precision, MixedPrecision::Fp16);  // "auto": the YAML decides
  EXPECT_EQ(yaml(with("'no'", autop)).mixed_precision, MixedPrecision::No);
  auto m = yaml_error(with("fp16", bf16));
  EXPECT_HAS(m, "the following keys are set in both t.yaml and " + bf16);
  EXPECT_HAS(m, "mixed_precision ('fp16' in the YAML, 'bf16' in the JSON)");
  EXPECT_HAS(yaml_error(with("bf16", fp32)), "mixed_precision ('bf16' in the YAML, 'no' in the JSON)");
}

TEST(ConfigDeepSpeedFile, TopLevelAccumulationAgainstTheJson) {
  TempDir dir;
  const std::string fixed = dir.write("ga2.json", kZero3Json);
  const std::string autog = dir.write("auto.json", R"({"gradient_accumulation_steps": "auto"})");
  auto with = [](int ga, const std::string& json) {
    return "distributed_type: DEEPSPEED\ngradient_accumulation_steps: " + std::to_string(ga) +
           "\ndeepspeed_config:\n  deepspeed_config_file: " + json + "\n";
  };
  const auto c = yaml(with(8, autog));
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, std::optional<std::int64_t>(8));
  EXPECT_EQ(yaml(with(2, fixed)).gradient_accumulation_steps, 2);
  EXPECT_HAS(yaml_error(with(3, fixed)), "gradient_accumulation_steps (3 in the YAML, 2 in the JSON)");
}

// ---------------------------------------------------------------------------------------------------
// fp8_config

TEST(ConfigFp8, Keys) {
  const auto c = yaml(R"(distributed_type: FSDP
mixed_precision: fp8
fp8_config:
  backend: te
  fp8_format: E4M3
  amax_history_len: 16
  amax_compute_algo: most_recent
  margin: 1
  interval: 2
  use_autocast_during_eval: true
  enable_fsdp_float8_all_gather: false
  pad_inner_dim: false
  override_linear_precision: [false, false, false]
)");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::Fp8);
  EXPECT_FALSE(c.fp8.enable_fsdp_float8_all_gather);
  EXPECT_FALSE(ignored(c, "fp8_config.enable_fsdp_float8_all_gather"));
  // accel's recipes are its own (the recipe key): the other recipe keys are checked, then listed as
  // ignored with why.
  for (const char* key : {"amax_history_len", "amax_compute_algo", "margin", "interval"})
    EXPECT_HAS(ignored_entry(c, std::string("fp8_config.") + key), "no delayed scaling");
  EXPECT_EQ(c.fp8.recipe, "tensorwise");  // the default
  EXPECT_EQ(c.fp8.fp8_format, "E4M3");    // acts: the tensorwise gradients in e4m3
  EXPECT_FALSE(ignored(c, "fp8_config.fp8_format"));
  // E5M2 (Transformer Engine's every tensor in e5m2) loads, trains as HYBRID, and says so.
  const auto e5 = yaml("distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  fp8_format: E5M2\n");
  EXPECT_EQ(e5.fp8.fp8_format, "HYBRID");
  EXPECT_HAS(ignored_entry(e5, "fp8_config.fp8_format"), "trains as HYBRID");
  EXPECT_HAS(error_of([] { yaml("distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  fp8_format: E3M4\n"); }),
             "fp8_config.fp8_format");
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  recipe: rowwise\n").fp8.recipe, "rowwise");
  EXPECT_HAS(error_of([] { yaml("distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  recipe: blockwise\n"); }),
             "fp8_config.recipe");
  EXPECT_HAS(ignored_entry(c, "fp8_config.backend"), "accel implements fp8 itself");
  EXPECT_HAS(ignored_entry(c, "fp8_config.pad_inner_dim"), "does not pad");
  EXPECT_HAS(ignored_entry(c, "fp8_config.use_autocast_during_eval"), "in eval as in training");
  EXPECT_TRUE(ignored(c, "fp8_config.override_linear_precision"));
  // The names `accelerate config` writes.
  const auto q = yaml(
      "distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  amax_history_length: 8\n"
      "  amax_compute_algorithm: max\n  optimization_level: O2\n");
  EXPECT_TRUE(ignored(q, "fp8_config.amax_history_length"));
  EXPECT_TRUE(ignored(q, "fp8_config.amax_compute_algorithm"));
  EXPECT_TRUE(ignored(q, "fp8_config.optimization_level"));
  const auto d = yaml("distributed_type: NO\nmixed_precision: fp8\n");
  EXPECT_TRUE(d.fp8.enable_fsdp_float8_all_gather);
  EXPECT_TRUE(d.ignored.empty());
}

TEST(ConfigFp8, Invalid) {
  const std::string head = "distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n";
  EXPECT_HAS(yaml_error(head + "  backend: XYZ\n"),
             "t.yaml: fp8_config.backend is 'XYZ'; allowed values: AO, TE, MSAMP");
  EXPECT_HAS(yaml_error(head + "  fp8_format: E3M4\n"), "fp8_config.fp8_format is 'E3M4'; did you mean 'E4M3'?");
  EXPECT_HAS(yaml_error(head + "  amax_history_len: 0\n"),
             "fp8_config.amax_history_len is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error(head + "  amax_compute_algo: average\n"),
             "fp8_config.amax_compute_algo is 'average'; allowed values: max, most_recent");
  EXPECT_HAS(yaml_error(head + "  margin: -1\n"), "fp8_config.margin is '-1', expected an integer >= 0");
  EXPECT_HAS(yaml_error(head + "  interval: 0\n"), "fp8_config.interval is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error(head + "  pad_inner_dim: sure\n"), "fp8_config.pad_inner_dim is 'sure', expected a boolean");
  EXPECT_HAS(yaml_error(head + "  use_autocast_during_eval: 3\n"), "fp8_config.use_autocast_during_eval is '3'");
  EXPECT_HAS(yaml_error(head + "  enable_fsdp_float8_all_gather: x\n"),
             "fp8_config.enable_fsdp_float8_all_gather is 'x'");
  EXPECT_HAS(yaml_error(head + "  amax_histroy_len: 3\n"),
             "unknown key 'fp8_config.amax_histroy_len'; did you mean 'amax_history_len'?");
  EXPECT_HAS(yaml_error("distributed_type: NO\nmixed_precision: bf16\nfp8_config:\n  backend: TE\n"),
             "t.yaml: fp8_config is set but mixed_precision is 'bf16'; set mixed_precision: fp8");
}

}  // namespace
}  // namespace accel
