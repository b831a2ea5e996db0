// `accel bench`: the scaling report. Runs benchmarks/step_bench through `accel launch` for every
// strategy x precision x world size (cli/bench_plan.h says in which order, on which machines, and
// which formulas each record carries), appends one JSON line per finished run to OUT/scaling.jsonl as
// soon as it finishes (a sweep cut short keeps what it measured), and draws OUT/*.png with
// benchmarks/plot_scaling.py in the project's Python (matplotlib).
#include "cli/bench_plan.h"
#include "cli/child_runs.h"
#include "cli/commands.h"
#include "cli/hostfile.h"

#include "base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifndef ACCEL_BENCH_PYTHON
#define ACCEL_BENCH_PYTHON ""
#endif
#ifndef ACCEL_BENCH_PLOT_SCRIPT
#define ACCEL_BENCH_PLOT_SCRIPT ""
#endif

namespace accel::cli {
namespace {

struct BenchArgs {
  std::string num_processes = "1,2,4", strategies = "DDP,ZERO_2,ZERO_3", precision = "fp32";
  std::string out = "accel_bench", hostfile, launcher, launcher_args, bind, step_bench, python, plot_script, device;
  std::optional<int> num_machines, ranks_per_machine, steps, warmup, batch, layers, d_model, heads, seq, vocab;
  bool no_plots = false;
};

// Draws the PNGs from the JSONL; returns an error message, or "" when it worked.
std::string plot(const BenchArgs& a, const std::string& jsonl, const std::string& out_dir) {
  std::string python = a.python.empty() ? std::string(ACCEL_BENCH_PYTHON) : a.python;
  if (python.empty()) python = "/usr/bin/python3";
  const std::string script = a.plot_script.empty() ? std::string(ACCEL_BENCH_PLOT_SCRIPT) : a.plot_script;
  if (script.empty() || access(script.c_str(), R_OK) != 0)
    return fmt::format("the plot script '{}' is missing; pass --plot_script benchmarks/plot_scaling.py", script);
  if (!runnable(python))
    return fmt::format(
        "Python '{}' is not an executable; pass --python PATH to a Python with matplotlib "
        "(scripts/setup.sh installs it in its venv)",
        python);
  const std::string log = out_dir + "/logs/plot.log";
  std::string out;
  const int rc = run_captured({python, script, jsonl, out_dir}, log, out);
  if (rc != 0)
    return fmt::format(
        "plotting failed ({} {} exited with {}; is matplotlib installed in that Python? pass "
        "--python or --no_plots):\n{}",
        python, script, rc, tail_lines(log, 8));
  fmt::print(stderr, "{}", out);
  return "";
}

int run_bench(const BenchArgs& a) {
  BenchRequest req;
  req.ranks = parse_rank_list(a.num_processes);
  req.strategies = parse_strategy_list(a.strategies);
  req.precisions = parse_precision_list(a.precision);
  if (!a.hostfile.empty()) {
    try {
      req.hosts = read_hostfile(a.hostfile);
    } catch (const HostfileError& e) {
      throw BenchError(
          fmt::format("{}; pass --hostfile a file of lines like 'node1 slots=4', or leave --hostfile "
                      "out to run on this machine",
                      e.what()));
    }
    req.hostfile = files::absolute_path(a.hostfile);
  }
  req.num_machines = a.num_machines;
  req.ranks_per_machine = a.ranks_per_machine;
  if (!a.launcher.empty()) req.launch_args.insert(req.launch_args.end(), {"--launcher", a.launcher});
  if (!a.launcher_args.empty()) req.launch_args.insert(req.launch_args.end(), {"--launcher_args", a.launcher_args});
  if (!a.bind.empty()) req.launch_args.insert(req.launch_args.end(), {"--bind", a.bind});

  const std::string self = files::self_exe_path();
  const std::string bin_dir = self.substr(0, self.rfind('/'));
  req.step_bench = a.step_bench.empty() ? bin_dir + "/step_bench" : files::absolute_path(a.step_bench);
  if (!runnable(req.step_bench))
    throw BenchError(
        fmt::format("step_bench not found at {}; build it (cmake --build build --target step_bench) "
                    "or pass --step_bench PATH",
                    req.step_bench));
  const std::vector<std::pair<const char*, const std::optional<int>*>> pass = {
      {"--steps", &a.steps},     {"--warmup", &a.warmup}, {"--batch", &a.batch}, {"--layers", &a.layers},
      {"--d-model", &a.d_model}, {"--heads", &a.heads},   {"--seq", &a.seq},     {"--vocab", &a.vocab}};
  for (const auto& [flag, v] : pass)
    if (*v) req.step_args.insert(req.step_args.end(), {flag, std::to_string(**v)});
  if (!a.device.empty()) req.step_args.insert(req.step_args.end(), {"--device", a.device});

  const std::vector<BenchRun> runs = plan_bench(req);

  files::make_dirs(a.out + "/logs");
  const std::string jsonl = a.out + "/scaling.jsonl";
  std::ofstream(jsonl, std::ios::trunc);  // a fresh report: the records below are this sweep's
  fmt::print(stderr, "accel bench: {} run(s): {} x {} x ranks {}; records in {}\n", runs.size(), a.strategies,
             a.precision, a.num_processes, jsonl);

  pass_signals_to_children();

  std::map<std::string, StepResult> baselines;  // strategy + precision -> the run at the fewest ranks
  int done = 0;
  std::vector<std::string> records;
  std::string failure;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const BenchRun& run = runs[i];
    fmt::print(stderr, "[{}/{}] {} ... ", i + 1, runs.size(), run.label());
    std::fflush(stderr);
    const std::string log = a.out + "/logs/" + run.slug() + ".log";
    std::vector<std::string> argv = launch_argv(req, run);
    argv.insert(argv.begin(), self);
    const auto t0 = std::chrono::steady_clock::now();
    std::string out;
    const int rc = run_captured(argv, log, out);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::optional<StepResult> r;
    std::string why;
    if (interrupted()) {
      fmt::print(stderr, "interrupted ({:.1f} s)\n", secs);
      failure = fmt::format("interrupted by {} during run {}/{} ({}); run again to measure the rest",
                            strsignal(interrupted()), i + 1, runs.size(), run.label());
      break;
    }
    if (rc == 0) {
      try {
        r = parse_step_output(out);
      } catch (const BenchError& e) {
        why = e.what();
      }
    } else {
      why = fmt::format("accel launch exited with code {}", rc);
    }
    if (!r) {
      fmt::print(stderr, "FAILED ({:.1f} s)\n", secs);
      failure = fmt::format(
          "run {}/{} ({}) failed: {}. The last lines of its log ({}; Open MPI's notices left out where a rank said "
          "why):\n{}Fix what the log "
          "names, or leave this "
          "run out (--strategies, --num_processes, --precision).",
          i + 1, runs.size(), run.label(), why, log, tail_lines(log, 12));
      break;
    }
    const std::string key = run.strategy + " " + run.precision;
    if (!baselines.count(key)) baselines[key] = *r;
    const std::string record = bench_record(run, *r, baselines[key]);
    {
      std::ofstream f(jsonl, std::ios::app);
      f << record << "\n";
      f.flush();
      if (!f) throw BenchError(fmt::format("cannot write {}; pass --out a writable directory", jsonl));
    }
    ++done;
    records.push_back(record);
    const double sps = r->get("batch") * r->get("ranks") / (r->get("step_ms") / 1e3);
    const double base_sps =
        baselines[key].get("batch") * baselines[key].get("ranks") / (baselines[key].get("step_ms") / 1e3);
    const double eff = (sps / r->get("ranks")) / (base_sps / baselines[key].get("ranks"));
    const bool node_shared = r->num.count("node_shared_bytes") && r->get("node_shared_bytes") > 0;
    const auto f = traffic_formula(run.strategy, run.precision, r->get("params"), run.ranks, node_shared);
    std::string moved = fmt::format("moved {:.2f} MiB", r->get("moved") / 1048576.0);
    if (f && *f > 0) moved += fmt::format(" = {:.3f} x formula", r->get("moved") / *f);
    fmt::print(stderr, "{:.1f} ms/step, {:.1f} samples/s, efficiency {:.2f}, {} ({:.1f} s)\n", r->get("step_ms"), sps,
               eff, moved, secs);
  }

