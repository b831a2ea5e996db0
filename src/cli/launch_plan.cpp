#include "cli/launch_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace accel::cli {
namespace {

std::string quote(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
                        std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Does the user's --launcher_args already say where ranks run (mapping, binding, cpu sets)?
bool places_ranks(const std::vector<std::string>& args) {
  for (const auto& a : args)
    for (const char* f : {"bind-to", "map-by", "cpus-per-", "cpu-set", "rankfile"})
      if (a.find(f) != std::string::npos) return true;
  return false;
}

// Binding and threads for k ranks per machine (see launch_plan.h, "Cores").
void plan_cores(const LaunchRequest& r, LaunchPlan& p) {
  if (r.bind != "auto" && r.bind != "core" && r.bind != "none")
    throw LaunchError(fmt::format("--bind must be auto, core or none, got '{}'", r.bind));
  const int cores = std::max(1, r.cores_per_machine), k = p.per_machine;
  const int share = std::max(1, cores / k);
  for (const auto& [key, v] : r.env)
    if (key == "OMP_NUM_THREADS") {
      p.threads_from_user = true;
      p.threads_per_rank = std::atoi(v.c_str());
    }
  if (!p.threads_from_user) p.threads_per_rank = share;
  if (p.launcher == "srun") {
    if (r.bind != "auto")
      throw LaunchError(
          fmt::format("--bind {} is for mpirun; under srun, Slurm binds the ranks (give srun's own "
                      "--cpu-bind through --launcher_args)",
                      r.bind));
    p.binding = "slurm";
    if (!p.threads_from_user) p.threads_per_rank = 0;
    return;
  }
  if (places_ranks(r.launcher_args)) {
    p.binding = "launcher_args";
  } else if (k > cores) {
    if (r.bind == "core")
      throw LaunchError(fmt::format("--bind core needs at most {} ranks per machine (its cores), got {}", cores, k));
    p.binding = "none";
    p.bind_args = {"--bind-to", "none"};
  } else if (r.bind == "none") {
    p.binding = "none";
    p.bind_args = {"--bind-to", "none"};
  } else {
    p.binding = "core";
    p.cores_per_rank = share;
    p.bind_args = {"--map-by", fmt::format("ppr:{}:node:PE={}", k, share), "--bind-to", "core"};
  }
  if (!p.threads_from_user) p.bind_args.insert(p.bind_args.end(), {"-x", fmt::format("OMP_NUM_THREADS={}", share)});
}

void require_positive(const std::optional<int>& v, const char* what) {
  if (v && *v < 1) throw LaunchError(fmt::format("{} must be at least 1, got {}", what, *v));
}

}  // namespace

std::vector<std::string> split_shell_words(const std::string& text) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) out.push_back(word);
      word.clear();
      in_word = false;
    } else if (c == '\'') {
      const std::size_t end = text.find('\'', i + 1);
      if (end == std::string::npos) throw LaunchError(fmt::format("--launcher_args: unterminated ' in: {}", text));
      word += text.substr(i + 1, end - i - 1);
      i = end;
      in_word = true;
    } else if (c == '"') {
      std::size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() && std::string("\"\\$`").find(text[j + 1]) != std::string::npos)
          ++j;  // \" \\ \$ \` inside double quotes: the character itself
        word += text[j];
      }
      if (j >= text.size()) throw LaunchError(fmt::format("--launcher_args: unterminated \" in: {}", text));
      i = j;
      in_word = true;
    } else if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
      in_word = true;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) out.push_back(word);
  return out;
}

std::vector<std::string> without_placement_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (places_ranks({args[i]}) || args[i] == "-npernode" || args[i] == "--npernode" || args[i] == "-N") {
      if (args[i].find('=') == std::string::npos && i + 1 < args.size() && args[i + 1].rfind("-", 0) != 0) ++i;
      continue;
    }
    out.push_back(args[i]);
  }
  return out;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& w : argv) s += fmt::format("{}{}", s.empty() ? "" : " ", quote(w));
  return s;
}

