// The DeepSpeed JSON dialect (accelerator/config_deepspeed.cpp), read as DeepSpeed reads it.
// Rank-independent: every rank runs the same checks on its own.
#include "accelerator/config.h"

#include "config_test_support.h"
#include "optim/from_config.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/sgd.h>

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
// DeepSpeed JSON on its own

TEST(ConfigJson, Stage) {
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 0}})").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 1}})").spec.strategy, Strategy::Zero1);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2}})").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 3.0}})").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": "auto"}})").spec.strategy, Strategy::NoShard);  // DeepSpeed's default
  EXPECT_EQ(ds(R"({"train_batch_size": 8})").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(ds(R"({"zero_optimization": true})").spec.strategy, Strategy::Zero1);  // legacy bool form
  const auto c = ds("{}");
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.source, "ds.json");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 4}})"),
             "ds.json: zero_optimization.stage is '4', expected 0, 1, 2 or 3");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 1.5}})"),
             "zero_optimization.stage is '1.5', expected an integer");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": "two"}})"),
             "zero_optimization.stage is 'two', expected an integer");
  EXPECT_HAS(ds_error(R"({"zero_optimization": 3})"), "ds.json: zero_optimization is '3', expected an object");
}

TEST(ConfigJson, AliasesAutoAndFloats) {
  auto c = ds(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e8, "max_live_parameters": 1e9}})");
  EXPECT_TRUE(ignored(c, "zero_optimization.stage3_prefetch_bucket_size"));
  EXPECT_TRUE(ignored(c, "zero_optimization.max_live_parameters"));
  c = ds(R"({"zero_optimization": {"stage": 2, "prefetch_bucket_size": 100}})");
  EXPECT_TRUE(ignored(c, "zero_optimization.prefetch_bucket_size"));
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})"),
             "ds.json: both 'zero_optimization.prefetch_bucket_size' and its alias "
             "'zero_optimization.stage3_prefetch_bucket_size' are given");
  // 5e8 elements -> bytes; "auto" keeps accel's default bucket.
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}})").spec.bucket_bytes, 2000000000);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})").spec.bucket_bytes,
            zero::ShardingSpec().bucket_bytes);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": "auto"}})").ignored.size(),
            0u);
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"reduce_bucket_size": 1.5}})"),
             "ds.json: zero_optimization.reduce_bucket_size is '1.5', expected an integer");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"overlap_comm": "yes"}})"),
             "zero_optimization.overlap_comm is 'yes', expected a boolean");
}

TEST(ConfigJson, UnknownKeys) {
  auto m = ds_error(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sise": 5e8}})");
  EXPECT_HAS(m,
             "ds.json: unknown key 'zero_optimization.stage3_prefetch_bucket_sise'; did you mean "
             "'stage3_prefetch_bucket_size'?");
  m = ds_error(R"({"train_micro_batch_size_per_gpus": 4})");
  EXPECT_HAS(m,
             "ds.json: unknown key 'train_micro_batch_size_per_gpus'; did you mean 'train_micro_batch_size_per_gpu'?");
  EXPECT_HAS(ds_error(R"({"fp16": {"enabled": true, "initial_scale_pow": 8}})"),
             "unknown key 'fp16.initial_scale_pow'; did you mean 'initial_scale_power'?");
  EXPECT_HAS(ds_error(R"({"bf16": {"enable": true}})"), "unknown key 'bf16.enable'; did you mean 'enabled'?");
}

TEST(ConfigJson, PythonOnlyTopLevelKeysAreIgnored) {
  const auto c = ds(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    "scheduler": {"type": "WarmupLR"}, "steps_per_print": 10, "wall_clock_breakdown": false,
    "zero_allow_untested_optimizer": true, "tensorboard": {"enabled": false},
    "prescale_gradients": false, "checkpoint": {}})");
  EXPECT_FALSE(ignored(c, "optimizer"));  // (create_optimizer / create_scheduler build them)
  EXPECT_FALSE(ignored(c, "scheduler"));
  for (const char* k : {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "tensorboard",
                        "prescale_gradients", "checkpoint"})
    EXPECT_TRUE(ignored(c, k)) << k;
}

