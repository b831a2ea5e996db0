// `accel launch --min_nodes M`: on which hosts a failed job starts again. Pure: no processes, so the
// rule is unit-tested (tests/cli/test_launch_plan.cpp); launch_command.cpp probes the hosts and runs.
//
// A host is dropped when the job's first failure was one of its ranks killed by a signal (the host
// or its processes died: OOM killer, SIGKILL, a crash) or when it does not answer the start-up probe
// (`mpirun -np 1 --host H:1 true` within ACCEL_HOST_PROBE_TIMEOUT_S). A rank that exited with an error
// code is the program's failure, not the host's: the job starts again on the same hosts.
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

}  // namespace accel::cli
