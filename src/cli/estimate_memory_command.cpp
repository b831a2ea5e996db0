// `accel estimate-memory` (being written).
#include "cli/commands.h"

#include <cstdio>

namespace accel::cli {

void add_estimate_memory_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("estimate-memory", "(not written yet)");
  cmd->allow_extras();
  cmd->callback([&exit_code] {
    std::fprintf(stderr, "accel estimate-memory: not written yet\n");
    exit_code = 1;
  });
}

}  // namespace accel::cli