  if (done > 0) fmt::print("{}", summary_table(records));
  std::string plot_error;
  if (done > 0 && !a.no_plots) plot_error = plot(a, jsonl, a.out);
  if (!failure.empty()) {
    fmt::print(stderr, "accel bench: error: {}\naccel bench: the {} finished run(s) are kept in {}{}\n", failure, done,
               jsonl, done > 0 && !a.no_plots && plot_error.empty() ? " (plotted)" : "");
    if (!plot_error.empty()) fmt::print(stderr, "accel bench: also: {}\n", plot_error);
    return interrupted() ? 128 + interrupted() : 1;
  }
  if (!plot_error.empty()) {
    fmt::print(stderr, "accel bench: error: {}\n", plot_error);
    return 1;
  }
  fmt::print(stderr, "accel bench: {} record(s) in {}{}\n", done, jsonl, a.no_plots ? "" : "; plots in " + a.out);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench", "Scaling report: step_bench through accel launch for strategies x world sizes -> JSONL + PNG plots");
  cmd->add_option("--num_processes,-n", a->num_processes, "World sizes, comma-separated (default 1,2,4)");
  cmd->add_option("--strategies", a->strategies,
                  "step_bench strategies, comma-separated: DDP, ZERO_1, ZERO_2, ZERO_3, FULL_SHARD, SHARD_GRAD_OP, "
                  "NO_SHARD, HYBRID_SHARD (case-insensitive; zero2 works; default DDP,ZERO_2,ZERO_3)");
  cmd->add_option("--precision", a->precision, "fp32, bf16, fp16, fp8, comma-separated (default fp32)");
  cmd->add_option("--out", a->out, "Directory for scaling.jsonl, the PNGs and logs/ (default accel_bench)");
  cmd->add_option("--steps", a->steps, "Measured steps per run (step_bench --steps)")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->warmup, "Unmeasured steps first (step_bench --warmup)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", a->batch, "Sequences per rank per step")->check(CLI::PositiveNumber);
  cmd->add_option("--layers", a->layers, "Model: transformer blocks")->check(CLI::PositiveNumber);
  cmd->add_option("--d_model,--d-model", a->d_model, "Model: width")->check(CLI::PositiveNumber);
  cmd->add_option("--heads", a->heads, "Model: attention heads")->check(CLI::PositiveNumber);
  cmd->add_option("--seq", a->seq, "Model: sequence length")->check(CLI::PositiveNumber);
  cmd->add_option("--vocab", a->vocab, "Model: vocabulary size")->check(CLI::PositiveNumber);
  cmd->add_option("--device", a->device, "cpu or cuda (step_bench's default: cuda where usable)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--hostfile", a->hostfile, "Hosts for accel launch ('host slots=N' lines); runs fill them in order");
  cmd->add_option("--num_machines", a->num_machines, "Machines for every run (default: as many as the hostfile needs)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ranks_per_machine", a->ranks_per_machine,
                  "Fill machines with this many ranks each (default: the hostfile's slots); e.g. under Slurm")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--launcher", a->launcher, "accel launch --launcher: auto, mpirun or srun");
  cmd->add_option("--launcher_args", a->launcher_args, "accel launch --launcher_args, as one string");
  cmd->add_option("--bind", a->bind, "accel launch --bind: auto, core or none");
  cmd->add_option("--step_bench", a->step_bench, "The step_bench binary (default: next to this accel)");
  cmd->add_option("--python", a->python, "Python with matplotlib for the plots (default: the build's ACCEL_PYTHON)");
  cmd->add_option("--plot_script", a->plot_script, "benchmarks/plot_scaling.py (default: the source tree's)");
  cmd->add_flag("--no_plots", a->no_plots, "Write the JSONL only");
  cmd->footer(
      "Each record: strategy, precision, ranks, nodes, params, step_ms, samples_per_s, efficiency (per-rank\n"
      "samples/s against the same strategy's run at the fewest ranks), model_flops and mfu (null where no\n"
      "device peak is known: the CPU), peak bytes by category, model states\n"
      "against the ZeRO formula, bytes moved per rank per step against the ZeRO formula. See\n"
      "docs/performance.md, \"Scaling report: accel bench\".");
  cmd->callback([&exit_code, a] {
    try {
      exit_code = run_bench(*a);
    } catch (const std::exception& e) {
      fmt::print(stderr, "accel bench: error: {}\n", e.what());
      exit_code = 2;
    }
  });
}

}  // namespace accel::cli
