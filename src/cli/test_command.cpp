// `accel test [--config_file F] [--num_processes N] [--check NAME]...`: the conformance program
// (cli/conformance.h) under a config, as `accelerate test` does.
//
// Run by a user (no launcher around it), it validates the config, then replaces itself with
//   accel launch [--config_file F] [--num_processes N] <this accel> test [--config_file F] --worker
// so the ranks start as any training job's do. The hidden --worker path (also taken when already
// under mpirun/srun) runs the checks on every rank; rank 0 prints the pass/fail table; every rank
// exits 1 when any check failed on any rank.
#include "cli/commands.h"

#include "accelerator/accelerator.h"
#include "base/env.h"
#include "base/error.h"
#include "base/files.h"
#include "cli/conformance.h"
#include "cli/launch_plan.h"
#include "cli/paths.h"
#include "comm/communicator.h"
#include "zero/spec.h"

#include <fmt/core.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <unistd.h>

namespace accel::cli {
namespace {

struct TestArgs {
  std::string config_file;
  int num_processes = 0;  // 0: the launcher decides (the config's, then 1)
  std::vector<std::string> checks;
  bool worker = false;
  std::string inject_failure;
};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Started by mpirun / srun (PMIx or PMI): the ranks already exist.
bool under_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (!env_or_empty(v).empty()) return true;
  return false;
}

// The config: --config_file, else ACCEL_CONFIG_FILE, else the default config if it exists ("": defaults).
std::string pick_config(const TestArgs& a) {
  std::string config = a.config_file;
  if (config.empty()) config = env::get("ACCEL_CONFIG_FILE");
  if (config.empty() && files::is_file(default_config_path())) config = default_config_path();
  return config;
}

// The user's path: pick and validate the config, then exec `accel launch ... accel test --worker`.
int run_user(const TestArgs& a) {
  std::string config = pick_config(a);
  try {
    if (!config.empty()) load_config_file(config);  // parses; ConfigError names the file and the key
    ConfigOverrides ov;                             // the ACCEL_* environment on top of it
    if (!config.empty()) ov.config_file = config;
    resolve_config(ov);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel test: error: %s\n", e.what());
    return 1;
  }
  if (!config.empty()) config = files::absolute_path(config);

  const std::string self = files::self_exe_path();
  std::vector<std::string> argv{self, "launch"};
  if (!config.empty()) argv.insert(argv.end(), {"--config_file", config});
  if (a.num_processes > 0) argv.insert(argv.end(), {"--num_processes", std::to_string(a.num_processes)});
  argv.insert(argv.end(), {self, "test"});
  if (!config.empty()) argv.insert(argv.end(), {"--config_file", config});
  for (const auto& c : a.checks) argv.insert(argv.end(), {"--check", c});
  if (!a.inject_failure.empty()) argv.insert(argv.end(), {"--inject_failure", a.inject_failure});
  argv.push_back("--worker");

  std::printf("accel test: %s\n", config.empty() ? "no config file (defaults)" : config.c_str());
  std::printf("accel test: running %s\n", shell_join(argv).c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<char*> cargv;
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  ::execv(self.c_str(), cargv.data());
  std::fprintf(stderr, "accel test: error: cannot run %s: %s\n", self.c_str(), std::strerror(errno));
  return 1;
}

// On every rank: the checks, the table on rank 0, and the agreed exit code.
int run_worker(const TestArgs& a) {
  conformance::Options o;
  if (!a.config_file.empty()) o.accelerator.config_file = a.config_file;
  o.inject_failure = a.inject_failure;
  std::string header;
  try {
    Accelerator acc(o.accelerator);  // reports the ignored keys once; a bad config fails here
    const AcceleratorConfig& c = acc.config();
    const int g = c.spec.groups_of_ranks();
    const std::string groups = g > 0 ? fmt::format(" in shard groups of {} rank(s)", g)
                               : c.spec.groups_by_node() && !c.spec.hybrid() ? " in shard groups of a node's ranks"
                                                                             : "";
    header = fmt::format("accel test: {}: {} ({}{}), {} process(es) on {}, mixed_precision {}",
                         c.source.empty() ? std::string("no config file (defaults)") : c.source,
                         to_string(c.distributed_type), zero::to_string(c.spec.strategy), groups, acc.num_processes(),
                         acc.device().str(), to_string(c.mixed_precision));
  } catch (const std::exception& e) {
    if (comm::Communicator::world()->rank() == 0) std::fprintf(stderr, "accel test: error: %s\n", e.what());
    return 1;
  }
  const bool is_main = comm::Communicator::world()->rank() == 0;
  if (is_main) {
    std::printf("%s\n", header.c_str());
    std::fflush(stdout);
  }
  conformance::Report report = conformance::run_all(o, a.checks);
  if (is_main) {
    std::printf("%s", conformance::format_report(report).c_str());
    std::fflush(stdout);
  }
  return report.all_passed() ? 0 : 1;
}

}  // namespace

void add_test_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TestArgs>();
  auto* cmd =
      app.add_subcommand("test", "Run the conformance checks under a config on its ranks and print a pass/fail table");
  cmd->add_option("--config_file", args->config_file,
                  "accel/Accelerate YAML or DeepSpeed JSON (default: ACCEL_CONFIG_FILE, then the default "
                  "config if it exists, else defaults on 1 process)");
  cmd->add_option("--num_processes", args->num_processes, "ranks to start (default: the config's, then 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--check", args->checks, "run only this check (repeatable)")
      ->check(CLI::IsMember(conformance::check_names()));
  // Hidden: the path `accel launch` runs on every rank, and a deliberate failure for the tests.
  cmd->add_flag("--worker", args->worker)->group("");
  cmd->add_option("--inject_failure", args->inject_failure)
      ->check(CLI::IsMember(conformance::check_names()))
      ->group("");
  cmd->callback([args, &exit_code] {
    try {
      if (!args->worker && under_launcher()) {
        // Started by mpirun / srun directly: the ranks exist; the config is picked as on the user's path.
        const int n = comm::Communicator::world()->size();
        if (args->num_processes > 0 && args->num_processes != n)
          throw accel::InvalidArgumentError(fmt::format(
              "--num_processes {} but the launcher started {} rank(s): start them with the launcher's own count "
              "(or run `accel test` without mpirun/srun)",
              args->num_processes, n));
        TestArgs a = *args;
        a.config_file = pick_config(a);
        exit_code = run_worker(a);
        return;
      }
      exit_code = args->worker ? run_worker(*args) : run_user(*args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "accel test: error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace accel::cli
