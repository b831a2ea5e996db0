// accel config: the questionnaire (answers from a stream), the YAML it writes (parsed back by the real
// config parser), and explain's account of a config.
#include "cli/config_explain.h"
#include "cli/config_questions.h"

#include "accelerator/config.h"

#include "support/scoped_env.h"

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace accel::cli {
namespace {

AcceleratorConfig ask_and_parse(const std::string& answers, std::string* transcript = nullptr) {
  std::istringstream in(answers);
  std::ostringstream out;
  const ConfigAnswers a = ask_config_questions(in, out, /*cuda_devices=*/0);
  if (transcript) *transcript = out.str();
  return parse_accelerate_yaml(config_yaml(a), "answers");
}

TEST(ConfigQuestions, EnterEverywhereGivesCpuDdpOnTwoProcesses) {
  const AcceleratorConfig c = ask_and_parse("\n\n\n\n\n\n");
  EXPECT_EQ(c.distributed_type, DistributedType::MultiCpu);
  EXPECT_EQ(c.num_processes, 2);
  EXPECT_EQ(c.num_machines, 1);
  EXPECT_TRUE(c.use_cpu);
  EXPECT_EQ(c.spec.strategy, zero::Strategy::NoShard);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
}

TEST(ConfigQuestions, DeepSpeedZero3WithOffloadAndClipping) {
  // machines, processes, cpu, strategy, offload optimizer, offload params, clipping, accumulation, precision
  const AcceleratorConfig c = ask_and_parse("1\n4\nyes\nzero3\ncpu\nnone\n0.5\n2\nno\n");
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, zero::Strategy::Zero3);
  EXPECT_EQ(c.num_processes, 4);
  EXPECT_EQ(c.offload_optimizer_device, "cpu");
  EXPECT_EQ(c.offload_param_device, "none");
  ASSERT_TRUE(c.gradient_clipping.has_value());
  EXPECT_DOUBLE_EQ(*c.gradient_clipping, 0.5);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
}

TEST(ConfigQuestions, DeepSpeedZero3OffloadToNvmeAsksForTheDirectories) {
  // ..., offload optimizer nvme + its directory, offload params nvme + its directory, ...
  const AcceleratorConfig c = ask_and_parse("1\n2\nyes\nzero3\nnvme\n/tmp/opt\nnvme\n/tmp/par\n0\n1\nno\n");
  EXPECT_EQ(c.offload_optimizer_device, "nvme");
  EXPECT_EQ(c.offload_param_device, "nvme");
  EXPECT_EQ(c.spec.offload.optimizer_nvme_path, "/tmp/opt");
  EXPECT_EQ(c.spec.offload.param_nvme_path, "/tmp/par");
}

TEST(ConfigQuestions, FsdpHybridOverTwoMachinesWithLayerTypes) {
  const AcceleratorConfig c = ask_and_parse("2\n4\nyes\nHYBRID_SHARD\n\nBlockImpl, MlpImpl\nyes\n1\nbf16\n");
  EXPECT_EQ(c.distributed_type, DistributedType::Fsdp);
  EXPECT_EQ(c.spec.strategy, zero::Strategy::HybridShard);
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.spec.wrap.kind, zero::WrapPolicy::Kind::TypeName);
  EXPECT_EQ(c.spec.wrap.type_names, (std::vector<std::string>{"BlockImpl", "MlpImpl"}));
  EXPECT_TRUE(c.spec.activation_checkpointing);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::Bf16);
}

