// build/bin/accel — the command-line entry point.
#include "cli/commands.h"

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  CLI::App app{"accel: sharded training on libtorch (DDP, ZeRO-1/2/3, FSDP)"};
  app.require_subcommand(1);
  int exit_code = 0;
  accel::cli::add_config_command(app, exit_code);
  accel::cli::add_launch_command(app, exit_code);
  accel::cli::add_env_command(app, exit_code);
  accel::cli::add_test_command(app, exit_code);
  accel::cli::add_estimate_memory_command(app, exit_code);
  accel::cli::add_bench_command(app, exit_code);
  accel::cli::add_tune_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel: error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
