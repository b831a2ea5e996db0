// `accel config`: the questionnaire (answers on stdin), `accel config default` (no questions),
// `accel config explain FILE` and `accel config keys` (the key table of both dialects). Written files
// go to --config_file, else the default location (cli/paths.h), through a temporary file renamed into
// place; each is parsed back before it is kept.
#include "cli/commands.h"
#include "cli/config_explain.h"
#include "cli/config_questions.h"
#include "cli/paths.h"

#include "accelerator/config.h"
#include "accelerator/config_keys.h"
#include "base/error.h"
#include "base/files.h"
#include "comm/transport/nccl/nccl_backend.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include <iostream>
#include <optional>
#include <stdexcept>

namespace accel::cli {
namespace {

// Parses the YAML back (a questionnaire bug must not leave a broken file), then writes it atomically.
AcceleratorConfig write_config(const std::string& path, const std::string& yaml) {
  const std::string dir = files::parent_dir(path);
  AcceleratorConfig cfg = parse_accelerate_yaml(yaml, path, dir);
  if (dir != ".") files::make_dirs(dir);
  files::write_file_atomic(path, yaml.data(), yaml.size());
  return cfg;
}

struct ConfigArgs {
  std::string config_file;
  std::string mixed_precision = "no";
  bool force = false;
  std::string explain_file;
  std::optional<int> num_processes, num_machines;
  std::string keys_dialect;
  bool keys_markdown = false;
};

}  // namespace

void add_config_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ConfigArgs>();
  auto* cmd = app.add_subcommand("config", "Write a config by answering questions (or: default, explain FILE, keys)");
  cmd->add_option(
      "--config_file", a->config_file,
      fmt::format("Where to write it, or with explain the file to explain (default: {})", default_config_path()));
  cmd->callback([&exit_code, a, cmd] {
    if (!cmd->get_subcommands().empty()) return;  // `default` or `explain` ran
    try {
      const std::string path = a->config_file.empty() ? default_config_path() : a->config_file;
      const ConfigAnswers answers = ask_config_questions(std::cin, std::cout, comm::cuda_device_count());
      const AcceleratorConfig cfg = write_config(path, config_yaml(answers));
      fmt::print("\naccel config: wrote {}\n\n{}", path, explain_config(cfg));
      exit_code = 0;
    } catch (const std::exception& e) {
      fmt::print(stderr, "\naccel config: error: {}\n", e.what());
      exit_code = 1;
    }
  });

  auto* def = cmd->add_subcommand("default", "Write a sensible config without questions (refuses to overwrite)");
  def->add_option("--config_file", a->config_file,
                  fmt::format("Where to write it (default: {})", default_config_path()));
  def->add_option("--mixed_precision", a->mixed_precision, "no, fp16, bf16 or fp8")
      ->check(CLI::IsMember({"no", "fp16", "bf16", "fp8"}));
  def->add_flag("--force", a->force, "Overwrite an existing file");
  def->callback([&exit_code, a] {
    try {
      const std::string path = a->config_file.empty() ? default_config_path() : a->config_file;
      if (!a->force && access(path.c_str(), F_OK) == 0) {
        fmt::print(stderr, "accel config default: {} exists; left as it is (use --force to overwrite)\n", path);
        exit_code = 1;
        return;
      }
      const AcceleratorConfig cfg =
          write_config(path, config_yaml(default_answers(comm::cuda_device_count(), a->mixed_precision)));
      fmt::print("accel config default: wrote {}\n\n{}", path, explain_config(cfg));
      exit_code = 0;
    } catch (const std::exception& e) {
      fmt::print(stderr, "accel config default: error: {}\n", e.what());
      exit_code = 1;
    }
  });

  auto* ex = cmd->add_subcommand("explain", "Say what a config (Accelerate YAML or DeepSpeed JSON) will do");
  ex->add_option(
      "file", a->explain_file,
      fmt::format("The config file (default: accel config's --config_file, else {})", default_config_path()));
  ex->add_option("--num_processes", a->num_processes, "Explain it for this many ranks (default: the file's)")
      ->check(CLI::PositiveNumber);
  ex->add_option("--num_machines", a->num_machines, "... on this many machines (default: the file's)")
      ->check(CLI::PositiveNumber);
  ex->callback([&exit_code, a] {
    try {
      // The file: explain's own argument, else `accel config --config_file F explain`'s, else the default.
      if (!a->explain_file.empty() && !a->config_file.empty() && a->explain_file != a->config_file)
        throw accel::InvalidArgumentError(
            fmt::format("two files to explain ({} and --config_file {}): give one", a->explain_file, a->config_file));
      const std::string path = !a->explain_file.empty()  ? a->explain_file
                               : !a->config_file.empty() ? a->config_file
                                                         : default_config_path();
      const AcceleratorConfig cfg = load_config_file(path);
      fmt::print("{}", explain_config(cfg, a->num_processes, a->num_machines));
      exit_code = 0;
    } catch (const std::exception& e) {
      fmt::print(stderr, "accel config explain: error: {}\n", e.what());
      exit_code = 1;
    }
  });

  auto* keys = cmd->add_subcommand("keys", "Print every key of both config dialects: type, default, values, meaning");
  keys->add_option("--dialect", a->keys_dialect, "Only this dialect: accelerate (the YAML) or deepspeed (the JSON)")
      ->check(CLI::IsMember({"accelerate", "deepspeed"}));
  keys->add_flag("--markdown", a->keys_markdown, "Write docs/configuration.md's text (both dialects)");
  keys->callback([&exit_code, a] {
    if (a->keys_markdown && !a->keys_dialect.empty()) {
      fmt::print(stderr, "accel config keys: --markdown writes both dialects; leave out --dialect\n");
      exit_code = 2;
      return;
    }
    std::optional<config_keys::Dialect> only;
    if (a->keys_dialect == "accelerate") only = config_keys::Dialect::Accelerate;
    if (a->keys_dialect == "deepspeed") only = config_keys::Dialect::DeepSpeed;
    fmt::print("{}", a->keys_markdown ? config_keys::markdown() : config_keys::text(only));
    exit_code = 0;
  });
}

}  // namespace accel::cli
