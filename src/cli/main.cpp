// build/bin/accel — the command-line entry point.
#include "base/check_args.h"
#include "cli/commands.h"

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  accel::check_args::started(argc, argv);
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
  accel::cli::add_merge_weights_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel: error: %s\n", e.what());
    return 1;
  }
  // (ACCEL_CHECK_ARGS: the command ran as usual, its own programs checking theirs; 0 is a pass.)
  if (exit_code == 0) accel::check_args::passed();
  return exit_code;
}
