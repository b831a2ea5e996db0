// What `accel bench` runs and what it writes: the list of step_bench runs (strategies x precisions x
// world sizes), the `accel launch` command line of each, and the record of each run (one JSON line)
// with its formulas and scaling efficiency. Pure: no processes, no torch, no files, so every rule is
// unit-tested.
//
// Runs go in order of world size, then strategy, then precision, so the 1-rank runs that the
// efficiencies are measured against come first and a sweep cut short still has its baselines.
//
// Machines: with --ranks_per_machine K, or a hostfile (K = its first host's slots), and no
// --num_machines, each run fills machines in order, K ranks on each: ceil(ranks / K) machines, which
// must divide the ranks evenly as `accel launch` requires (e.g. 2 hosts of 2 slots: 1 and 2 ranks on
// one machine, 4 ranks on two). In a Slurm allocation (no hostfile) --ranks_per_machine does the same
// over the allocation's nodes. With --num_machines M every run uses M machines. Otherwise `accel
// launch` decides (one machine, or the config's count).
//
// Formulas (the ones the engine's own tests hold the engine to; per rank, per optimizer step):
// - bytes moved (tests/zero/test_engine.cpp, TrafficMatchesZeroFormulas; nccl-tests' bus bytes):
//     (shards parameters ? 3 : 2) * Psi * (N-1)/N * 4 B          fp32
//   i.e. DDP's all-reduce counts 2 Psi, ZeRO-1/2's reduce-scatter + all-gather 2 Psi, ZeRO-3's
//   reduce-scatter + two all-gathers (forward, backward) 3 Psi. Under bf16/fp16/fp8 step_bench reduces
//   in fp32 and gathers parameters in the compute dtype, so the same terms are weighted by those sizes
//   (reductions 4 B, gathers 2 B, fp8 gathers 1 B where sharded). The test asserts the fp32 figure within
//   1% for models whose parameters all sit in units; a GPT keeps its embeddings and head in the root
//   unit, which ZeRO-3 gathers once per step, not twice, so ZeRO-3 measures below 3 Psi by that share.
//   HYBRID_SHARD has no single figure here (its replicate group adds a cross-node all-reduce): null.
// - model-state bytes per rank: `accel estimate-memory`'s (the ZeRO paper's, cli/estimate_memory.h)
//   for the precision and AdamW; HYBRID_SHARD is ZeRO-3 over the ranks of one machine.
#pragma once

#include "base/error.h"

#include "cli/hostfile.h"

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::cli {

// Every bad input: the message names the flag, the value, and what would be accepted.
class BenchError : public accel::InvalidArgumentError {
 public:
  using accel::InvalidArgumentError::InvalidArgumentError;
};

// "1,2,4" -> {1, 2, 4}: whole numbers >= 1, no repeats, in any order (sorted on return).
std::vector<int> parse_rank_list(const std::string& text);
// step_bench's strategy names, case-insensitive, with the short spellings ddp, zero1..zero3,
// zero-1..: "zero2" -> "ZERO_2", "full_shard" -> "FULL_SHARD". `plain` is not a strategy to scale.
std::string normalize_strategy(const std::string& name);
std::vector<std::string> parse_strategy_list(const std::string& text);
// fp32 (also "no"), bf16, fp16, fp8; case-insensitive.
std::vector<std::string> parse_precision_list(const std::string& text);

struct BenchRequest {
  std::vector<int> ranks;                // --num_processes
  std::vector<std::string> strategies;   // normalized
  std::vector<std::string> precisions;   // normalized
  std::vector<HostSlots> hosts;          // the hostfile's; empty: none
  std::string hostfile;                  // its path
  std::optional<int> num_machines;       // --num_machines
  std::optional<int> ranks_per_machine;  // --ranks_per_machine
  std::vector<std::string> launch_args;  // further `accel launch` flags (--launcher srun, ...), as they are
  std::string step_bench;                // the step_bench binary
  std::vector<std::string> step_args;    // step_bench's model flags and --steps, passed as they are
};

struct BenchRun {
  std::string strategy, precision;
  int ranks = 1;
  std::optional<int> machines;  // passed as --num_machines; nullopt: accel launch decides
  std::string label() const;    // "ZERO_3 fp32, 4 ranks on 2 machines"
  std::string slug() const;     // "ZERO_3_fp32_n4": file names of its log
};

// The runs in order; throws BenchError where a world size cannot be placed on the hostfile.
std::vector<BenchRun> plan_bench(const BenchRequest& request);
// `accel launch ... STEP_BENCH --strategy S --precision P --json ARGS...` without argv[0] (the accel
// binary).
std::vector<std::string> launch_argv(const BenchRequest& request, const BenchRun& run);

// step_bench's --json line, flattened: numbers (and true/false as 1/0) by key, strings by key.
struct StepResult {
  std::map<std::string, double> num;
  std::map<std::string, std::string> str;
  double get(const std::string& key) const;  // throws BenchError naming the key when absent
};
// The last line of `out` that is a JSON object from step_bench; throws BenchError when there is none.
StepResult parse_step_output(const std::string& out);

// node_shared_params: the run kept its sharded parameters in node-shared memory (step_bench's
// "node_shared_bytes" > 0), so it gathers nothing: ZeRO-3 / FULL_SHARD move the reduce-scatter alone.
double traffic_formula_bytes(const std::string& strategy, const std::string& precision, double params, int ranks,
                             bool node_shared_params = false);
// nullopt for HYBRID_SHARD (see above).
std::optional<double> traffic_formula(const std::string& strategy, const std::string& precision, double params,
                                      int ranks, bool node_shared_params = false);
// Model states (parameters + gradients + optimizer state) per rank, AdamW. `ranks_per_machine`
// matters only for HYBRID_SHARD.
double memory_formula_bytes(const std::string& strategy, const std::string& precision, double params, int ranks,
                            int ranks_per_machine);

// The JSON line of one finished run. `baseline`: the run of the same strategy and precision at the
// fewest ranks (itself for the first), against which efficiency is measured:
//   efficiency = (samples/s / ranks) / (baseline samples/s / baseline ranks)
// (1.0 = perfect weak scaling; each rank trains its own micro-batch of `batch` sequences).
std::string bench_record(const BenchRun& run, const StepResult& r, const StepResult& baseline);

// The records as a Markdown table (what `accel bench` prints at the end): strategy, precision, ranks,
// nodes, step ms, samples/s, efficiency, model states MiB (formula), moved MiB (x formula).
std::string summary_table(const std::vector<std::string>& records);

}  // namespace accel::cli
