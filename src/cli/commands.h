// accel's subcommands: each registers itself on the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace accel::cli {

// `accel env`: versions, build features, devices, this rank's topology, ACCEL_* variables.
void add_env_command(CLI::App& app, int& exit_code);

}  // namespace accel::cli