// FULL_SHARD over 8 processes in groups of 4 (3 does not divide 8 and is asked again): FSDP2's HSDP, a
// parallelism_config of 2 copies x 4 shards with fsdp_version 2, as Accelerate takes it; the file acts as
// ZeRO-3 in blocks of 4. SHARD_GRAD_OP in groups is FSDP2's reshard_after_forward false. HYBRID_SHARD_ZERO2
// is offered too.
TEST(ConfigQuestions, ShardGroupsWriteAParallelismConfig) {
  std::string transcript;
  const AcceleratorConfig c = ask_and_parse("1\n8\nyes\nfull_shard\n3\n4\n\n\n\n\n\n", &transcript);
  EXPECT_NE(transcript.find("8 processes do not split into groups of 3"), std::string::npos) << transcript;
  ASSERT_TRUE(c.parallelism.has_value());
  EXPECT_EQ(c.parallelism->replicate, 2);
  EXPECT_EQ(c.parallelism->shard, 4);
  EXPECT_EQ(c.fsdp_version, 2);
  EXPECT_EQ(c.spec.strategy, zero::Strategy::Zero3);
  EXPECT_EQ(c.spec.shard_group_size, 4);
  EXPECT_TRUE(c.spec.reshard_after_forward);
  for (const std::string& i : c.ignored) EXPECT_EQ(i.rfind("machine_rank:", 0), 0u) << i;  // the rest act
  const AcceleratorConfig grad_op = ask_and_parse("1\n4\nyes\nshard_grad_op\n2\n\n\n\n\n\n", &transcript);
  EXPECT_NE(transcript.find("fsdp_reshard_after_forward: false"), std::string::npos) << transcript;
  EXPECT_EQ(grad_op.spec.strategy, zero::Strategy::Zero3);
  EXPECT_FALSE(grad_op.spec.reshard_after_forward);
  EXPECT_EQ(grad_op.spec.shard_group_size, 2);
  // One process: no group to ask for, no note, FSDP1's SHARD_GRAD_OP.
  const AcceleratorConfig one = ask_and_parse("1\n1\nyes\nshard_grad_op\n\n\n\n\n\n", &transcript);
  EXPECT_EQ(transcript.find("copies of shard groups"), std::string::npos) << transcript;
  EXPECT_EQ(one.spec.strategy, zero::Strategy::Zero2);
  EXPECT_FALSE(one.parallelism.has_value());
  const AcceleratorConfig zero2_hybrid = ask_and_parse("2\n4\nyes\nhybrid_shard_zero2\n\n\n\n\n\n");
  EXPECT_EQ(zero2_hybrid.spec.strategy, zero::Strategy::Zero2);
  EXPECT_EQ(zero2_hybrid.spec.shard_group_size, zero::ShardingSpec::kNodeGroup);
}

TEST(ConfigQuestions, BadAnswersAreExplainedAndAskedAgain) {
  std::string transcript;
  // "two" and 0 are not counts; 3 processes do not spread over 2 machines; "maybe" is not yes/no;
  // "zero4" is not a strategy; SIZE_BASED_WRAP then 1e6 parameters.
  const AcceleratorConfig c =
      ask_and_parse("two\n2\n3\n0\n4\nmaybe\nno\nzero4\nshard_grad_op\n\nSIZE_BASED_WRAP\n1e6\n\n\n\n", &transcript);
  EXPECT_NE(transcript.find("please answer a whole number from 1 to"), std::string::npos) << transcript;
  EXPECT_NE(transcript.find("3 processes do not spread evenly over 2 machines"), std::string::npos);
  EXPECT_NE(transcript.find("please answer yes or no"), std::string::npos);
  EXPECT_NE(transcript.find("please answer one of: ddp, zero1"), std::string::npos);
  EXPECT_EQ(c.spec.strategy, zero::Strategy::Zero2);
  EXPECT_EQ(c.num_processes, 4);
  EXPECT_FALSE(c.parallelism.has_value());  // (shard over all 4: the default)
  EXPECT_FALSE(c.use_cpu);
  EXPECT_EQ(c.spec.wrap.kind, zero::WrapPolicy::Kind::Size);
  EXPECT_EQ(c.spec.wrap.min_num_params, 1000000);
  EXPECT_FALSE(c.spec.activation_checkpointing);  // the default
}

TEST(ConfigQuestions, EndOfInputIsAnError) {
  std::istringstream in("1\n2\n");
  std::ostringstream out;
  try {
    ask_config_questions(in, out, 0);
    FAIL() << "no error at end of input";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("input ended before the questions did"), std::string::npos) << e.what();
  }
}

TEST(ConfigQuestions, DefaultAnswersFollowTheDevices) {
  const AcceleratorConfig cpu = parse_accelerate_yaml(config_yaml(default_answers(0, "no")), "d");
  EXPECT_EQ(cpu.distributed_type, DistributedType::No);
  EXPECT_EQ(cpu.num_processes, 1);
  EXPECT_TRUE(cpu.use_cpu);
  const AcceleratorConfig gpus = parse_accelerate_yaml(config_yaml(default_answers(8, "bf16")), "d");
  EXPECT_EQ(gpus.distributed_type, DistributedType::MultiGpu);
  EXPECT_EQ(gpus.num_processes, 8);
  EXPECT_FALSE(gpus.use_cpu);
  EXPECT_EQ(gpus.mixed_precision, MixedPrecision::Bf16);
}

