// `accel launch [flags] PROGRAM [ARGS...]`: resolves the counts and config (explicit flag > config
// file > default; see cli/launch_plan.h), starts the ranks with mpirun or srun, passes Ctrl-C on, and
// exits with the first failing rank's exit code, naming that rank.
#include "cli/commands.h"
#include "cli/cpu_cores.h"
#include "cli/elastic.h"
#include "cli/launch_plan.h"
#include "cli/paths.h"
#include "zero/spec.h"

#include "accelerator/config.h"
#include "base/env.h"
#include "base/files.h"
#include "comm/cuda_comm.h"
#include "comm/transport/nccl/nccl_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace accel::cli {
namespace {

struct LaunchArgs {
  std::string config_file, hostfile, mixed_precision, fsdp_sharding_strategy, launcher_args;
  std::string launcher = "auto", bind = "auto";
  std::optional<int> num_processes, num_machines, zero_stage, max_restarts, min_nodes;
  std::optional<std::int64_t> gradient_accumulation_steps;
  bool cpu = false, dry_run = false, auto_resume = false;
};

bool is_executable(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

// The program as found: a path is checked as it is, a bare name is looked up on PATH.
std::optional<std::string> find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return is_executable(name) ? std::optional(name) : std::nullopt;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  std::string d;
  while (std::getline(dirs, d, ':'))
    if (!d.empty() && is_executable(d + "/" + name)) return d + "/" + name;
  return std::nullopt;
}

// --- running and reporting ---------------------------------------------------------------------

volatile pid_t g_launcher_child = 0;
volatile sig_atomic_t g_launch_interrupted = 0;

// A Ctrl-C from the terminal reaches the whole foreground process group, mpirun included, so it is
// not passed on again (mpirun treats a second SIGINT as "abort without cleanup"). A signal sent to
// this process alone (kill, a scheduler) is passed on.
void on_launch_signal(int sig, siginfo_t* info, void*) {
  g_launch_interrupted = sig;
  if (g_launcher_child > 0 && info && info->si_code <= 0) kill(g_launcher_child, sig);
}

std::vector<RankFailure> read_failures(const std::string& dir) {
  std::vector<RankFailure> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("rank_", 0) != 0 || name.find('.') != std::string::npos) continue;
    std::ifstream f(dir + "/" + name);
    RankFailure r;
    const std::map<std::string, int*> ints = {
        {"rank", &r.rank}, {"node", &r.node},     {"local_rank", &r.local_rank},
        {"exit", &r.exit}, {"signal", &r.signal}, {"stop_signal", &r.stop_signal}};
    std::string key;
    while (f >> key) {
      if (auto it = ints.find(key); it != ints.end())
        f >> *it->second;
      else if (key == "time_ns")
        f >> r.time_ns;
      else if (key == "stopped_ns")
        f >> r.stopped_ns;
      else if (key == "continued_ns")
        f >> r.continued_ns;
      else if (key == "host")
        f >> r.host;
    }
    if (r.rank >= 0) out.push_back(r);
  }
  closedir(d);
  return out;
}

// The nodes some rank of which wrote its start (accel-rank's started_<rank>: "node N").
std::vector<bool> nodes_started(const std::string& dir, int machines) {
  std::vector<bool> out(static_cast<std::size_t>(std::max(machines, 0)));
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("started_", 0) != 0) continue;
    std::ifstream f(dir + "/" + name);
    std::string key;
    int node = -1;
    if (f >> key >> node && key == "node" && node >= 0 && node < machines) out[static_cast<std::size_t>(node)] = true;
  }
  closedir(d);
  return out;
}

struct RunResult {
  int code = 0;
  std::vector<RankFailure> failures;  // what the ranks that ended badly recorded
  std::vector<bool> started;          // per machine: a rank of it wrote its start (nodes_started)
};

// From here on a Ctrl-C or a kill stops the launch (g_launch_interrupted) instead of ending accel and
// leaving what it started.
void catch_launch_signals() {
  struct sigaction sa {};
  sa.sa_sigaction = on_launch_signal;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
}