// The block switches checkpointing on for every unit; its keys tune model-parallel partitioning,
// which accel does not have: accepted, listed as ignored with why, their values still checked.
TEST(ConfigJson, ActivationCheckpointingBlockSwitchesItOn) {
  EXPECT_FALSE(ds(R"({"zero_optimization": {"stage": 3}})").spec.activation_checkpointing);
  EXPECT_TRUE(ds(R"({"activation_checkpointing": {}})").spec.activation_checkpointing);
  const auto c = ds(R"({"zero_optimization": {"stage": 3}, "activation_checkpointing": {
    "partition_activations": false, "cpu_checkpointing": false, "contiguous_memory_optimization": false,
    "number_checkpoints": null, "synchronize_checkpoint_boundary": false, "profile": false}})");
  EXPECT_TRUE(c.spec.activation_checkpointing);
  EXPECT_EQ(c.spec.strategy, zero::Strategy::Zero3);
  EXPECT_HAS(ignored_entry(c, "activation_checkpointing.partition_activations"), "accel has no model parallelism");
  EXPECT_HAS(ignored_entry(c, "activation_checkpointing.profile"), "timers");
  EXPECT_FALSE(ds(R"({"activation_checkpointing": null})").spec.activation_checkpointing);
  EXPECT_HAS(ds_error(R"({"activation_checkpointing": true})"),
             "activation_checkpointing is 'true', expected an object");
  EXPECT_HAS(ds_error(R"({"activation_checkpointing": {"partition_activations": 1}})"),
             "activation_checkpointing.partition_activations is '1', expected a boolean");
  EXPECT_HAS(ds_error(R"({"activation_checkpointing": {"number_checkpoints": "four"}})"),
             "activation_checkpointing.number_checkpoints is 'four', expected an integer");
  EXPECT_HAS(ds_error(R"({"activation_checkpointing": {"partition_activation": true}})"),
             "unknown key 'activation_checkpointing.partition_activation'; did you mean 'partition_activations'?");
}

TEST(ConfigJson, TransformersZero3Example) {
  // The shape of the ZeRO-3 config in Transformers' DeepSpeed guide.
  const auto c = ds(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "cpu", "pin_memory": true},
      "overlap_comm": true,
      "contiguous_gradients": true,
      "sub_group_size": 1e9,
      "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto",
      "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9,
      "stage3_gather_16bit_weights_on_model_save": true
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
  })");
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(c.offload_param_device, "cpu");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_TRUE(c.zero3_save_16bit_model);
  EXPECT_TRUE(ignored(c, "zero_optimization.stage3_max_live_parameters"));
}

// The optimizer and scheduler blocks, as written, checked when the file is read
// (tests/optim/test_from_config.cpp builds them).
TEST(ConfigJson, OptimizerAndSchedulerBlocksAreKeptAndChecked) {
  const auto c = ds(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": [0.9, 0.95],
                                       "weight_decay": 0.1, "torch_adam": true, "eps": null}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 100}}})");
  ASSERT_TRUE(c.optimizer && c.scheduler);
  EXPECT_EQ(c.optimizer->name, "optimizer");
  EXPECT_EQ(c.optimizer->type, "AdamW");
  ASSERT_EQ(c.optimizer->params.size(), 4u);  // (null: DeepSpeed's default, dropped)
  EXPECT_EQ(c.optimizer->params[0].first, "lr");
  EXPECT_EQ(c.optimizer->params[0].second.kind, optim::ConfigValue::Kind::Auto);
  EXPECT_EQ(c.optimizer->params[1].second.numbers, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(c.optimizer->params[2].second.number, 0.1);
  EXPECT_TRUE(c.optimizer->params[3].second.flag);
  EXPECT_EQ(c.scheduler->type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler->params[1].second.number, 100);
  EXPECT_FALSE(ds(R"({"zero_optimization": {"stage": 2}})").optimizer);

  EXPECT_HAS(ds_error(R"({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}})"),
             "ds.json: optimizer.type: optimizer type 'Lamb' is not one accel builds");
  EXPECT_HAS(ds_error(R"({"optimizer": {"params": {"lr": 1e-3}}})"), "ds.json: optimizer.type is missing");
  EXPECT_HAS(ds_error(R"({"optimizer": {"type": "AdamW", "param": {}}})"),
             "ds.json: unknown key 'optimizer.param'; did you mean 'params'?");
  EXPECT_HAS(ds_error(R"({"optimizer": {"type": "AdamW", "params": {"betas": "0.9,0.99"}}})"),
             "ds.json: optimizer.params.betas is '0.9,0.99', expected two numbers");
  EXPECT_HAS(ds_error(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10}}})"),
             "ds.json: scheduler: WarmupCosineLR needs total_num_steps");
  EXPECT_HAS(ds_error(R"({"scheduler": "WarmupLR"})"), "ds.json: scheduler is 'WarmupLR', expected an object");
}

