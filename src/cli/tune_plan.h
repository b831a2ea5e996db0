// What `accel tune` tries and what it writes. Pure: no processes, no torch, no files, so every rule is
// unit-tested (tests/cli/test_tune_plan.cpp).
//
// The grid: strategy (DDP, ZeRO-1, ZeRO-2 = SHARD_GRAD_OP, ZeRO-3 = FULL_SHARD, and HYBRID_SHARD where
// the job spans several machines) x micro batch per rank (the global batch kept: accumulation = global
// / (micro batch x ranks)) x reduce bucket size x activation checkpointing x offload (from a device:
// none, the optimizer, the optimizer and the parameters under ZeRO-3). Before anything runs a
// candidate is pruned when:
//   - its micro batch x ranks does not divide the global batch;
//   - it offloads on a CPU run (the state is in host memory already: nothing would change), or
//     offloads parameters without ZeRO-3, or is HYBRID_SHARD on one machine;
//   - with a budget, its model states per rank (`accel estimate-memory`'s, cli/estimate_memory.h, for
//     the precision and AdamW) are over the budget: exactly the rows estimate-memory marks as not
//     fitting.
//
// The search (TuneSearch) measures the rest in stages, each informed by the last, so a bounded run
// finds what an exhaustive one would (DeepSpeed's autotuner searches stage and micro batch alike):
//   1. every strategy at its largest micro batch (fewest accumulation steps), the default bucket, no
//      checkpointing, no offload where one without fits;
//   2. the two fastest strategies' micro batch, climbed: the micro batches next to each one's best,
//      then next to a faster neighbour, until both neighbours are slower or do not fit;
//   3. the two fastest strategies' best with each other bucket size; the fastest so far with
//      checkpointing toggled, and with the other offloads, where those are in the grid;
// then (confirm_candidates) the fastest few, those within 10% of the best, are measured again and the
// winner is the fastest by the mean of its runs.
// A candidate that ran out of memory or over the budget counts as "does not fit": larger micro batches
// of that strategy (at the same checkpointing and offload) are not tried after it.
//
// Configs: every candidate is a DeepSpeed JSON (stage 0-3: batch triad, bucket, offload, activation
// checkpointing, precision), HYBRID_SHARD an Accelerate YAML. The winner is written as an Accelerate
// YAML (keys inline where the YAML can say them, else the YAML names a DeepSpeed JSON written beside
// it) or, with --dialect deepspeed, as the JSON; both open with a comment block (the YAML) or a
// "_comment" key (the JSON) saying how it was chosen.
#pragma once

#include "base/error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace accel::cli {

class TuneError : public accel::InvalidArgumentError {
 public:
  using accel::InvalidArgumentError::InvalidArgumentError;
};

struct TuneRequest {
  int num_processes = 1, num_machines = 1;
  bool device_cuda = false;
  std::string precision = "no";         // no (fp32), fp16, bf16
  std::int64_t global_batch = 0;        // samples per optimizer step, all ranks
  double params = 0;                    // from the probe run
  std::vector<std::string> strategies;  // normalized (DDP, ZERO_1, ZERO_2, ZERO_3, HYBRID_SHARD); empty: all
  std::vector<int> micro_batches;       // per rank
  std::vector<double> bucket_mib;       // reduce bucket sizes in MiB of fp32 (25 is DeepSpeed's default)
  std::vector<bool> checkpointing;      // {false} or {false, true}
  std::vector<std::string> offloads;    // none, optimizer, optimizer+params
  std::optional<double> budget_bytes;   // per rank (the device's; the host's on a CPU run)
  double gradient_clipping = 0;         // kept from the base config
};

struct TuneCandidate {
  std::string strategy;  // DDP, ZERO_1, ZERO_2, ZERO_3, HYBRID_SHARD
  int micro_batch = 1;
  std::int64_t accumulation = 1;
  double bucket_mib = 25;
  bool checkpointing = false;
  std::string offload = "none";
  std::string label() const;  // "ZERO_3 mb 4 x acc 2, bucket 25 MiB, ckpt"
  bool operator==(const TuneCandidate& o) const;
};

struct PrunedCandidate {
  TuneCandidate candidate;
  std::string why;
};

struct TuneGrid {
  std::vector<TuneCandidate> runnable;  // in grid order
  std::vector<PrunedCandidate> pruned;
  std::vector<double> model_state_bytes;  // per runnable candidate: estimate-memory's per rank
};