TEST(ConfigExplain, HybridShardNamesItsGroupsAndWhatEachRankHolds) {
  const AcceleratorConfig c = load_config_file(std::string(ACCEL_SOURCE_DIR) + "/configs/fsdp/hybrid_shard.yaml");
  const std::string e = explain_config(c, 8, 2);
  EXPECT_NE(e.find("FSDP HYBRID_SHARD"), std::string::npos) << e;
  EXPECT_NE(e.find("8 processes on 2 machines, 4 per machine"), std::string::npos) << e;
  EXPECT_NE(e.find("1/4 of it (sharded over the 4 ranks of its machine)"), std::string::npos) << e;
  EXPECT_NE(e.find("all-reduce across the 2 machines"), std::string::npos) << e;
  EXPECT_NE(e.find("{0..3}, {4..7}"), std::string::npos) << e;
  EXPECT_NE(e.find("{0,4}, {1,5}, {2,6}, {3,7}"), std::string::npos) << e;
}

// Copies of shard groups: parallelism_config's blocks (configs/fsdp/hsdp.yaml, 2 x 2), DeepSpeed's MiCS,
// and HYBRID_SHARD_ZERO2's nodes.
TEST(ConfigExplain, ShardGroupsInBlocksAndTheirCopies) {
  const AcceleratorConfig h = load_config_file(std::string(ACCEL_SOURCE_DIR) + "/configs/fsdp/hsdp.yaml");
  std::string e = explain_config(h);
  EXPECT_NE(e.find("FSDP FULL_SHARD (like ZeRO-3), each copy sharded over 2 consecutive ranks (parallelism_config's "
                   "dp_replicate_size x dp_shard_size (2 x 2))"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("1/2 of it (sharded over a block of 2 consecutive ranks)"), std::string::npos) << e;
  EXPECT_NE(e.find("reduce-scatter inside the block, then all-reduce across the 2 copies"), std::string::npos) << e;
  EXPECT_NE(e.find("Shard groups  {0..1}, {2..3}"), std::string::npos) << e;
  EXPECT_NE(e.find("Replicas      {0,2}, {1,3} (all-reduce across the copies)"), std::string::npos) << e;
  EXPECT_NE(e.find("Ignored keys  none"), std::string::npos) << e;

  const AcceleratorConfig m =
      parse_deepspeed_json(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 4}})", "mics.json");
  e = explain_config(m, 8, 1);
  EXPECT_NE(e.find("DeepSpeed ZeRO stage 3 with MiCS, each copy sharded over 4 consecutive ranks "
                   "(zero_optimization.mics_shard_size)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("{0..3}, {4..7}"), std::string::npos) << e;
  EXPECT_NE(e.find("{0,4}, {1,5}, {2,6}, {3,7}"), std::string::npos) << e;
  EXPECT_NE(explain_config(m, 6, 1).find("blocks of 4 consecutive ranks, which do not divide the 6 processes"),
            std::string::npos);

  const AcceleratorConfig z2 = parse_accelerate_yaml(
      "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n", "z2.yaml");
  e = explain_config(z2, 8, 2);
  EXPECT_NE(e.find("FSDP HYBRID_SHARD_ZERO2 (SHARD_GRAD_OP inside each machine"), std::string::npos) << e;
  EXPECT_NE(e.find("1/4 of it (sharded over the 4 ranks of its machine)"), std::string::npos) << e;
  EXPECT_NE(e.find("{0,4}, {1,5}, {2,6}, {3,7}"), std::string::npos) << e;
}

TEST(ConfigExplain, DeepSpeedJsonBatchTriadAndIgnoredKeys) {
  const AcceleratorConfig c = parse_deepspeed_json(
      R"({"train_batch_size": 32, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2},
          "wall_clock_breakdown": true})",
      "ds.json");
  const std::string e = explain_config(c, 4, 1);
  EXPECT_NE(e.find("DeepSpeed ZeRO stage 2"), std::string::npos) << e;
  EXPECT_NE(e.find("32 per optimizer step = 4 per rank x 2 micro-steps x 4 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("1/4 of it (sharded over all 4 ranks)"), std::string::npos) << e;
  EXPECT_NE(e.find("wall_clock_breakdown"), std::string::npos) << e;
  // At 3 ranks the triad does not divide: explain says so instead of failing.
  EXPECT_NE(explain_config(c, 3, 1).find("does not work out at this world size"), std::string::npos);
}

// The dtypes row names the accumulation dtype: the reduction's unless data_types.grad_accum_dtype
// says otherwise.
TEST(ConfigExplain, DtypesNameTheAccumulation) {
  auto dtypes = [](const std::string& json) {
    const std::string e = explain_config(parse_deepspeed_json(json, "ds.json"), 2, 1);
    const auto at = e.find("parameters bf16");
    return at == std::string::npos ? e : e.substr(at, e.find('\n', at) - at);
  };
  EXPECT_EQ(dtypes(R"({"bf16": {"enabled": true}})"),
            "parameters bf16, gradient reduction fp32, accumulation as the reduction, master fp32");
  EXPECT_EQ(dtypes(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})"),
            "parameters bf16, gradient reduction fp32, accumulation bf16, master fp32");
  // bf16 masters step on bf16 gradients: their window adds up in bf16 unless the config names another.
  EXPECT_EQ(
      dtypes(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})"),
      "parameters bf16, gradient reduction fp32, accumulation bf16 (as the bf16 masters' gradients), master bf16");
  EXPECT_EQ(dtypes(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true},
                       "data_types": {"grad_accum_dtype": "fp32"}})"),
            "parameters bf16, gradient reduction fp32, accumulation fp32, master bf16");
}