// A null is DeepSpeed's None, which is the constructor's default, except for warmup_max_lr: WarmupLR takes
// None as the first group's rate, also under WarmupDecayLR, whose own default (the key absent) is 0.001.
// WarmupDecayLR over 10 steps with a linear warmup of 2 is at its maximum after three steps.
TEST(ConfigJson, NullWarmupMaxLrIsTheOptimizersRate) {
  auto lr_after_warmup = [](const std::string& max_lr) {
    const auto c = ds(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10,
        "warmup_num_steps": 2, "warmup_type": "linear")" +
                      max_lr + "}}}");
    torch::optim::SGD sgd(std::vector<at::Tensor>{at::zeros({1})}, torch::optim::SGDOptions(0.05));
    auto sched = optim::make_scheduler(&*c.scheduler, sgd, {}, /*warn=*/false);
    for (int i = 0; i < 3; ++i) sched->step();
    return sgd.param_groups()[0].options().get_lr();
  };
  EXPECT_DOUBLE_EQ(lr_after_warmup(R"(, "warmup_max_lr": null)"), 0.05);
  EXPECT_DOUBLE_EQ(lr_after_warmup(""), 0.001);
  EXPECT_DOUBLE_EQ(lr_after_warmup(R"(, "warmup_max_lr": 0.2)"), 0.2);
}

TEST(ConfigJson, SyntaxDuplicatesAndShape) {
  EXPECT_HAS(ds_error(R"({"train_batch_size": 8,})"), "ds.json: not valid JSON");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 1, "stage": 2}})"),
             "ds.json: duplicate key 'zero_optimization.stage'");
  EXPECT_HAS(ds_error("[1, 2]"), "ds.json: a DeepSpeed config is a JSON object");
}

TEST(ConfigJson, Offload) {
  auto c = ds(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                                      "offload_param": {"device": "nvme", "nvme_path": "/local"}}})");
  EXPECT_EQ(c.offload_optimizer_device, "cpu");
  EXPECT_EQ(c.offload_param_device, "nvme");
  // (accel pins what it offloads from a GPU anyway: the key is listed as ignored, with that reason)
  EXPECT_TRUE(ignored(c, "zero_optimization.offload_optimizer.pin_memory"));
  EXPECT_EQ(c.spec.offload.param_nvme_path, "/local");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
             "zero_optimization.offload_param.device is \"nvme\" but zero_optimization.offload_param.nvme_path is not "
             "set");
  c = ds(R"({"zero_optimization": {"stage": 3, "sub_group_size": 1000, "offload_optimizer": {"device": "nvme",
            "nvme_path": "/o", "buffer_count": 6}}, "aio": {"block_size": 65536, "queue_depth": 16}})");
  EXPECT_EQ(c.spec.offload.optimizer_nvme_path, "/o");
  EXPECT_EQ(c.spec.offload.optimizer_buffer_count, 6);
  EXPECT_EQ(c.spec.offload.sub_group_size, 1000);
  EXPECT_EQ(c.spec.offload.aio.block_size, 65536u);
  EXPECT_EQ(c.spec.offload.aio.queue_depth, 16);
  EXPECT_TRUE(ignored(c, "zero_optimization.offload_optimizer.nvme_path") == false);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "offload_optimizer": null}})").offload_optimizer_device, "none");
  EXPECT_EQ(
      ds(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}})").offload_optimizer_device,
      "none");
  // Deprecated aliases.
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})").offload_optimizer_device, "cpu");
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})").offload_optimizer_device, "none");
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true}})").offload_param_device, "cpu");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})"),
             "ds.json: both the deprecated 'zero_optimization.cpu_offload' and its replacement "
             "'zero_optimization.offload_optimizer' are given");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}})"),
             "ds.json: zero_optimization.offload_optimizer.device is 'disk'; allowed values: none, cpu, nvme");
  EXPECT_HAS(
      ds_error(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memroy": true}}})"),
      "unknown key 'zero_optimization.offload_optimizer.pin_memroy'; did you mean 'pin_memory'?");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"),
             "zero_optimization.offload_param offloads parameters to 'cpu', which needs stage 3");
}

