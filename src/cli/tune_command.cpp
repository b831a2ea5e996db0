// `accel tune`: runs the user's program under candidate configurations for a few optimizer steps each
// (through `accel launch`, with ACCEL_TUNE telling the Accelerator to measure and end the run:
// accelerator/tuning.h) and writes the fastest that fits as the config the user then edits. What is
// tried, in which order and what is pruned: cli/tune_plan.h. A first run (the probe) only prepares the
// model, to learn its parameter count and batch.
#include "cli/child_runs.h"
#include "cli/commands.h"
#include "cli/estimate_memory.h"
#include "cli/tune_plan.h"

#include "accelerator/config.h"
#include "base/check_args.h"
#include "base/files.h"
#include "comm/cuda_comm.h"

#include <nlohmann/json.hpp>

#include <fmt/core.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace accel::cli {
namespace {

struct TuneArgs {
  std::string config_file, out = "accel_tuned.yaml", dialect = "accelerate", work_dir, hostfile;
  std::string strategies, micro_batches, bucket_mib, checkpointing = "both", offload;
  std::string batch_args = "--batch {per_step}";
  std::optional<std::string> budget;
  double time_limit_min = 20;
  int warmup = 2, steps = 5, confirm = 3;
  std::optional<int> num_processes, num_machines;
  std::optional<std::int64_t> global_batch;
  bool exhaustive = false;
};

std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep))
    if (!cur.empty()) out.push_back(cur);
  return out;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// ARGS without the flags the tuner sets itself (and their values): --flag VALUE and --flag=VALUE.
std::vector<std::string> without_flags(const std::vector<std::string>& args, const std::vector<std::string>& flags) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const auto& f : flags) {
      if (args[i] == f) {
        drop = true;
        ++i;  // its value
        break;
      }
      if (args[i].rfind(f + "=", 0) == 0) {
        drop = true;
        break;
      }
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

// --batch_args with {micro} (per rank) and {per_step} (micro x ranks) filled in.
std::vector<std::string> batch_words(const std::string& templ, int micro, int ranks) {
  std::vector<std::string> out;
  for (auto w : words(templ)) {
    for (const auto& [key, v] : {std::pair<std::string, int>{"{micro}", micro}, {"{per_step}", micro * ranks}})
      for (std::size_t at; (at = w.find(key)) != std::string::npos;) w.replace(at, key.size(), std::to_string(v));
    out.push_back(w);
  }
  return out;
}

std::optional<nlohmann::json> last_report(const std::string& path) {
  std::ifstream in(path);
  std::optional<nlohmann::json> last;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) last = j;
  }
  return last;
}

bool looks_out_of_memory(const std::string& log, int rc) {
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string t = ss.str();
  return rc == 128 + 9 || t.find("out of memory") != std::string::npos ||
         t.find("can't allocate memory") != std::string::npos || t.find("std::bad_alloc") != std::string::npos;
}