// Fills in the defaults (every strategy the job can run; micro batches 1, 2, 4, ... up to the global
// batch / ranks; bucket 25 MiB; checkpointing off and on; offloads as the device allows), checks the
// request (throws TuneError naming the flag) and prunes.
TuneRequest with_defaults(TuneRequest r);
TuneGrid plan_tune(const TuneRequest& request);
// estimate-memory's model states per rank for a candidate (bytes), its accumulation held as the
// candidate's config runs it (candidate_syncs_each_batch).
double model_state_bytes(const TuneRequest& r, const TuneCandidate& c);

// The outcome of one measured run.
struct TuneResult {
  TuneCandidate candidate;
  enum class Status { Ok, OutOfMemory, OverBudget, Failed } status = Status::Failed;
  double step_ms = 0, samples_per_s = 0, peak_bytes = 0;  // peak: the device's (CUDA) or the resident set's
  double wall_s = 0;                                      // the whole run, start-up included
  std::string detail;                                     // why it failed
  int runs = 1;                                           // > 1: merged() of a re-measured candidate
};
const char* to_string(TuneResult::Status s);
// Samples per second with three or four significant digits (1.456, 35.12, 1289.2): a 0.5B model's
// candidates differ in the second decimal.
std::string samples_text(double samples_per_s);

class TuneSearch {
 public:
  explicit TuneSearch(TuneGrid grid) : grid_(std::move(grid)) {}
  // The next candidate to run given what ran so far (in order), or nullopt when the search is done.
  std::optional<TuneCandidate> next(const std::vector<TuneResult>& done) const;
  const TuneGrid& grid() const { return grid_; }
  // A run of the same kind (strategy, checkpointing, offload, bucket) at this micro batch or a smaller
  // one did not fit: this one would not either.
  bool blocked(const TuneCandidate& c, const std::vector<TuneResult>& done) const;

 private:
  bool tried(const TuneCandidate& c, const std::vector<TuneResult>& done) const;
  TuneGrid grid_;
};

// Results, fastest first (those that did not run to the end last, in the order they ran).
std::vector<TuneResult> ranked(std::vector<TuneResult> results);

// One entry per candidate, in the order each first ran: a candidate measured more than once has the
// mean of its runs' throughput and step time, the largest peak, the summed wall time and `runs`; if one
// of its runs did not end ok, the entry is that run's (a candidate that fits only sometimes does not fit).
std::vector<TuneResult> merged(const std::vector<TuneResult>& runs);

// Before choosing, the fastest candidates are measured once more and ranked by their mean, because
// candidates a few percent apart are within one run's noise of each other (and the fastest of many noisy
// figures is biased upwards): up to k of the merged results' fastest, those within kConfirmWithin of the
// best's throughput, fastest first; none when fewer than two are that close (nothing to decide).
inline constexpr double kConfirmWithin = 0.10;
std::vector<TuneCandidate> confirm_candidates(const std::vector<TuneResult>& runs, int k);

// A candidate's config: DeepSpeed JSON for stages 0-3, Accelerate YAML for HYBRID_SHARD.
bool candidate_is_json(const TuneCandidate& c);
// Whether the candidate's micro-steps reduce each time (accelerator/config.h's default_sync_each_batch
// of its config: ZeRO-2/3 under DeepSpeed's JSON). The winner's files keep it: a ZeRO-2/3 winner with
// accumulation is not written under FSDP's names, which would run its micro-steps NoSync.
bool candidate_syncs_each_batch(const TuneCandidate& c);
std::string candidate_config(const TuneCandidate& c, const TuneRequest& r);
// The winner for the user: an Accelerate YAML (json_path: where the companion JSON goes when the YAML
// cannot say everything; the returned pair is (yaml, json or "")) or the DeepSpeed JSON.
struct WinnerFiles {
  std::string yaml, json;
};
WinnerFiles winner_accelerate(const TuneCandidate& c, const TuneRequest& r, const std::string& json_path,
                              const std::vector<std::string>& how_chosen);
std::string winner_deepspeed(const TuneCandidate& c, const TuneRequest& r, const std::vector<std::string>& how_chosen);

// The ranked table (Markdown) of merged results: rank, candidate, samples/s, step ms, runs, peak, estimate,
// status; then the pruned candidates with why.
std::string tune_table(const std::vector<TuneResult>& ranked_results, const TuneGrid& grid, const TuneRequest& r);

}  // namespace accel::cli