TEST(ConfigJson, Gather16BitWeights) {
  EXPECT_TRUE(ds(R"({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}})")
                  .zero3_save_16bit_model);
  EXPECT_TRUE(
      ds(R"({"zero_optimization": {"stage": 3, "gather_16bit_weights_on_model_save": true}})").zero3_save_16bit_model);
  EXPECT_TRUE(ds(R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})")
                  .zero3_save_16bit_model);
  // save_model acts on it (compute-dtype weights): not in the ignored list.
  EXPECT_EQ(
      ignored_entry(ds(R"({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}})"),
                    "zero_optimization.stage3_gather_16bit_weights_on_model_save"),
      "");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage3_gather_fp16_weights_on_model_save": true,
                                                "stage3_gather_16bit_weights_on_model_save": true}})"),
             "both the deprecated 'zero_optimization.stage3_gather_fp16_weights_on_model_save'");
}

TEST(ConfigJson, Fp16LossScaler) {
  const auto c = ds(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                                "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.5}})");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::Fp16);
  EXPECT_EQ(c.loss_scaler.loss_scale, 0);
  EXPECT_EQ(c.loss_scaler.initial_scale_power, 12);
  EXPECT_EQ(c.loss_scaler.loss_scale_window, 500);
  EXPECT_EQ(c.loss_scaler.hysteresis, 3);
  EXPECT_TRUE(c.loss_scaler.consecutive_hysteresis);
  EXPECT_EQ(c.loss_scaler.min_loss_scale, 0.5);
  EXPECT_EQ(ds(R"({"fp16": {"enabled": true, "loss_scale": 128}})").loss_scaler.loss_scale, 128);
  const auto d = ds(R"({"fp16": {"enabled": true, "initial_scale_power": "auto"}})");
  EXPECT_EQ(d.loss_scaler.initial_scale_power, 16);  // "auto" -> DeepSpeed's default
  EXPECT_EQ(ds(R"({"fp16": {"enabled": false}})").mixed_precision, MixedPrecision::No);
  EXPECT_EQ(ds(R"({"fp16": {"enabled": "auto"}})").mixed_precision, MixedPrecision::No);
  EXPECT_HAS(ds_error(R"({"fp16": {"enabled": true, "loss_scale": -1}})"),
             "ds.json: fp16.loss_scale is '-1', expected a number >= 0");
  EXPECT_HAS(ds_error(R"({"fp16": {"loss_scale_window": 0}})"),
             "fp16.loss_scale_window is '0', expected an integer >= 1");
  EXPECT_HAS(ds_error(R"({"fp16": {"min_loss_scale": 0}})"), "fp16.min_loss_scale is '0', expected a number > 0");
  EXPECT_HAS(ds_error(R"({"fp16": {"hysteresis": 1.5}})"), "fp16.hysteresis is '1.5', expected an integer");
  EXPECT_HAS(ds_error(R"({"fp16": {"enabled": "yes"}})"), "fp16.enabled is 'yes', expected a boolean");
}

TEST(ConfigJson, Bf16AndBoth) {
  EXPECT_EQ(ds(R"({"bf16": {"enabled": true}})").mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(ds(R"({"bfloat16": {"enabled": true}})").mixed_precision, MixedPrecision::Bf16);
  // bf16 master weights are an option (read, not ignored); bf16_optimizer_states follows them.
  EXPECT_FALSE(
      ds(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": false}})").spec.master_dtype.has_value());
  EXPECT_EQ(ds(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})").spec.master_dtype,
            c10::ScalarType::BFloat16);
  EXPECT_FALSE(
      ds(R"({"bf16": {"enabled": false, "bf16_master_weights_and_grads": true}})").spec.master_dtype.has_value());
  EXPECT_TRUE(
      ignored(ds(R"({"bf16": {"enabled": true, "bf16_optimizer_states": true}})"), "bf16.bf16_optimizer_states"));
  auto m = ds_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_HAS(m, "ds.json: fp16.enabled and bf16.enabled are both true; enable at most one");
  EXPECT_HAS(ds_error(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})"), "its alias 'bfloat16'");
  EXPECT_HAS(ds_error(R"({"bf16": true})"), "ds.json: bf16 is 'true', expected an object");
}