int run_tune(const TuneArgs& a, const std::vector<std::string>& remaining) {
  if (remaining.empty()) throw TuneError("name the program to tune: accel tune [flags] PROGRAM [ARGS...]");
  if (a.dialect != "accelerate" && a.dialect != "deepspeed")
    throw TuneError(fmt::format("--dialect '{}': accelerate (the YAML) or deepspeed (the JSON)", a.dialect));
  if (!(a.time_limit_min > 0)) throw TuneError("--time_limit must be more than 0 minutes");
  // (The first step's time holds whatever the program does between prepare() and it.)
  if (a.warmup < 1 || a.steps < 1) throw TuneError("--warmup and --steps must be >= 1");
  if (a.confirm < 0) throw TuneError("--confirm must be >= 0 (0: measure each candidate once)");
  if (a.checkpointing != "both" && a.checkpointing != "off" && a.checkpointing != "on")
    throw TuneError(fmt::format("--checkpointing '{}': off, on or both", a.checkpointing));
  const std::string program = files::absolute_path(remaining[0]);
  if (!runnable(program)) throw TuneError(fmt::format("{} is not an executable program", remaining[0]));
  const std::vector<std::string> bw = words(a.batch_args);
  std::vector<std::string> strip = {"--config_file"};
  for (const auto& w : bw)
    if (w.rfind("-", 0) == 0) strip.push_back(w);
  const std::vector<std::string> prog_args =
      without_flags(std::vector<std::string>(remaining.begin() + 1, remaining.end()), strip);

  TuneRequest req;
  std::string base_note = "no base config (the defaults)";
  if (!a.config_file.empty()) {
    const AcceleratorConfig base = load_config_file(a.config_file);
    req.precision = to_string(base.mixed_precision);
    req.gradient_clipping = base.gradient_clipping.value_or(0);
    req.num_processes = base.num_processes.value_or(1);
    req.num_machines = base.num_machines.value_or(1);
    base_note =
        fmt::format("base config {} (its mixed_precision {} and gradient clipping kept)", a.config_file, req.precision);
  }
  if (a.num_processes) req.num_processes = *a.num_processes;
  if (a.num_machines) req.num_machines = *a.num_machines;
  if (req.num_processes < 1) req.num_processes = 1;
  if (a.budget) req.budget_bytes = parse_byte_size(*a.budget, "--budget");
  for (const auto& s : split(a.strategies)) req.strategies.push_back(s);
  for (const auto& s : split(a.micro_batches)) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (*end != '\0' || v < 1) throw TuneError(fmt::format("--micro_batches: '{}' is not a batch size (>= 1)", s));
    req.micro_batches.push_back(static_cast<int>(v));
  }
  for (const auto& s : split(a.bucket_mib)) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (*end != '\0' || !(v >= 0)) throw TuneError(fmt::format("--bucket_mib: '{}' is not a size in MiB (>= 0)", s));
    req.bucket_mib.push_back(v);
  }
  if (a.checkpointing == "off") req.checkpointing = {false};
  if (a.checkpointing == "on") req.checkpointing = {true};
  req.offloads = split(a.offload);

  std::string work = a.work_dir;
  if (work.empty()) {
    std::string templ = "/tmp/accel_tune.XXXXXX";
    if (!mkdtemp(templ.data())) throw accel::RuntimeError("cannot make a working directory under /tmp");
    work = templ;
  }
  files::make_dirs(work);
  const std::string self = files::self_exe_path();
  // accel launch ... PROGRAM TAIL (TAIL: the program's arguments).
  auto launch = [&](const std::string& config, const std::vector<std::string>& tail) {
    std::vector<std::string> argv = {self, "launch", "-n", std::to_string(req.num_processes)};
    // (With a hostfile always: a candidate's JSON names no count, so the launcher would spread it over
    // the hostfile's hosts, not the machines the plan is for.)
    if (req.num_machines > 1 || !a.hostfile.empty())
      argv.insert(argv.end(), {"--num_machines", std::to_string(req.num_machines)});
    if (!a.hostfile.empty()) argv.insert(argv.end(), {"--hostfile", a.hostfile});
    if (!config.empty()) argv.insert(argv.end(), {"--config_file", config});
    argv.push_back(program);
    argv.insert(argv.end(), tail.begin(), tail.end());
    return argv;
  };
  auto candidate_args = [&](int micro) {
    std::vector<std::string> tail = prog_args;
    for (const auto& w : batch_words(a.batch_args, micro, req.num_processes)) tail.push_back(w);
    return tail;
  };
  pass_signals_to_children();
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };

  // The probe: the model's size and the program's own batch, under the base config.
  {
    fmt::print(stderr, "accel tune: probing {} at {} rank(s) (logs in {})\n", remaining[0], req.num_processes, work);
    const std::string report = work + "/probe.jsonl", log = work + "/probe.log";
    // The program's own arguments, its batch flags as the user gave them (the probe measures nothing).
    const std::vector<std::string> probe_args =
        launch(a.config_file.empty() ? "" : files::absolute_path(a.config_file),
               without_flags(std::vector<std::string>(remaining.begin() + 1, remaining.end()), {"--config_file"}));
    std::string out;
    std::remove(report.c_str());  // (a --work_dir used before: only this run's report counts)
    const int rc = run_captured(probe_args, log, out, {{"ACCEL_TUNE", "probe,report=" + report}});
    // A dry run (ACCEL_CHECK_ARGS): the program checked its arguments and stopped before the report the
    // candidates are planned from. tune's own options are checked against stand-ins for the report's
    // figures (one parameter, one sample a rank, on a device: every offload allowed); what the
    // candidates change is tune's own (its configs, tested).
    if (check_args::active()) {
      TuneRequest stand_in = req;
      stand_in.params = 1;
      stand_in.device_cuda = true;
      stand_in.global_batch = a.global_batch ? *a.global_batch : req.num_processes;
      (void)with_defaults(stand_in);
      return rc;
    }
    const auto j = last_report(report);
    if (rc != 0 || !j || (*j)["status"] != "probe")
      throw TuneError(
          fmt::format("the probe run of {} did not reach Accelerator::prepare (exit code {}); its log, {}:\n{}",
                      remaining[0], rc, log, tail_lines(log, 12)));
    req.params = (*j)["params"].get<double>();
    req.device_cuda = (*j)["device"].get<std::string>().rfind("cuda", 0) == 0;
    req.global_batch = a.global_batch ? *a.global_batch : (*j)["global_batch"].get<std::int64_t>();
    fmt::print(stderr, "accel tune: {} parameters, global batch {} ({} per rank x {} accumulation x {} ranks), {}\n",
               format_param_count(req.params), req.global_batch, (*j)["micro_batch"].get<long>(),
               (*j)["accumulation"].get<long>(), req.num_processes, (*j)["device"].get<std::string>());
  }

  const TuneRequest full = with_defaults(req);
  TuneSearch search(plan_tune(full));
  const TuneGrid& grid = search.grid();
  fmt::print(stderr, "accel tune: {} candidate(s), {} pruned before running; {} search, time limit {} min\n",
             grid.runnable.size() + grid.pruned.size(), grid.pruned.size(), a.exhaustive ? "exhaustive" : "staged",
             a.time_limit_min);
  std::vector<TuneResult> done;
  std::string stopped;
  int k = 0;
  auto time_left_for_one = [&] {
    double mean_wall = 0;
    for (const auto& d : done) mean_wall += d.wall_s / static_cast<double>(done.size());
    return elapsed() + mean_wall <= a.time_limit_min * 60;
  };
  // One run of a candidate (`what` prefixes its progress line); false when the sweep was interrupted.
  auto run_one = [&](const TuneCandidate& c, const std::string& what) {
    ++k;
    const std::string stem = fmt::format("{}/run{:03d}", work, k);
    const std::string config = stem + (candidate_is_json(c) ? ".json" : ".yaml");
    const std::string body = candidate_config(c, full);
    files::write_file_atomic(config, body.data(), body.size());
    std::string tune_env = fmt::format("warmup={},steps={},report={}.jsonl", a.warmup, a.steps, stem);
    if (full.budget_bytes) tune_env += fmt::format(",budget={:.0f}", *full.budget_bytes);
    fmt::print(stderr, "[{}] {}{} ... ", k, what, c.label());
    std::fflush(stderr);
    const double t0 = elapsed();
    std::string out;
    std::remove((stem + ".jsonl").c_str());
    const int rc =
        run_captured(launch(config, candidate_args(c.micro_batch)), stem + ".log", out, {{"ACCEL_TUNE", tune_env}});
    TuneResult r;
    r.candidate = c;
    r.wall_s = elapsed() - t0;
    if (interrupted()) {
      fmt::print(stderr, "interrupted\n");
      stopped = "interrupted";
      return false;
    }
    const auto j = last_report(stem + ".jsonl");
    if (j && (*j)["status"] == "ok" && rc == 0) {
      r.status = TuneResult::Status::Ok;
      r.step_ms = (*j)["step_ms"].get<double>();
      r.samples_per_s = (*j)["samples_per_s"].get<double>();
      r.peak_bytes = full.device_cuda ? (*j)["device_peak"].get<double>() : (*j)["peak_rss"].get<double>();
      fmt::print(stderr, "{} samples/s, {:.1f} ms a step, peak {:.2f} GB ({:.1f} s)\n", samples_text(r.samples_per_s),
                 r.step_ms, r.peak_bytes / 1e9, r.wall_s);
    } else if (j && (*j)["status"] == "over_budget") {
      r.status = TuneResult::Status::OverBudget;
      r.peak_bytes = (*j)["peak"].get<double>();
      fmt::print(stderr, "over the budget ({:.2f} GB) ({:.1f} s)\n", r.peak_bytes / 1e9, r.wall_s);
    } else if (looks_out_of_memory(stem + ".log", rc)) {
      r.status = TuneResult::Status::OutOfMemory;
      r.detail = fmt::format("exit code {}, log {}.log", rc, stem);
      fmt::print(stderr, "out of memory ({:.1f} s)\n", r.wall_s);
    } else {
      r.status = TuneResult::Status::Failed;
      r.detail = fmt::format("exit code {}, log {}.log", rc, stem);
      fmt::print(stderr, "failed (exit code {}; {}.log)\n", rc, stem);
    }
    done.push_back(r);
    return true;
  };
  std::size_t next_exhaustive = 0;
  for (;;) {
    std::optional<TuneCandidate> c;
    if (a.exhaustive) {
      while (next_exhaustive < grid.runnable.size() && !c) {
        const TuneCandidate& x = grid.runnable[next_exhaustive++];
        if (!search.blocked(x, done)) c = x;  // (a smaller micro batch of its kind did not fit)
      }
    } else {
      c = search.next(done);
    }
    if (!c) break;
    if (!time_left_for_one()) {
      stopped = fmt::format("stopped at the time limit ({} min) with candidates left", a.time_limit_min);
      break;
    }
    if (!run_one(*c, "")) break;
    // Runs that fail for something other than memory, from the start: the program's own problem, which
    // every candidate would meet.
    const bool any_ok =
        std::any_of(done.begin(), done.end(), [](const TuneResult& d) { return d.status == TuneResult::Status::Ok; });
    if (!any_ok && done.size() >= 3 && std::all_of(done.end() - 3, done.end(), [](const TuneResult& d) {
          return d.status == TuneResult::Status::Failed;
        })) {
      stopped = "stopped after 3 failed runs in a row";
      fmt::print(stderr, "accel tune: 3 runs in a row failed; the last one's log ({}/run{:03d}.log):\n{}", work, k,
                 tail_lines(fmt::format("{}/run{:03d}.log", work, k), 12));
      break;
    }
  }
  // The fastest few measured again (tune_plan.h: confirm_candidates), fastest first.
  int confirmed = 0;
  std::string confirm_note;
  if (stopped.empty() && a.confirm > 0) {
    const std::vector<TuneCandidate> again = confirm_candidates(done, a.confirm);
    if (!again.empty())
      fmt::print(stderr, "accel tune: measuring the {} fastest (within {:.0f}% of the best) once more\n", again.size(),
                 100 * kConfirmWithin);
    for (const auto& c : again) {
      if (!time_left_for_one()) {
        confirm_note = "; the time limit cut the second measurement short";
        break;
      }
      if (!run_one(c, "again: ")) break;
      ++confirmed;
    }
  }

  const std::vector<TuneResult> order = ranked(merged(done));
  fmt::print("\n{}", tune_table(order, grid, full));
  if (order.empty() || order.front().status != TuneResult::Status::Ok) {
    fmt::print(stderr, "accel tune: no candidate fits and runs{}; logs in {}\n",
               stopped.empty() ? "" : " (" + stopped + ")", work);
    return 1;
  }
  const TuneResult& best = order.front();
  std::vector<std::string> how;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&now));
  std::string cmdline = remaining[0];
  for (const auto& w : prog_args) cmdline += " " + w;
  how.push_back(fmt::format("Chosen by accel tune, {}: the fastest of {} measured candidate(s) of {} at {} rank(s)",
                            date, order.size(), cmdline, full.num_processes));
  how.push_back(
      fmt::format("({} warm-up + {} measured optimizer steps a run; {} search; {} of {} candidates pruned "
                  "before running; {}{}; {:.0f} s of a {} min limit{}).",
                  a.warmup, a.steps, a.exhaustive ? "exhaustive" : "staged", grid.pruned.size(),
                  grid.pruned.size() + grid.runnable.size(),
                  confirmed > 0 ? fmt::format("the {} fastest measured twice, ranked by the mean", confirmed)
                                : std::string("each measured once"),
                  confirm_note, elapsed(), a.time_limit_min, stopped.empty() ? "" : "; " + stopped));
  how.push_back(fmt::format("Winner: {}: {} samples/s, {:.1f} ms a step, peak {:.2f} GB per rank ({} run(s)).",
                            best.candidate.label(), samples_text(best.samples_per_s), best.step_ms,
                            best.peak_bytes / 1e9, best.runs));
  if (order.size() > 1 && order[1].status == TuneResult::Status::Ok)
    how.push_back(
        fmt::format("Runner-up: {}: {} samples/s.", order[1].candidate.label(), samples_text(order[1].samples_per_s)));
  std::string bws;
  for (const auto& w : batch_words(a.batch_args, best.candidate.micro_batch, full.num_processes)) bws += " " + w;
  how.push_back(fmt::format(
      "Run the program with{} (micro batch {} per rank x accumulation {} x {} ranks = global "
      "batch {}); {}.",
      bws, best.candidate.micro_batch, best.candidate.accumulation, full.num_processes, full.global_batch, base_note));
  std::string written;
  files::make_dirs(files::parent_dir(a.out));  // (a search's result is never lost to a missing directory)
  if (a.dialect == "deepspeed") {
    const std::string json = winner_deepspeed(best.candidate, full, how);
    files::write_file_atomic(a.out, json.data(), json.size());
    written = a.out;
  } else {
    const std::string json_path = files::without_extension(a.out) + ".json";
    const WinnerFiles w = winner_accelerate(best.candidate, full, files::absolute_path(json_path), how);
    if (!w.json.empty()) files::write_file_atomic(json_path, w.json.data(), w.json.size());
    files::write_file_atomic(a.out, w.yaml.data(), w.yaml.size());
    written = a.out + (w.json.empty() ? "" : " and " + json_path);
  }
  load_config_file(a.out);  // what it wrote loads (a bug here must not hand the user a broken file)
  fmt::print("\naccel tune: wrote {}\n", written);
  for (const auto& l : how) fmt::print("  {}\n", l);
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TuneArgs>();
  auto* cmd = app.add_subcommand(
      "tune", "Measure candidate configurations of a program for a few steps each and write the fastest that fits");
  cmd->add_option("--config_file", a->config_file,
                  "Base config: its mixed_precision, gradient clipping and process count are kept");
  cmd->add_option(
      "--budget", a->budget,
      "Memory per rank (\"24GB\"; the device's on a GPU, the host's on a CPU run): candidates whose model "
      "states estimate-memory puts over it are not run, and a run whose peak passes it ends as not fitting");
  cmd->add_option("--time_limit", a->time_limit_min, "Minutes for the whole search [20]");
  cmd->add_option("--num_processes,-n", a->num_processes, "Ranks (default: the base config's, else 1)");
  cmd->add_option("--num_machines", a->num_machines, "Machines (HYBRID_SHARD is tried with several)");
  cmd->add_option("--hostfile", a->hostfile, "Passed to accel launch");
  cmd->add_option("--global_batch", a->global_batch,
                  "Samples per optimizer step, kept by every candidate (default: what the program does by itself)");
  cmd->add_option("--strategies", a->strategies, "Comma-separated (default: DDP,ZERO_1,ZERO_2,ZERO_3[,HYBRID_SHARD])");
  cmd->add_option("--micro_batches", a->micro_batches, "Per rank, comma-separated (default: 1, 2, 4, ... that divide)");
  cmd->add_option("--bucket_mib", a->bucket_mib, "Reduce bucket sizes in MiB, comma-separated [25]");
  cmd->add_option("--checkpointing", a->checkpointing, "Activation checkpointing: off, on or both [both]");
  cmd->add_option("--offload", a->offload,
                  "none, optimizer, optimizer+params, comma-separated (default: all on a GPU, none on the CPU)");
  cmd->add_option("--batch_args", a->batch_args,
                  "How the program is told its batch: {micro} is the micro batch per rank, {per_step} that times the "
                  "ranks [\"--batch {per_step}\"]");
  cmd->add_option("--warmup", a->warmup, "Unmeasured optimizer steps per run, >= 1 [2]");
  cmd->add_option("--steps", a->steps, "Measured optimizer steps per run [5]");
  cmd->add_option("--confirm", a->confirm,
                  "Measure this many of the fastest (those within 10% of the best) once more and rank by the mean "
                  "(0: no second measurement) [3]");
  cmd->add_flag("--exhaustive", a->exhaustive, "Run every candidate that is not pruned (to compare with the search)");
  cmd->add_option("--out", a->out, "The config to write [accel_tuned.yaml]");
  cmd->add_option("--dialect", a->dialect, "accelerate (the YAML) or deepspeed (the JSON) [accelerate]");
  cmd->add_option("--work_dir", a->work_dir, "Where each run's config, report and log go (default: a new /tmp dir)");
  cmd->prefix_command();  // everything from PROGRAM on belongs to PROGRAM
  cmd->footer(
      "PROGRAM [ARGS...] follow the flags: a program that trains through accel::Accelerator (prepare, then\n"
      "the prepared optimizer's step); it needs nothing else. Its --config_file and batch flags are set\n"
      "by the tuner.");
  cmd->callback([&exit_code, a, cmd] {
    try {
      exit_code = run_tune(*a, cmd->remaining());
    } catch (const std::exception& e) {
      fmt::print(stderr, "accel tune: error: {}\n", e.what());
      exit_code = 2;
    }
  });
}

}  // namespace accel::cli
