// `accel config` (being written).
#include "cli/commands.h"

#include <cstdio>

namespace accel::cli {

void add_config_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("config", "(not written yet)");
  cmd->allow_extras();
  cmd->callback([&exit_code] {
    std::fprintf(stderr, "accel config: not written yet\n");
    exit_code = 1;
  });
}

}  // namespace accel::cli