TEST(ConfigJson, CommunicationDataTypeAndClipping) {
  EXPECT_EQ(ds(R"({"communication_data_type": "fp16"})").spec.reduce_dtype, c10::ScalarType::Half);
  EXPECT_EQ(ds(R"({"communication_data_type": "bf16"})").spec.reduce_dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(ds(R"({"communication_data_type": "fp32"})").spec.reduce_dtype, c10::ScalarType::Float);
  EXPECT_FALSE(ds("{}").spec.reduce_dtype.has_value());
  EXPECT_HAS(ds_error(R"({"communication_data_type": "int8"})"),
             "ds.json: communication_data_type is 'int8'; allowed values: fp32, fp16, bf16");
  // The accumulation dtype (data_types.grad_accum_dtype): unset, the reduction's.
  EXPECT_EQ(ds(R"({"data_types": {"grad_accum_dtype": "bf16"}})").spec.accumulate_dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(ds(R"({"data_types": {"grad_accum_dtype": "FP32"}})").spec.accumulate_dtype, c10::ScalarType::Float);
  // DeepSpeed's DtypeEnum names too (here, not for communication_data_type, as in DeepSpeed).
  EXPECT_EQ(ds(R"({"data_types": {"grad_accum_dtype": "half"}})").spec.accumulate_dtype, c10::ScalarType::Half);
  EXPECT_EQ(ds(R"({"data_types": {"grad_accum_dtype": "torch.bfloat16"}})").spec.accumulate_dtype,
            c10::ScalarType::BFloat16);
  EXPECT_EQ(ds(R"({"data_types": {"grad_accum_dtype": "float"}})").spec.accumulate_dtype, c10::ScalarType::Float);
  EXPECT_HAS(ds_error(R"({"communication_data_type": "half"})"), "communication_data_type is 'half'");
  EXPECT_FALSE(ds(R"({"data_types": {}})").spec.accumulate_dtype.has_value());
  EXPECT_FALSE(ds(R"({"data_types": {"grad_accum_dtype": null}})").spec.accumulate_dtype.has_value());
  EXPECT_FALSE(ignored(ds(R"({"data_types": {"grad_accum_dtype": "fp32"}})"), "data_types"));
  EXPECT_HAS(ds_error(R"({"data_types": {"grad_accum_dtype": "int8"}})"),
             "ds.json: data_types.grad_accum_dtype is 'int8'; allowed values: fp32, fp16, bf16");
  EXPECT_HAS(ds_error(R"({"data_types": {"grad_acum_dtype": "fp32"}})"),
             "unknown key 'data_types.grad_acum_dtype'; did you mean 'grad_accum_dtype'?");
  EXPECT_HAS(ds_error(R"({"data_types": "fp32"})"), "ds.json: data_types is 'fp32', expected an object");
  EXPECT_EQ(ds(R"({"gradient_clipping": 0.5})").gradient_clipping, std::optional<double>(0.5));
  EXPECT_FALSE(ds(R"({"gradient_clipping": "auto"})").gradient_clipping.has_value());
  EXPECT_HAS(ds_error(R"({"gradient_clipping": -1})"), "ds.json: gradient_clipping is '-1', expected a number >= 0");
  EXPECT_HAS(ds_error(R"({"gradient_clipping": "high"})"), "gradient_clipping is 'high'");
  EXPECT_HAS(ds_error(R"({"gradient_allreduce_op": "sum"})"), "gradient_allreduce_op is 'sum'");
  EXPECT_HAS(ds_error(R"({"amp": {"enabled": true}})"), "amp.enabled is true");
}

TEST(ConfigJson, BatchValues) {
  auto c = ds(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})");
  EXPECT_EQ(c.batch.train_batch_size, std::optional<std::int64_t>(32));
  EXPECT_EQ(c.batch.micro_batch_per_gpu, std::optional<std::int64_t>(4));
  EXPECT_EQ(c.batch.gradient_accumulation_steps, std::optional<std::int64_t>(2));
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  c = ds(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"})");
  EXPECT_FALSE(c.batch.train_batch_size || c.batch.micro_batch_per_gpu || c.batch.gradient_accumulation_steps);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(ds(R"({"train_batch_size": 1e3})").batch.train_batch_size, std::optional<std::int64_t>(1000));
  EXPECT_HAS(ds_error(R"({"train_batch_size": 0})"),
             "ds.json: train_batch_size is '0', expected a positive integer or \"auto\"");
  EXPECT_HAS(ds_error(R"({"train_micro_batch_size_per_gpu": 2.5})"), "train_micro_batch_size_per_gpu is '2.5'");
  EXPECT_HAS(ds_error(R"({"gradient_accumulation_steps": "four"})"), "gradient_accumulation_steps is 'four'");
  EXPECT_HAS(
      ds_error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})"),
      "ds.json: train_batch_size 30 must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * world "
      "size");
}

TEST(ConfigJson, LoadConfigFileTellsTheDialectApart) {
  const auto c = load_config_file(source_path("configs/deepspeed/zero2.json"));
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  TempDir dir;
  EXPECT_HAS(error_of([&] { load_config_file(dir.write("broken.json", "{\"zero_optimization\": {\"stage\": 2,}}")); }),
             "broken.json: not valid JSON");
}

}  // namespace
}  // namespace accel
