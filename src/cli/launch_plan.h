// What `accel launch` runs: the mpirun (or srun) command line for a request. Pure: no processes,
// no files, no torch, so every rule below is unit-tested.
//
// Counts: an explicit flag > the config file's value > the hostfile (its host count; for the ranks,
// the slots of the fewest-slotted host used, times the hosts used) > 1. The ranks are spread evenly
// over the machines (num_processes % num_machines == 0, as in Accelerate); with a hostfile the first
// num_machines hosts are used, each needing at least num_processes / num_machines slots.
//
// Launchers:
//   mpirun, one machine:   mpirun --oversubscribe -x K=V.. -np N  accel-rank --node_rank 0 --num_nodes 1 -- PROGRAM
//   ARGS mpirun, hostfile:      one app context per machine, so every rank knows its node rank exactly:
//                          mpirun --oversubscribe -x K=V.. -np k --host h0:k accel-rank --node_rank 0 ... : -np k
//                          --host h1:k ...
//   srun (in a Slurm allocation): srun --ntasks=N --nodes=M --ntasks-per-node=k --kill-on-bad-exit=1
//                          --quit-on-interrupt accel-rank --num_nodes M -- PROGRAM ARGS  (node rank
//                          from SLURM_NODEID)
// "auto" picks srun inside a Slurm allocation (SLURM_JOB_ID set) unless a hostfile is given, else mpirun.
// mpirun forwards only the `-x` variables to other machines, so everything a rank needs (ACCEL_*)
// travels that way; srun exports the launcher's whole environment.
//
// Cores (mpirun): each machine's cores are shared evenly among its ranks. With k ranks per machine
// and C cores (this machine's physical cores, taken for every machine of a hostfile):
//   k <= C   --map-by ppr:k:node:PE=C/k --bind-to core, and -x OMP_NUM_THREADS=C/k (libtorch's
//            intra-op threads), so each rank computes on its own C/k cores;
//   k > C    (oversubscribed, as the tests' 4 ranks on 2 cores) --bind-to none and OMP_NUM_THREADS=1.
// Without these flags Open MPI binds each of up to 2 ranks to one core: a lone rank computes on one.
// An OMP_NUM_THREADS the user set is kept (and forwarded); --bind none asks for no binding (threads
// still the share); mapping or binding flags in --launcher_args replace ours. srun: Slurm's
// allocation decides the cores; accel-rank sets OMP_NUM_THREADS from SLURM_CPUS_PER_TASK or its CPU
// mask when unset.
#pragma once

#include "base/error.h"

#include "cli/hostfile.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace accel::cli {

class LaunchError : public accel::InvalidArgumentError {
 public:
  using accel::InvalidArgumentError::InvalidArgumentError;
};

struct LaunchRequest {
  std::optional<int> num_processes, num_machines;                // flags
  std::optional<int> config_num_processes, config_num_machines;  // the config file, when one was read
  std::vector<HostSlots> hosts;                                  // the hostfile; empty: none
  std::string hostfile;                                          // its path, for messages
  std::string launcher = "auto";                                 // auto | mpirun | srun
  bool in_slurm = false;                                         // SLURM_JOB_ID is set
  std::string mpirun = "mpirun", srun = "srun";
  std::string rank_wrapper = "accel-rank";               // absolute path of accel-rank
  std::vector<std::pair<std::string, std::string>> env;  // exported to every rank
  std::vector<std::string> launcher_args;                // passed to mpirun/srun as they are
  std::vector<std::string> program;                      // PROGRAM ARGS...
  bool as_root = false;  // the launcher runs as root: mpirun gets --allow-run-as-root (Open MPI refuses root otherwise)
  int cores_per_machine = 1;  // physical cores a machine gives its ranks
  std::string bind = "auto";  // auto | core | none
};

struct LaunchPlan {
  std::string launcher;  // "mpirun" or "srun"
  int num_processes = 1, num_machines = 1, per_machine = 1;
  std::vector<HostSlots> machines;  // the hosts used (slots = ranks placed there); empty: local/Slurm
  std::vector<std::string> argv;    // the command to run
  std::vector<std::pair<std::string, std::string>> env;  // for the launcher's own environment (srun)
  // Cores and threads (mpirun): binding is "core" (each rank on cores_per_rank cores of its own),
  // "none", "launcher_args" (the user's flags decide) or "slurm".
  std::string binding = "none";
  int cores_per_rank = 0;              // 0 where not bound
  int threads_per_rank = 0;            // OMP_NUM_THREADS each rank gets; 0: left to the rank (srun)
  bool threads_from_user = false;      // OMP_NUM_THREADS was the user's
  std::vector<std::string> bind_args;  // the flags of the two above, as they appear in argv
};

// Throws LaunchError with a message saying what is wrong and what to change.
LaunchPlan plan_launch(const LaunchRequest& request);

// argv as one line a shell would split back into the same words (for --dry_run and messages).
std::string shell_join(const std::vector<std::string>& argv);
// --launcher_args' words as a POSIX shell splits them: blanks separate, '...' keeps everything,
// "..." keeps all but \" \\ \$ \` (the character after the backslash), a backslash outside quotes
// keeps the next character. No expansion. Throws LaunchError for an unterminated quote.
std::vector<std::string> split_shell_words(const std::string& text);
// `args` without the flags that place ranks (mapping, binding, cpu sets, per-node counts) and their
// values: the rest (--prefix, --mca ..., -x ...) for a one-process probe of a host.
std::vector<std::string> without_placement_args(const std::vector<std::string>& args);

}  // namespace accel::cli
