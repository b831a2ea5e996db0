// accel-rank: what `accel launch` runs on every rank (see cli/launch_plan.h).
//
//   accel-rank [--node_rank K] [--num_nodes M] -- PROGRAM [ARGS...]
//
// 1. Reads the rank from the launcher (Open MPI: OMPI_COMM_WORLD_*; Slurm: SLURM_PROCID/LOCALID/NODEID)
//    and exports the names torchrun and Accelerate users know: RANK, WORLD_SIZE, LOCAL_RANK,
//    LOCAL_WORLD_SIZE, NODE_RANK, NUM_NODES.
//    When OMP_NUM_THREADS is unset (srun; accel launch sets it under mpirun), sets it to Slurm's
//    CPUs per task, else to this rank's share of the cores it may run on (cli/cpu_cores.h).
// 2. Runs PROGRAM as its child and passes SIGINT/SIGTERM/SIGHUP on to it. Both ends die together:
//    the child gets SIGKILL if accel-rank dies, and accel-rank gets SIGTERM if its parent (mpirun's
//    daemon, srun) dies, so no rank outlives its launcher.
// 3. When ACCEL_LAUNCH_STATUS_DIR is set, writes started_<R> there (its node) before PROGRAM starts,
//    and, when PROGRAM fails, rank_<R> (exit code or
//    signal, the time it ended, node, host, and a stop that lasted until the job was ended: SIGSTOP,
//    a debugger), from which `accel launch` names the first failing rank and a rank that hung.
//    A stopped PROGRAM is continued after a terminating signal is passed on, so that it ends.
// Exits with PROGRAM's exit code, or 128 + the signal that ended it.
// Plain C++ and POSIX (and base/env.cpp, the ACCEL_* table): no torch, no MPI, so it starts instantly.
#include "base/env.h"
#include "cli/cpu_cores.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

volatile pid_t g_child = 0;
volatile sig_atomic_t g_ending = 0;  // a signal that ends the program arrived (the launcher's teardown)
timespec g_ending_at{};              // when (clock_gettime is async-signal-safe)
// A stopped program (SIGSTOP, a debugger) acts on the signal only once continued: SIGCONT after it,
// so that a job ended around a hung rank ends now (SIGCONT to a running process does nothing).
void forward(int sig) {
  if (g_child <= 0) return;
  kill(g_child, sig);
  if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
    if (!g_ending) clock_gettime(CLOCK_REALTIME, &g_ending_at);
    g_ending = 1;
    kill(g_child, SIGCONT);
  }
}

long long now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

const char* first_env(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) return v;
  return nullptr;
}

int to_int(const char* s, const char* what) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0 || v > 1 << 30) {
    std::fprintf(stderr, "accel-rank: %s must be a non-negative integer, got '%s'\n", what, s);
    std::exit(2);
  }
  return static_cast<int>(v);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "accel-rank: %s\nusage: accel-rank [--node_rank K] [--num_nodes M] -- PROGRAM [ARGS...]\n"
               "(accel launch runs it on every rank; you do not need to run it yourself)\n",
               why);
  std::exit(2);
}