RunResult run_plan(const LaunchPlan& plan, const std::string& status_dir) {
  catch_launch_signals();

  const pid_t child = fork();
  if (child < 0) {
    files::remove_tree(status_dir);
    throw LaunchError(std::string("fork failed: ") + std::strerror(errno));
  }
  if (child == 0) {
    for (int s : {SIGINT, SIGTERM, SIGHUP}) signal(s, SIG_DFL);
    for (const auto& [k, v] : plan.env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : plan.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "accel launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  g_launcher_child = child;
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_launcher_child = 0;
  const int launcher_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

  auto failures = read_failures(status_dir);
  const std::vector<bool> started = nodes_started(status_dir, plan.num_machines);
  files::remove_tree(status_dir);
  if (g_launch_interrupted) {
    fmt::print(stderr, "accel launch: interrupted by {}; stopped all {} ranks\n", strsignal(g_launch_interrupted),
               plan.num_processes);
    return {128 + g_launch_interrupted, {}, {}};
  }
  if (const RankFailure* first = first_failure(failures)) {
    const std::string how = first->signal
                                ? fmt::format("was killed by signal {} ({})", first->signal, strsignal(first->signal))
                                : fmt::format("exited with code {}", first->exit);
    fmt::print(stderr, "accel launch: rank {} (node {}, local rank {}, host {}) failed first: it {}", first->rank,
               first->node, first->local_rank, first->host, how);
    if (failures.size() > 1) fmt::print(stderr, "; {} other rank(s) ended after it", failures.size() - 1);
    fmt::print(stderr, "\n");
    // A rank stopped before that (SIGSTOP, a debugger) stopped answering: the others waited for it
    // until their collective timeout. It is the one to look at.
    for (const auto& f : failures)
      if (f.stopped_ns > 0 && f.stopped_ns <= first->time_ns &&
          (f.continued_ns == 0 || f.continued_ns >= first->time_ns))
        fmt::print(stderr,
                   "accel launch: rank {} (node {}, local rank {}, host {}) stopped answering: it was stopped by "
                   "signal {} ({}) {:.1f} s before rank {} failed, and stayed stopped\n",
                   f.rank, f.node, f.local_rank, f.host, f.stop_signal, strsignal(f.stop_signal),
                   static_cast<double>(first->time_ns - f.stopped_ns) / 1e9, first->rank);
    return {first->exit, failures, started};
  }
  if (launcher_code != 0) {
    fmt::print(stderr, "accel launch: {} failed with exit code {} before any rank reported an exit\n", plan.launcher,
               launcher_code);
    return {launcher_code, {}, {}};
  }
  return {};
}

// --min_nodes: does each host start a process? `mpirun -np 1 --host H:1 true` per host, side by side,
// each given timeout_s. Returns, per host, why it cannot be used ("" when it answered).
std::vector<std::string> probe_hosts(const LaunchRequest& r, const std::vector<HostSlots>& hosts, int timeout_s) {
  std::vector<pid_t> pids(hosts.size(), -1);
  std::vector<std::string> why(hosts.size());
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    std::vector<std::string> argv = {r.mpirun, "--oversubscribe"};
    if (r.as_root) argv.push_back("--allow-run-as-root");
    const auto extra = without_placement_args(r.launcher_args);  // --prefix, --mca ...: what reaching a host takes
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {"-np", "1", "--host", hosts[h].host + ":1", "true"});
    const pid_t pid = fork();
    if (pid < 0) {
      why[h] = std::string("cannot fork the start-up probe: ") + std::strerror(errno);
      continue;
    }
    if (pid == 0) {
      setpgid(0, 0);  // its own group: a probe that hangs is killed with whatever it started
      const int null = open("/dev/null", O_RDWR);
      for (int fd : {0, 1, 2}) dup2(null, fd);
      std::vector<char*> a;
      for (auto& w : argv) a.push_back(w.data());
      a.push_back(nullptr);
      execvp(a[0], a.data());
      _exit(127);
    }
    pids[h] = pid;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (bool pending = true; pending;) {
    pending = false;
    for (std::size_t h = 0; h < hosts.size(); ++h) {
      if (pids[h] < 0) continue;
      int status = 0;
      const pid_t done = waitpid(pids[h], &status, WNOHANG);
      if (done == 0 && g_launch_interrupted) {  // Ctrl-C: the probes (in groups of their own) go too
        kill(-pids[h], SIGKILL);
        waitpid(pids[h], &status, 0);
        why[h] = "interrupted";
        pids[h] = -1;
        continue;
      }
      if (done == 0 && std::chrono::steady_clock::now() < deadline) {
        pending = true;
        continue;
      }
      if (done == 0) {  // out of time
        kill(-pids[h], SIGKILL);
        waitpid(pids[h], &status, 0);
        why[h] = fmt::format("no answer to the start-up probe within {} s", timeout_s);
      } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        why[h] = fmt::format("the start-up probe failed ({} {})", WIFEXITED(status) ? "exit code" : "signal",
                             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      }
      pids[h] = -1;
    }
    if (pending) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return why;
}

// The config a program is given on its own command line (--config_file X, --config-file=X), which the
// launcher does not read: named in its first line instead of "no config file".
std::string program_config_arg(const std::vector<std::string>& program) {
  for (std::size_t i = 1; i < program.size(); ++i)
    for (const char* flag : {"--config_file", "--config-file"}) {
      const std::string f = flag;
      if (program[i] == f && i + 1 < program.size()) return program[i + 1];
      if (program[i].rfind(f + "=", 0) == 0) return program[i].substr(f.size() + 1);
    }
  return "";
}

int run_launch(const LaunchArgs& args, std::vector<std::string> program) {
  if (program.empty()) throw LaunchError("no program given: accel launch [flags] PROGRAM [ARGS...]");
  if (program[0].size() > 1 && program[0][0] == '-')
    throw LaunchError(fmt::format("unknown flag '{}' (flags go before PROGRAM; see accel launch --help)", program[0]));

  LaunchRequest req;
  req.num_processes = args.num_processes;
  req.num_machines = args.num_machines;
  req.launcher = args.launcher;
  req.in_slurm = std::getenv("SLURM_JOB_ID") != nullptr;
  req.launcher_args = split_shell_words(args.launcher_args);
  req.bind = args.bind;
  // This machine's cores (those accel launch may use: taskset and cgroup cpusets shrink them); a
  // hostfile's machines are taken to have as many.
  req.cores_per_machine = physical_cores(affinity_cpus());

  // The config: --config_file, else ACCEL_CONFIG_FILE, else the default one when it exists. It is read
  // here to check it before anything starts, and each rank reads it again (ACCEL_CONFIG_FILE).
  int config_restarts = 0;  // the config's max_restarts (--max_restarts wins)
  std::string config_path = args.config_file;
  if (const char* env_file = std::getenv("ACCEL_CONFIG_FILE"); config_path.empty() && env_file) config_path = env_file;
  if (config_path.empty() && access(default_config_path().c_str(), R_OK) == 0) config_path = default_config_path();
  if (!config_path.empty()) {
    const AcceleratorConfig file = load_config_file(config_path);
    req.config_num_processes = file.num_processes;
    if (file.parallelism) {  // copies x shards is the one count the job runs at
      if (!req.config_num_processes) req.config_num_processes = file.parallelism->processes();
      if (args.num_processes && *args.num_processes != file.parallelism->processes())
        throw ConfigError(
            fmt::format("{}: {} is {} processes, but --num_processes is {}; launch {}, or change the "
                        "sizes",
                        config_path, shard_group_source(file), file.parallelism->processes(), *args.num_processes,
                        file.parallelism->processes()));
    }
    req.config_num_machines = file.num_machines;
    config_restarts = file.max_restarts;
    config_path = files::absolute_path(config_path);
    req.env.emplace_back("ACCEL_CONFIG_FILE", config_path);
  }
  // The flags go through the same resolution the ranks will do, so a bad value fails here, once.
  ConfigOverrides o;
  if (!config_path.empty()) o.config_file = config_path;
  if (!args.mixed_precision.empty()) o.mixed_precision = args.mixed_precision;
  if (args.gradient_accumulation_steps) o.gradient_accumulation_steps = args.gradient_accumulation_steps;
  if (args.cpu) o.use_cpu = true;
  if (args.zero_stage) o.zero_stage = args.zero_stage;
  if (!args.fsdp_sharding_strategy.empty()) o.fsdp_sharding_strategy = args.fsdp_sharding_strategy;
  resolve_config(o);
  if (o.mixed_precision) req.env.emplace_back("ACCEL_MIXED_PRECISION", *o.mixed_precision);
  if (o.gradient_accumulation_steps)
    req.env.emplace_back("ACCEL_GRADIENT_ACCUMULATION_STEPS", std::to_string(*o.gradient_accumulation_steps));
  if (o.use_cpu) req.env.emplace_back("ACCEL_USE_CPU", "1");
  if (o.zero_stage) req.env.emplace_back("ACCEL_ZERO_STAGE", std::to_string(*o.zero_stage));
  if (o.fsdp_sharding_strategy) req.env.emplace_back("ACCEL_FSDP_SHARDING_STRATEGY", *o.fsdp_sharding_strategy);
  if (args.auto_resume) req.env.emplace_back("ACCEL_AUTO_RESUME", "1");  // (as the flags above, over an exported one)
  // Variables already set here reach ranks on other machines too (mpirun forwards only -x ones).
  std::map<std::string, bool> named;
  for (const auto& [k, v] : req.env) named[k] = true;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    const std::string k = kv.substr(0, eq);
    // accel's own, the threads, and (as DeepSpeed's launcher) NCCL's, Python's, UCX's, MVAPICH's and MLflow's.
    bool forwarded = k == "OMP_NUM_THREADS" || k == "THP_MEM_ALLOC_ENABLE";
    for (const char* prefix : {"ACCEL_", "NCCL_", "PYTHON", "UCX_", "MV2_", "MLFLOW_"})
      forwarded = forwarded || k.rfind(prefix, 0) == 0;
    if (forwarded && !named[k] && k != "ACCEL_LAUNCH_STATUS_DIR" && k != "ACCEL_RESTART_COUNT") {
      req.env.emplace_back(k, kv.substr(eq + 1));
      named[k] = true;
    }
  }
  // libtorch's CPU allocator backs allocations of 2 MiB and more with transparent huge pages when
  // THP_MEM_ALLOC_ENABLE=1 (read once, at the first allocation, so it must be in the environment
  // before the program starts). Sharded training frees and reallocates large gradient and gather
  // buffers every step; with 4 KiB pages about half the CPU time of a 0.59B ZeRO-2 step went to
  // page faults and zeroing (perf), and the step took 6.0 s against 4.9 s with huge pages (docs/performance.md,
  // "step_bench at 0.59B"). The user's own value wins (0 turns it off).
  if (!named["THP_MEM_ALLOC_ENABLE"]) req.env.emplace_back("THP_MEM_ALLOC_ENABLE", "1");

  if (!args.hostfile.empty()) {
    req.hosts = read_hostfile(args.hostfile);
    req.hostfile = args.hostfile;
  }
  const auto found = find_program(program[0]);
  if (!found)
    throw LaunchError(fmt::format("program '{}' not found{}", program[0],
                                  program[0].find('/') == std::string::npos ? " on PATH" : " (or not executable)"));
  // Ranks on other machines run the same path: make it absolute when it was relative, without
  // resolving symbolic links (a venv's bin/python is a link to the system's, and only the link's
  // place makes it the venv's Python).
  if (program[0].find('/') != std::string::npos && program[0][0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd)) program[0] = std::string(cwd) + "/" + program[0];
  }
  req.program = program;

  const std::string self = files::self_exe_path();
  req.rank_wrapper = self.substr(0, self.rfind('/')) + "/accel-rank";
  if (!is_executable(req.rank_wrapper))
    throw LaunchError(
        fmt::format("accel-rank is missing next to this accel ({}); rebuild or reinstall accel", req.rank_wrapper));
  req.mpirun = env::get("ACCEL_MPIRUN");  // the table's defaults: mpirun, srun
  req.as_root = ::geteuid() == 0;
  req.srun = env::get("ACCEL_SRUN");

  // Each start (the first, then up to --max_restarts more after a failure) gets its own status
  // directory and plan: ACCEL_RESTART_COUNT tells the ranks which start it is.
  const LaunchRequest base = req;
  const int max_restarts = args.max_restarts.value_or(config_restarts);
  // --min_nodes: the hosts the job runs on, fewer after a host is dropped (cli/elastic.h).
  const LaunchPlan initial = plan_launch(base);
  std::vector<HostSlots> machines = initial.machines;
  if (args.min_nodes) {
    if (initial.launcher != "mpirun" || initial.machines.empty())
      throw LaunchError("--min_nodes needs --hostfile (mpirun): it drops hosts of the hostfile that fail");
    if (*args.min_nodes < 1 || *args.min_nodes > initial.num_machines)
      throw LaunchError(fmt::format("--min_nodes must be between 1 and the {} machine(s) the job starts on, got {}",
                                    initial.num_machines, *args.min_nodes));
    if (max_restarts < 1)
      throw LaunchError("--min_nodes acts when the job starts again: give --max_restarts N (N >= 1) too");
  }
  // Drops the hosts `why` names (non-empty entries); false when too few are left (said why).
  auto shrink = [&](const std::vector<std::string>& why) {
    const ShrinkPlan s = plan_shrink({machines, why, initial.num_machines, *args.min_nodes});
    fmt::print(stderr, "accel launch: {}{}\n", s.ok ? "" : "not starting again: ", s.why);
    if (s.ok) machines = s.machines;
    return s.ok;
  };
  if (!args.dry_run) catch_launch_signals();
  auto interrupted = [&](const char* when) {
    if (!g_launch_interrupted) return false;
    fmt::print(stderr, "accel launch: interrupted by {} {}\n", strsignal(g_launch_interrupted), when);
    return true;
  };
  for (int attempt = 0;; ++attempt) {
    const bool first = attempt == 0;
    req = base;
    if (max_restarts > 0) req.env.emplace_back("ACCEL_RESTART_COUNT", std::to_string(attempt));
    if (args.min_nodes && !args.dry_run) {
      const int probe_s = static_cast<int>(std::max(1LL, env::get_int("ACCEL_HOST_PROBE_TIMEOUT_S")));
      const auto why = probe_hosts(base, machines, probe_s);
      if (interrupted("while probing the hosts; nothing started")) return 128 + g_launch_interrupted;
      if (std::any_of(why.begin(), why.end(), [](const std::string& w) { return !w.empty(); }) && !shrink(why))
        return 1;
    }
    if (args.min_nodes && static_cast<int>(machines.size()) < initial.num_machines) {
      const int n = static_cast<int>(machines.size());
      req.hosts = machines;
      req.num_machines = n;
      req.num_processes = initial.per_machine * n;
      req.env.emplace_back("ACCEL_INITIAL_WORLD_SIZE", std::to_string(initial.num_processes));
      fmt::print(stderr,
                 "accel launch: {} rank(s) on {} of the {} machines it started on; the ranks accumulate {}x the "
                 "gradients per optimizer step so the global batch stays (ACCEL_INITIAL_WORLD_SIZE={})\n",
                 initial.per_machine * n, n, initial.num_machines, initial.num_machines / n, initial.num_processes);
    }
    // Where the ranks record how they failed. With several machines, the working directory (the ranks
    // on the other machines cannot reach this one's /tmp; a job's directory is usually on a filesystem
    // every machine mounts), else $TMPDIR.
    char tmpl[PATH_MAX];
    const char* tmp = std::getenv("TMPDIR");
    std::snprintf(tmpl, sizeof tmpl, "%s/.accel-launch-XXXXXX", files::working_dir().c_str());
    std::string status_dir;
    if (!args.dry_run && initial.num_machines > 1) {
      if (mkdtemp(tmpl))
        status_dir = tmpl;
      else if (first)
        fmt::print(stderr, "accel launch: cannot create {} ({}): ranks on other machines cannot say how they failed\n",
                   tmpl, std::strerror(errno));
    }
    std::snprintf(tmpl, sizeof tmpl, "%s/accel-launch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!args.dry_run && status_dir.empty()) {
      if (!mkdtemp(tmpl)) throw LaunchError(std::string("cannot create a status directory: ") + std::strerror(errno));
      status_dir = tmpl;
    }
    if (!status_dir.empty()) req.env.emplace_back("ACCEL_LAUNCH_STATUS_DIR", status_dir);

    LaunchPlan plan;
    try {
      plan = plan_launch(req);
    } catch (...) {
      if (!status_dir.empty()) files::remove_tree(status_dir);
      throw;
    }
    if (plan.launcher == "mpirun" && !find_program(plan.argv[0])) {
      if (!status_dir.empty()) files::remove_tree(status_dir);
      throw LaunchError(
          fmt::format("'{}' not found: install Open MPI (apt install openmpi-bin) or set ACCEL_MPIRUN", plan.argv[0]));
    }
    const std::string where = plan.num_machines == 1
                                  ? std::string("1 machine")
                                  : fmt::format("{} machines ({} per machine)", plan.num_machines, plan.per_machine);
    if (first) {
      std::string config = fmt::format("config {}", config_path);
      if (config_path.empty()) {
        const std::string given = program_config_arg(program);
        config =
            given.empty() ? std::string("no config file") : fmt::format("the program's own --config_file {}", given);
      }
      fmt::print(stderr, "accel launch: {} rank(s) on {} via {}; {}\n", plan.num_processes, where, plan.launcher,
                 config);
    }
    const std::string threads = plan.threads_per_rank > 0
                                    ? fmt::format("{} intra-op thread(s) per rank{}", plan.threads_per_rank,
                                                  plan.threads_from_user ? " (your OMP_NUM_THREADS)" : "")
                                    : std::string("intra-op threads from Slurm's CPUs per task");
    const std::string cores =
        plan.binding == "core"
            ? fmt::format("each rank bound to {} of {} core(s)", plan.cores_per_rank, req.cores_per_machine)
        : plan.binding == "none"
            ? fmt::format("ranks not bound ({} per machine, {} core(s))", plan.per_machine, req.cores_per_machine)
        : plan.binding == "slurm" ? std::string("cores as Slurm binds them")
                                  : std::string("placement from --launcher_args");
    if (first) fmt::print(stderr, "accel launch: {}; {}\n", cores, threads);
    if (first && req.as_root && plan.launcher == "mpirun")
      fmt::print(stderr, "accel launch: running as root: mpirun gets --allow-run-as-root\n");
    if (const int gpus = comm::cuda_device_count(); first && gpus > 0 && !args.cpu)
      fmt::print(stderr, "accel launch: {} GPU(s) per machine (as on this one); collectives on CUDA tensors: {}\n",
                 gpus, comm::describe_cuda_comm(plan.per_machine, gpus));
    if (args.dry_run) {
      fmt::print("{}\n", shell_join(plan.argv));
      return 0;
    }
    if (interrupted("before the ranks started")) {
      files::remove_tree(status_dir);
      return 128 + g_launch_interrupted;
    }
    const RunResult result = run_plan(plan, status_dir);
    const int code = result.code;
    if (code == 0 || g_launch_interrupted || attempt >= max_restarts) return code;
    // With --min_nodes, the hosts that died are dropped (cli/elastic.h says how they are told).
    if (args.min_nodes) {
      std::vector<bool> reached = result.started;
      reached.resize(machines.size());
      const auto why = hosts_failed(result.failures, reached);
      if (std::any_of(why.begin(), why.end(), [](const std::string& w) { return !w.empty(); }) && !shrink(why))
        return code;
    }
    fmt::print(stderr, "accel launch: the job failed (exit code {}); starting it again, restart {} of {}\n", code,
               attempt + 1, max_restarts);
  }
}

}  // namespace