TEST(ConfigExplain, OptimizerAndSchedulerBlocks) {
  const AcceleratorConfig c = parse_deepspeed_json(
      R"({"zero_optimization": {"stage": 1}, "optimizer": {"type": "SGD", "params": {"lr": "auto", "momentum": 0.9}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 50, "warmup_max_lr": null}}})",
      "ds.json");
  const std::string e = explain_config(c);
  EXPECT_NE(e.find("Optimizer     SGD (lr auto (the program's), momentum 0.9), built by Accelerator::create_optimizer"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Schedule      WarmupLR (warmup_num_steps 50, warmup_max_lr null (the optimizer's lr)), built by "
                   "Accelerator::create_scheduler"),
            std::string::npos)
      << e;
  EXPECT_EQ(explain_config(parse_deepspeed_json(R"({"zero_optimization": {"stage": 1}})", "ds.json")).find("Optimizer"),
            std::string::npos);
}

TEST(ConfigExplain, DdpReplicatesEverything) {
  const AcceleratorConfig c = load_config_file(std::string(ACCEL_SOURCE_DIR) + "/configs/ddp.yaml");
  const std::string e = explain_config(c);
  EXPECT_NE(e.find("all of it (replicated on every rank)"), std::string::npos) << e;
  EXPECT_NE(e.find("all-reduced (averaged)"), std::string::npos) << e;
  EXPECT_EQ(e.find("Shard group"), std::string::npos) << e;
}

// What AcceleratorConfig::describe() said before `accel config explain` superseded it.
TEST(ConfigExplain, ShippedConfigsStrategyPrecisionAccumulationAndIgnoredKeys) {
  const std::string src = ACCEL_SOURCE_DIR;
  std::string e = explain_config(load_config_file(src + "/configs/fsdp/full_shard.yaml"));
  EXPECT_NE(e.find("FSDP FULL_SHARD (like ZeRO-3); FSDP version 1"), std::string::npos) << e;
  EXPECT_NE(e.find("1/2 of it at rest; one unit at a time is all-gathered"), std::string::npos) << e;
  EXPECT_NE(e.find("marked modules of type BlockImpl"), std::string::npos) << e;
  EXPECT_NE(e.find("Not in a unit only units are gathered one at a time;"), std::string::npos) << e;
  EXPECT_NE(e.find("a model that marks no module with accel::unit stays whole on every rank"), std::string::npos) << e;
  EXPECT_NE(e.find("fp32 compute, no mixed precision"), std::string::npos) << e;
  EXPECT_NE(e.find("1 micro-step per optimizer step"), std::string::npos) << e;
  EXPECT_NE(e.find("save_state writes sharded checkpoints"), std::string::npos) << e;
  // Shipped configs hold only keys that act here (config_launch_checks.sh explain_shipped checks all);
  // an Accelerate file's keys that do not are listed with their reason.
  EXPECT_NE(e.find("Ignored keys  none"), std::string::npos) << e;
  EXPECT_NE(
      explain_config(parse_accelerate_yaml("distributed_type: FSDP\nfsdp_config:\n  fsdp_use_orig_params: true\n", "f"))
          .find("  fsdp_config.fsdp_use_orig_params: "),
      std::string::npos);
  EXPECT_NE(e.find("kept from forward to backward (no activation checkpointing"), std::string::npos) << e;
  // Node-shared memory on one machine's CPUs (the default), and how to turn it off.
  EXPECT_NE(e.find("Node-shared   on CPUs (no GPU, or use_cpu), the 2 ranks of a shard group on one machine keep the "
                   "sharded parameters and the gradients they reduce-scatter in memory they all map: nothing is "
                   "all-gathered"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0 turn that off"), std::string::npos) << e;
  {
    test::ScopedEnv off("ACCEL_NODE_SHARED_PARAMS", "0");
    const std::string z2 = explain_config(load_config_file(src + "/configs/deepspeed/zero2.yaml"));
    EXPECT_NE(z2.find("keep the gradients they reduce-scatter in memory"), std::string::npos) << z2;
    const std::string z3 = explain_config(load_config_file(src + "/configs/fsdp/full_shard.yaml"));
    EXPECT_NE(z3.find("keep the gradients they reduce-scatter in memory"), std::string::npos) << z3;
    test::ScopedEnv off_too("ACCEL_NODE_SHARED_GRADS", "0");
    const std::string none = explain_config(load_config_file(src + "/configs/fsdp/full_shard.yaml"));
    EXPECT_EQ(none.find("Node-shared"), std::string::npos) << none;
  }
  EXPECT_EQ(explain_config(load_config_file(src + "/configs/ddp.yaml")).find("Node-shared"), std::string::npos);
  e = explain_config(
      parse_accelerate_yaml("distributed_type: FSDP\nfsdp_config:\n  fsdp_activation_checkpointing: true\n", "f"));
  EXPECT_NE(e.find("checkpointed per unit: each unit keeps only its inputs"), std::string::npos) << e;
  e = explain_config(parse_deepspeed_json(R"({"activation_checkpointing": {"profile": true}})", "ds.json"));
  EXPECT_NE(e.find("checkpointed per unit: each unit keeps only its inputs"), std::string::npos) << e;
  EXPECT_NE(e.find("activation_checkpointing.profile: "), std::string::npos) << e;
  e = explain_config(load_config_file(src + "/configs/deepspeed/zero2.yaml"));
  EXPECT_NE(e.find("DeepSpeed ZeRO stage 2"), std::string::npos) << e;
  EXPECT_NE(e.find("reduce-scatter"), std::string::npos) << e;
  EXPECT_NE(e.find("each rank's micro batch comes from its data loader"), std::string::npos) << e;  // "auto"
  EXPECT_EQ(e.find("Not in a unit"), std::string::npos) << e;  // ZeRO-2 keeps every parameter whole anyway
  e = explain_config(parse_deepspeed_json(R"({"fp16": {"enabled": true}, "train_batch_size": 16})", "ds.json"), 2, 1);
  EXPECT_NE(e.find("fp16 compute, fp32 master weights, dynamic loss scale from 2^16"), std::string::npos) << e;
  EXPECT_NE(e.find("16 per optimizer step = 8 per rank x 1 micro-steps x 2 ranks"), std::string::npos) << e;
  e = explain_config(AcceleratorConfig());
  EXPECT_NE(e.find("(defaults)"), std::string::npos) << e;
  EXPECT_NE(e.find("Ignored keys  none"), std::string::npos) << e;
  // fsdp_state_dict_type FULL_STATE_DICT: save_state writes whole tensors.
  e = explain_config(
      parse_accelerate_yaml("distributed_type: FSDP\nfsdp_config:\n  fsdp_state_dict_type: FULL_STATE_DICT\n", "f"));
  EXPECT_NE(e.find("save_state writes full checkpoints"), std::string::npos) << e;
}

// Every strategy's line names it as the strategy table does.
TEST(ConfigExplain, StrategyLineReadsTheTable) {
  for (const auto& row : zero::strategies()) {
    SCOPED_TRACE(row.name);
    AcceleratorConfig c;
    c.spec.strategy = row.strategy;
    c.distributed_type = DistributedType::DeepSpeed;
    EXPECT_NE(explain_config(c).find(fmt::format("DeepSpeed ZeRO stage {}", row.zero_stage)), std::string::npos);
    c.distributed_type = DistributedType::Fsdp;
    EXPECT_NE(explain_config(c).find(fmt::format("FSDP {};", row.fsdp_label)), std::string::npos);
  }
}

// Where parameters are sharded, explain says that only units are gathered one at a time and that a
// model with none stays whole on every rank; elsewhere it has nothing to say about it.
TEST(ConfigExplain, SaysWhatStaysWholeWhereParametersAreSharded) {
  for (const auto& row : zero::strategies()) {
    SCOPED_TRACE(row.name);
    AcceleratorConfig c;
    c.spec.strategy = row.strategy;
    c.distributed_type = DistributedType::DeepSpeed;
    const std::string e = explain_config(c, 4, 1);
    EXPECT_EQ(e.find("a model that marks no module with accel::unit stays whole on every rank") != std::string::npos,
              row.shards_parameters)
        << e;
  }
}

}  // namespace
}  // namespace accel::cli
