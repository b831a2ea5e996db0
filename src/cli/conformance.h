// accel::cli::conformance — the checks `accel test` runs under a config, as `accelerate test` does:
// each one builds its own Accelerator from the same options, exercises one promise of the front-end
// against a closed form or a single-process reference, and returns one row for the table.
//
// Every function here is collective: all ranks call the same checks in the same order. A check's
// verdict is this rank's; run_all() agrees on the verdicts across ranks (a rank that saw a failure
// fails the row everywhere) and keeps the first failing rank's detail. run_all() catches exceptions
// per check (the row fails with the message) so one failing check never stops the others.
//
// inject_failure names a check that then corrupts the last rank's data on purpose (a sample id, a
// training target, a random draw, a reduced value, a trigger never set), so tests can see a real
// failure travel to the table and the exit code.
#pragma once

#include "accelerator/accelerator.h"

#include <string>
#include <vector>

namespace accel::cli::conformance {

struct Options {
  AcceleratorOptions accelerator;  // what every check's Accelerator is built from
  std::string inject_failure;      // a check name, or "" (see above)
};

// One row: this rank's verdict and a short detail (a measured difference, a count, an error).
struct CheckResult {
  std::string name;
  bool passed = false;
  std::string detail;
};

// 1. The sharded loader covers a dataset of 37 samples (batch 4 per process) exactly once:
//    gather_for_metrics sees every id once; gather (with the even_batches padding) is the epoch's
//    order wrapped around, k -> k % 37; even_batches=false and drop_last have exact counts too.
CheckResult check_loader_coverage(const Options& o);
// 2. Ranks that start from different RNG states agree after seeding from rank 0's seed: draws of the
//    default generator (and the device's) are bitwise equal across ranks; the shuffling loader uses
//    one permutation on every rank, and gather_for_metrics returns it in order.
CheckResult check_rng_sync(const Options& o);
// 3. A float64 MLP (two accel::unit blocks named BlockImpl, so wrap policies shard them) trained with
//    AdamW through prepare/accumulate/backward/clip_grad_norm_/step matches plain libtorch on the
//    global batch: parameters and gradient norms within 1e-10.
CheckResult check_training_parity(const Options& o);
// 4. gather, gather_for_metrics (outside a loader), reduce (sum, mean, max, min; float64 and int64)
//    and pad_across_processes (end and start) on rank-dependent tensors of rank-dependent lengths,
//    against their closed forms, exactly.
CheckResult check_collectives(const Options& o);
// 5. set_trigger on the last rank makes check_trigger true on every rank, then false after the reset.
CheckResult check_trigger(const Options& o);
// 6. Gradient accumulation: with A steps (the config's, else 3) over 2A+1 micro-batches, sync happens
//    on every A-th micro-step and the last, the optimizer steps exactly then, and the parameters match
//    the reference that averages the loss over each window.
CheckResult check_gradient_accumulation(const Options& o);

struct Check {
  const char* name;
  CheckResult (*run)(const Options&);
};
// The checks in the order they run.
const std::vector<Check>& checks();
std::vector<std::string> check_names();

// One row of the agreed report.
struct Row {
  std::string name;
  bool passed = false;
  std::string detail;             // rank 0's, or the first failing rank's (prefixed "rank k: ")
  std::vector<int> failed_ranks;  // in rank order
};
struct Report {
  std::vector<Row> rows;
  int world = 1;
  bool all_passed() const;
};

// Runs `names` (all checks when empty) and agrees on the verdicts across ranks (collective).
Report run_all(const Options& o, const std::vector<std::string>& names = {});

// The pass/fail table and the summary line, as `accel test` prints it.
std::string format_report(const Report& r);

}  // namespace accel::cli::conformance