void add_launch_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  auto* cmd =
      app.add_subcommand("launch", "Start PROGRAM on every rank (mpirun on one node or a hostfile; srun in Slurm)");
  cmd->add_option("--config_file", args->config_file,
                  fmt::format("Accelerate YAML or DeepSpeed JSON (default: {} when it exists)", default_config_path()));
  cmd->add_option("--num_processes,-n", args->num_processes,
                  "Total ranks over all machines (default: config, hostfile slots, 1)");
  cmd->add_option("--num_machines", args->num_machines, "Machines (default: config, hostfile hosts, 1)");
  cmd->add_option("--hostfile", args->hostfile, "Hosts for mpirun, one 'host slots=N' per line (DeepSpeed's format)");
  cmd->add_option("--mixed_precision", args->mixed_precision, "no, fp16, bf16 or fp8 (overrides the config)");
  cmd->add_option("--zero_stage", args->zero_stage, "DeepSpeed ZeRO stage 0-3 (overrides the config)");
  cmd->add_option("--fsdp_sharding_strategy", args->fsdp_sharding_strategy,
                  fmt::format("{} (overrides the config)", zero::fsdp_names(" | ")));
  cmd->add_option("--gradient_accumulation_steps", args->gradient_accumulation_steps, "Overrides the config");
  cmd->add_flag("--cpu", args->cpu, "Train on the CPU even where GPUs exist");
  cmd->add_option("--launcher", args->launcher, "auto (srun inside Slurm, else mpirun), mpirun or srun");
  cmd->add_option("--launcher_args", args->launcher_args,
                  "Extra arguments for mpirun/srun, as one string (--map-by/--bind-to here replace accel's)");
  cmd->add_option("--bind", args->bind,
                  "auto (each rank bound to its share of the machine's cores; no binding when there are more "
                  "ranks than cores), core, or none (not bound; threads still the share)");
  cmd->add_flag("--dry_run", args->dry_run, "Print the command instead of running it");
  cmd->add_option("--max_restarts", args->max_restarts,
                  "When the job fails (a rank dies or exits non-zero), end every rank and start it again, up to N "
                  "times; ranks see ACCEL_RESTART_COUNT (torchrun's name; default: the config's max_restarts, 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--min_nodes", args->min_nodes,
                  "With --hostfile and --max_restarts: a restart drops the host whose rank was killed first, a "
                  "host whose started ranks all went silent, and hosts that do not answer a start-up probe, and "
                  "goes on with the rest while at least M remain "
                  "(gradient accumulation grows so the global batch stays)");
  cmd->add_flag("--auto_resume", args->auto_resume,
                "Ranks resume from the newest checkpoint of their project_dir when there is one (ACCEL_AUTO_RESUME=1)");
  cmd->prefix_command();  // everything from PROGRAM on belongs to PROGRAM
  cmd->footer(
      "PROGRAM [ARGS...] follow the flags. Each rank sees RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
      "NODE_RANK and NUM_NODES, runs on its share of the machine's cores (--bind) and gets as many\n"
      "intra-op threads (OMP_NUM_THREADS, unless you set it). The exit code is the first failing rank's.");
  cmd->callback([&exit_code, args, cmd] {
    try {
      exit_code = run_launch(*args, cmd->remaining());
    } catch (const std::exception& e) {
      fmt::print(stderr, "accel launch: error: {}\n", e.what());
      exit_code = 2;
    }
  });
}

}  // namespace accel::cli
