// `accel config`'s questionnaire and the Accelerate-style YAML it writes. The questions read answers
// line by line from any stream (a terminal, or a pipe in tests and scripts); an empty answer takes the
// default in brackets, a bad answer is explained and asked again, and end of input before the last
// question is an error. No torch here: the caller validates the YAML by parsing it back.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace accel::cli {

struct ConfigAnswers {
  int num_machines = 1;
  int num_processes = 1;  // total over all machines
  bool use_cpu = true;
  // ddp, zero1, zero2, zero3, full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2
  std::string strategy = "ddp";
  // full_shard, shard_grad_op: the ranks each shard group holds, the others copies of it (FSDP2's HSDP,
  // written as a parallelism_config); 0 or num_processes: one group of every rank.
  int shard_group_size = 0;
  std::string offload_optimizer = "none";  // DeepSpeed: none | cpu | nvme
  std::string offload_params = "none";  // DeepSpeed ZeRO-3; FSDP: "cpu" writes fsdp_offload_params (with the optimizer)
  std::string offload_optimizer_nvme_path, offload_param_nvme_path;
  double gradient_clipping = 0;                        // DeepSpeed; 0 = none
  std::string wrap_policy = "TRANSFORMER_BASED_WRAP";  // FSDP: TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP
  std::vector<std::string> layer_types;                // TRANSFORMER_BASED_WRAP; empty: the modules marked accel::unit
  std::int64_t min_num_params = 100000000;             // SIZE_BASED_WRAP
  bool activation_checkpointing = false;               // FSDP: fsdp_activation_checkpointing
  std::int64_t gradient_accumulation_steps = 1;
  std::string mixed_precision = "no";  // no, fp16, bf16, fp8
};

// The strategies the questionnaire offers, in order.
const std::vector<std::string>& strategy_names();

// Asks every question on `out`, reading answers from `in`. `cuda_devices` sets the defaults (CPU
// only without devices; one process per device otherwise). Throws std::runtime_error at end of input.
ConfigAnswers ask_config_questions(std::istream& in, std::ostream& out, int cuda_devices);

// The answers as an Accelerate config file (what `accelerate config` would write for them).
std::string config_yaml(const ConfigAnswers& a);

// What `accel config default` writes: one process per CUDA device (MULTI_GPU) when there are several,
// else one process (distributed_type NO; use_cpu without devices).
ConfigAnswers default_answers(int cuda_devices, const std::string& mixed_precision);

}  // namespace accel::cli
