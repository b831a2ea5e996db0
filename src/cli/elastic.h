// `accel launch --min_nodes M`: on which hosts a failed job starts again. Pure: no processes, so the
// rule is unit-tested (tests/cli/test_launch_plan.cpp); launch_command.cpp probes the hosts and runs.
//
// A host is dropped when the job's first failure was one of its ranks killed by a signal (the host
// or its processes died: OOM killer, SIGKILL, a crash), when its ranks started and could write to the
// launcher's status directory but none of them left a record while the others' say only that they
// were stopped (SIGTERM: the launcher ending the job after losing that host), or when it does not
// answer the start-up probe (`mpirun -np 1 --host H:1 true` within
// ACCEL_HOST_PROBE_TIMEOUT_S). A rank that exited with an error code is the program's failure, not
// the host's: the job starts again on the same hosts.
//
// The job starts again on the largest number n of the usable hosts (in hostfile order) that divides
// the host count it started with, as long as n >= M: the Accelerator then multiplies gradient
// accumulation by initial / n (ACCEL_INITIAL_WORLD_SIZE), so every optimizer step sees the global
// batch it did. 4 hosts with one gone restart on 2, not 3.
#pragma once

#include "cli/hostfile.h"

#include <string>
#include <vector>

namespace accel::cli {

struct ShrinkRequest {
  std::vector<HostSlots> machines;   // the hosts of the start that failed, in node order
  std::vector<std::string> dropped;  // per machine: why it cannot be used again ("" = usable)
  int initial_machines = 1;          // the first start's host count
  int min_nodes = 1;
};

struct ShrinkPlan {
  bool ok = false;                  // false: fewer than min_nodes usable hosts (why says so)
  std::vector<HostSlots> machines;  // the hosts to start on
  std::string why;                  // one line for the log: what was dropped and what is used
};

ShrinkPlan plan_shrink(const ShrinkRequest& request);

// What accel-rank records of a rank that ended badly (the status directory's rank_<r> files).
struct RankFailure {
  int rank = -1, node = -1, local_rank = -1, exit = 0, signal = 0, stop_signal = 0;
  // When it ended; when it was last stopped and then continued (0: never).
  long long time_ns = 0, stopped_ns = 0, continued_ns = 0;
  std::string host;
};

// The failure that came first: the earliest record, where a rank stopped by SIGTERM counts after
// every other kind (mpirun stops the surviving ranks with it once one has failed, and the clocks of
// two machines need not agree on which came first). nullptr when there is none.
const RankFailure* first_failure(const std::vector<RankFailure>& failures);

// Per machine (node index < machines), why it is dropped before the job starts again ("" = kept),
// from the records of the start that failed (see the top of this file). reached[m]: some rank of
// machine m wrote its start to the status directory (where it is not shared, a machine's silence says
// nothing).
std::vector<std::string> hosts_failed(const std::vector<RankFailure>& failures, const std::vector<bool>& reached);

}  // namespace accel::cli
