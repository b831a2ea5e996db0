// `accel estimate-memory --params P [--num_processes N [--shard_group_size S]] [--dtype D] [--optimizer O]
// [--offload M] [--gradient_accumulation_steps K [--sync_each_batch] [--grad_accum_dtype D]] [--budget SIZE]
// [--cpu_budget SIZE]`: the model-state memory per rank of DDP and ZeRO-1/2/3 (ZeRO paper formulas, see
// cli/estimate_memory.h) and, with a budget, which fit and which to use. With a GPT shape instead of
// --params (--d_model --layers --heads --seq [--micro_batch] [--vocab] [--attention eager|sdpa]), the
// whole per-rank peak of a step, activations included, with and without checkpointing
// (cli/estimate_gpt.h). Single process, no torch: it runs anywhere, mpirun or not.
#include "cli/commands.h"
#include "cli/estimate_gpt.h"
#include "cli/estimate_memory.h"
#include "zero/spec.h"

#include <fmt/core.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace accel::cli {
namespace {

struct EstimateArgs {
  std::string params, num_processes = "1", shard_group_size, dtype = "bf16", optimizer = "adamw", offload = "none";
  std::string budget, cpu_budget;
  bool has_budget = false, has_cpu_budget = false;  // given at all (an empty value is an error, not "none")
  bool has_shard_group_size = false;
  GptShape shape;
  bool has_shape = false, has_shape_part = false;  // any of the GPT flags given; all of the required ones
  std::string overhead;
  bool has_overhead = false;
  std::string attention = "eager";
  int accumulation_steps = 1;
  bool sync_each_batch = false;
  std::string grad_accum_dtype;  // empty: not given (fp32)
};

int run_estimate(const EstimateArgs& a) {
  try {
    EstimateRequest r;
    if (a.has_shape_part && !a.params.empty())
      throw EstimateError("give either --params or a GPT shape (--d_model --layers --heads --seq), not both");
    if (a.has_shape_part && !a.has_shape)
      throw EstimateError(
          "a GPT shape needs --d_model, --layers, --heads and --seq (--micro_batch and --vocab are optional)");
    if (!a.has_shape_part && a.params.empty())
      throw EstimateError("give --params or a GPT shape (--d_model --layers --heads --seq)");
    if (a.has_overhead && !a.has_shape)
      throw EstimateError(
          "--overhead goes with a GPT shape (--d_model --layers --heads --seq), whose estimate is a whole peak; "
          "the --params estimate counts model states alone");
    if (!a.has_shape) r.params = parse_param_count(a.params);
    r.num_processes = parse_num_processes(a.num_processes);
    if (a.has_shard_group_size) r.shard_group_size = parse_num_processes(a.shard_group_size, "--shard_group_size");
    r.dtype = parse_dtype(a.dtype);
    r.optimizer = parse_optimizer(a.optimizer);
    r.offload = parse_offload(a.offload);
    r.accumulation.steps = a.accumulation_steps;
    r.accumulation.sync_each_batch = a.sync_each_batch;
    if (!a.grad_accum_dtype.empty()) r.accumulation.dtype = parse_dtype(a.grad_accum_dtype, "--grad_accum_dtype");
    if (a.has_budget) r.device_budget = parse_byte_size(a.budget, "--budget");
    if (a.has_cpu_budget) r.cpu_budget = parse_byte_size(a.cpu_budget, "--cpu_budget");
    if (a.attention != "eager" && a.attention != "sdpa")
      throw EstimateError("--attention: eager or sdpa, got '" + a.attention + "'");
    if (a.has_shape) {
      GptShape shape = a.shape;
      shape.sdpa = a.attention == "sdpa";
      GptRuntime rt;
      if (a.has_overhead) rt.overhead = parse_byte_size(a.overhead, "--overhead", /*allow_zero=*/true);
      fmt::print("{}", format_gpt_estimate(estimate_gpt(shape, r, rt)));
      std::fflush(stdout);
      return 0;
    }
    fmt::print("{}", format_estimate(estimate_memory(r)));
    std::fflush(stdout);
    return 0;
  } catch (const EstimateError& e) {
    std::fprintf(stderr, "accel estimate-memory: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace

void add_estimate_memory_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<EstimateArgs>();
  auto* cmd = app.add_subcommand(
      "estimate-memory",
      fmt::format("Model-state memory per rank of {}, {}, {} and {} (ZeRO paper formulas), or for a GPT shape the "
                  "whole peak with activations, and with --budget which strategies fit and which to use",
                  zero::info(zero::Strategy::NoShard).short_label, zero::info(zero::Strategy::Zero1).short_label,
                  zero::info(zero::Strategy::Zero2).short_label, zero::info(zero::Strategy::Zero3).short_label));
  cmd->add_option("--params", args->params, "Number of parameters: 7.5e9, 7.5B, 350M, 1.3b, 125k");
  std::vector<CLI::Option*> shape_opts = {
      cmd->add_option("--d_model", args->shape.d_model, "GPT width (a GPT shape instead of --params)"),
      cmd->add_option("--layers", args->shape.layers, "GPT blocks"),
      cmd->add_option("--heads", args->shape.heads, "GPT attention heads"),
      cmd->add_option("--seq", args->shape.seq, "GPT sequence length")};
  std::vector<CLI::Option*> shape_extra = {
      cmd->add_option("--micro_batch", args->shape.micro_batch, "sequences per rank per step (default 1)"),
      cmd->add_option("--vocab", args->shape.vocab, "vocabulary (default 4096, step_bench's)"),
      cmd->add_option("--attention", args->attention,
                      "eager (scores written out; the default, as the examples on the CPU) or sdpa (fused, as on "
                      "CUDA)")};
  auto* overhead = cmd->add_option("--overhead", args->overhead,
                                   "with a GPT shape: per-rank memory the allocator does not count (runtime; default "
                                   "0.55GB; 0 for a device capped through its allocator)");
  cmd->add_option("--num_processes", args->num_processes, "Ranks of the job (default 1)");
  auto* shard_group_size = cmd->add_option(
      "--shard_group_size", args->shard_group_size,
      "Ranks a state is sharded over, when fewer than the job's: the rest hold copies (Accelerate's "
      "parallelism_config dp_shard_size, DeepSpeed's mics_shard_size, HYBRID_SHARD's ranks per machine; "
      "default: every rank)");
  cmd->add_option("--dtype,--mixed_precision", args->dtype,
                  "bf16 | fp16 (2-byte params and grads, fp32 master) | fp32 (no) | fp8 (default bf16)");
  cmd->add_option("--optimizer", args->optimizer, "adamw | adam (8 bytes of state) | sgd with momentum (4)");
  cmd->add_option(
      "--offload", args->offload,
      fmt::format("none | optimizer (ZeRO-Offload) | optimizer+params (also {}'s parameters) (default none)",
                  zero::info(zero::Strategy::Zero3).short_label));
  cmd->add_option(
      "--gradient_accumulation_steps", args->accumulation_steps,
      fmt::format("micro-steps a step (default 1): without --sync_each_batch, {} and {} hold the whole "
                  "gradient between them",
                  zero::info(zero::Strategy::Zero2).short_label, zero::info(zero::Strategy::Zero3).short_label));
  cmd->add_flag("--sync_each_batch", args->sync_each_batch,
                "each micro-step reduces its gradients (DeepSpeed's ZeRO-2/3, Accelerate's sync_each_batch)");
  cmd->add_option("--grad_accum_dtype", args->grad_accum_dtype,
                  "what the micro-steps' gradients add up in (DeepSpeed's data_types.grad_accum_dtype): fp32 (the "
                  "default), or bf16/fp16 as the gradients themselves, which holds less");
  auto* budget = cmd->add_option("--budget,--device_memory", args->budget,
                                 "Memory of one device: 24GB, 80GiB, 40 (= GB); GB = 1e9 bytes, GiB = 2^30");
  auto* cpu_budget =
      cmd->add_option("--cpu_budget,--cpu_memory", args->cpu_budget, "CPU memory available per rank, for offload");
  cmd->callback([args, budget, cpu_budget, shard_group_size, overhead, shape_opts, shape_extra, &exit_code] {
    args->has_budget = budget->count() > 0;
    args->has_shard_group_size = shard_group_size->count() > 0;
    args->has_cpu_budget = cpu_budget->count() > 0;
    args->has_overhead = overhead->count() > 0;
    args->has_shape = true;
    for (auto* o : shape_opts) {
      args->has_shape = args->has_shape && o->count() > 0;
      args->has_shape_part = args->has_shape_part || o->count() > 0;
    }
    for (auto* o : shape_extra) args->has_shape_part = args->has_shape_part || o->count() > 0;
    exit_code = run_estimate(*args);
  });
}

}  // namespace accel::cli