LaunchPlan plan_launch(const LaunchRequest& r) {
  if (r.program.empty()) throw LaunchError("no program given: accel launch [flags] PROGRAM [ARGS...]");
  require_positive(r.num_processes, "--num_processes");
  require_positive(r.num_machines, "--num_machines");
  require_positive(r.config_num_processes, "num_processes in the config file");
  require_positive(r.config_num_machines, "num_machines in the config file");

  LaunchPlan p;
  const bool have_hosts = !r.hosts.empty();
  if (r.launcher == "auto") {
    p.launcher = r.in_slurm && !have_hosts ? "srun" : "mpirun";
  } else if (r.launcher == "mpirun" || r.launcher == "srun") {
    p.launcher = r.launcher;
  } else {
    throw LaunchError(fmt::format("--launcher must be auto, mpirun or srun, got '{}'", r.launcher));
  }
  if (p.launcher == "srun" && have_hosts)
    throw LaunchError("--hostfile is for mpirun; under srun, Slurm's allocation decides the hosts");
  if (p.launcher == "srun" && !r.in_slurm)
    throw LaunchError(
        "--launcher srun needs a Slurm allocation (SLURM_JOB_ID is not set); use salloc/sbatch, or mpirun");

  p.num_machines = r.num_machines          ? *r.num_machines
                   : r.config_num_machines ? *r.config_num_machines
                   : have_hosts            ? static_cast<int>(r.hosts.size())
                                           : 1;
  // From a hostfile: the hosts used (the first num_machines) each take as many ranks as the one with
  // the fewest slots has, so that the ranks spread evenly.
  int slots_per_machine = 0;
  for (int m = 0; m < std::min<int>(p.num_machines, static_cast<int>(r.hosts.size())); ++m)
    slots_per_machine = m == 0 ? r.hosts[m].slots : std::min(slots_per_machine, r.hosts[m].slots);
  p.num_processes = r.num_processes          ? *r.num_processes
                    : r.config_num_processes ? *r.config_num_processes
                    : have_hosts             ? slots_per_machine * p.num_machines
                                             : 1;
  if (p.num_processes % p.num_machines != 0)
    throw LaunchError(
        fmt::format("{} processes do not spread evenly over {} machines (num_processes is the total over "
                    "all machines)",
                    p.num_processes, p.num_machines));
  p.per_machine = p.num_processes / p.num_machines;

  if (p.launcher == "mpirun" && p.num_machines > 1 && !have_hosts)
    throw LaunchError(fmt::format(
        "{} machines need --hostfile (lines like 'node1 slots=4'), or run inside a Slurm allocation", p.num_machines));
  if (have_hosts) {
    if (p.num_machines > static_cast<int>(r.hosts.size()))
      throw LaunchError(fmt::format("{} machines requested but hostfile {} lists only {}", p.num_machines, r.hostfile,
                                    r.hosts.size()));
    for (int m = 0; m < p.num_machines; ++m) {
      const auto& h = r.hosts[m];
      if (h.slots < p.per_machine)
        throw LaunchError(
            fmt::format("{} processes on {} machine(s) need {} slots per host, but '{}' in {} has slots={}",
                        p.num_processes, p.num_machines, p.per_machine, h.host, r.hostfile, h.slots));
      p.machines.push_back({h.host, p.per_machine});
    }
  }

  p.env = r.env;
  plan_cores(r, p);
  auto& a = p.argv;
  const std::string nodes = std::to_string(p.num_machines);
  auto rank_command = [&](std::optional<int> node_rank) {
    a.push_back(r.rank_wrapper);
    if (node_rank) a.insert(a.end(), {"--node_rank", std::to_string(*node_rank)});
    a.insert(a.end(), {"--num_nodes", nodes, "--"});
    a.insert(a.end(), r.program.begin(), r.program.end());
  };
  if (p.launcher == "srun") {
    // --quit-on-interrupt: one Ctrl-C ends the job (srun's first SIGINT otherwise only reports the tasks).
    a = {r.srun,
         "--ntasks=" + std::to_string(p.num_processes),
         "--nodes=" + nodes,
         "--ntasks-per-node=" + std::to_string(p.per_machine),
         "--kill-on-bad-exit=1",
         "--quit-on-interrupt"};
    a.insert(a.end(), r.launcher_args.begin(), r.launcher_args.end());
    rank_command(std::nullopt);
    return p;
  }
  a = {r.mpirun, "--oversubscribe"};
  if (r.as_root) a.push_back("--allow-run-as-root");  // (as torchrun and Accelerate run as root in containers)
  a.insert(a.end(), p.bind_args.begin(), p.bind_args.end());
  for (const auto& [k, v] : r.env) a.insert(a.end(), {"-x", k + "=" + v});
  a.insert(a.end(), r.launcher_args.begin(), r.launcher_args.end());
  if (!have_hosts) {
    a.insert(a.end(), {"-np", std::to_string(p.num_processes)});
    rank_command(0);
    return p;
  }
  for (int m = 0; m < p.num_machines; ++m) {
    if (m > 0) a.push_back(":");
    const std::string k = std::to_string(p.per_machine);
    a.insert(a.end(), {"-np", k, "--host", p.machines[m].host + ":" + k});
    rank_command(m);
  }
  return p;
}

}  // namespace accel::cli