// stopped_ns, stop_signal, continued_ns: when the program was last stopped (and by what) and then
// continued (the launcher's teardown continues a stopped rank to end it); 0: never.
void record_failure(int rank, int node, int local_rank, int code, int sig, long long stopped_ns, int stop_signal,
                    long long continued_ns) {
  const std::string dir = accel::env::get("ACCEL_LAUNCH_STATUS_DIR");
  if (dir.empty()) return;
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  const std::string path = dir + "/rank_" + std::to_string(rank);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;  // the report is a courtesy; the exit code still travels through the launcher
  std::fprintf(f, "rank %d\nnode %d\nlocal_rank %d\nexit %d\nsignal %d\ntime_ns %lld\nhost %s\n", rank, node,
               local_rank, code, sig, now_ns(), host);
  if (stopped_ns > 0)
    std::fprintf(f, "stopped_ns %lld\nstop_signal %d\ncontinued_ns %lld\n", stopped_ns, stop_signal, continued_ns);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int node_rank = -1, num_nodes = 1, i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    if (a == "--node_rank") {
      node_rank = to_int(argv[++i], "--node_rank");
    } else if (a == "--num_nodes") {
      num_nodes = to_int(argv[++i], "--num_nodes");
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (i >= argc) usage("no program given after --");
  if (num_nodes < 1) usage("--num_nodes must be at least 1");

  const char* rank_s = first_env({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK"});
  const char* size_s = first_env({"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"});
  if (!rank_s || !size_s) {
    std::fprintf(stderr,
                 "accel-rank: not started by mpirun or srun (no OMPI_COMM_WORLD_RANK/SIZE or SLURM_PROCID/NTASKS); "
                 "start programs with `accel launch`\n");
    return 2;
  }
  const int rank = to_int(rank_s, "the rank"), world = to_int(size_s, "the world size");
  const char* local_s = first_env({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"});
  const char* local_size_s = first_env({"OMPI_COMM_WORLD_LOCAL_SIZE"});
  const int local_world = local_size_s ? to_int(local_size_s, "the local world size") : world / num_nodes;
  const int local_rank = local_s ? to_int(local_s, "the local rank") : rank % local_world;
  if (node_rank < 0) {
    const char* node_s = first_env({"SLURM_NODEID"});
    node_rank = node_s ? to_int(node_s, "SLURM_NODEID") : rank / local_world;
  }
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(local_world).c_str(), 1);
  setenv("NODE_RANK", std::to_string(node_rank).c_str(), 1);
  setenv("NUM_NODES", std::to_string(num_nodes).c_str(), 1);
  if (!first_env({"OMP_NUM_THREADS"})) {
    const char* per_task = first_env({"SLURM_CPUS_PER_TASK"});
    const int threads = per_task ? std::max(1, to_int(per_task, "SLURM_CPUS_PER_TASK"))
                                 : std::max(1, accel::cli::physical_cores(accel::cli::affinity_cpus()) / local_world);
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  }

  // The launcher learns which machines reach its status directory: a machine whose ranks wrote this
  // and then went silent went away (cli/elastic.h).
  if (const std::string dir = accel::env::get("ACCEL_LAUNCH_STATUS_DIR"); !dir.empty())
    if (FILE* f = std::fopen((dir + "/started_" + std::to_string(rank)).c_str(), "w")) {
      std::fprintf(f, "node %d\n", node_rank);
      std::fclose(f);
    }

  // If mpirun's daemon (or srun) goes away, so do we (and, through the child's death signal, the program).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  struct sigaction sa {};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaction(s, &sa, nullptr);

  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    std::perror("accel-rank: fork");
    return 2;
  }
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);  // accel-rank died before the line above took effect
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) signal(s, SIG_DFL);
    execvp(argv[i], argv + i);
    std::fprintf(stderr, "accel-rank: rank %d: cannot run '%s': %s\n", rank, argv[i], std::strerror(errno));
    _exit(127);
  }
  g_child = child;
  int status = 0;
  // Stops are watched too: a rank that stopped answering because it was stopped (and stayed so
  // until the job ended it) says so in its record, so accel launch can name it as the hang's cause.
  long long stopped_ns = 0, continued_ns = 0;
  int stop_signal = 0;
  for (;;) {
    if (waitpid(child, &status, WUNTRACED | WCONTINUED) < 0) {
      if (errno == EINTR) continue;
      std::perror("accel-rank: waitpid");
      return 2;
    }
    if (WIFSTOPPED(status)) {
      stopped_ns = now_ns();
      stop_signal = WSTOPSIG(status);
      continued_ns = 0;
    } else if (WIFCONTINUED(status)) {
      continued_ns = now_ns();
    } else {
      break;
    }
  }
  // Open MPI's teardown continues a stopped process (SIGCONT to the process group) just before it
  // sends SIGTERM: a stop that ended less than a second before the end came is one that lasted.
  const long long ending_ns =
      g_ending ? static_cast<long long>(g_ending_at.tv_sec) * 1000000000LL + g_ending_at.tv_nsec : 0;
  if (continued_ns > 0 && ending_ns > 0 && ending_ns - continued_ns < 1000000000LL) continued_ns = 0;
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    if (code != 0) record_failure(rank, node_rank, local_rank, code, 0, stopped_ns, stop_signal, continued_ns);
    return code;
  }
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
  record_failure(rank, node_rank, local_rank, 128 + sig, sig, stopped_ns, stop_signal, continued_ns);
  return 128 + sig;
}
