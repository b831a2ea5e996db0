// accel's subcommands: each registers itself on the CLI11 app and runs when chosen, setting
// `exit_code` to what the process should return.
#pragma once

#include <CLI/CLI.hpp>

namespace accel::cli {

// `accel env`: versions, build features, devices, this rank's topology, ACCEL_* variables.
void add_env_command(CLI::App& app, int& exit_code);

// `accel config` (questionnaire), `accel config default`, `accel config explain FILE`.
void add_config_command(CLI::App& app, int& exit_code);

// `accel launch [flags] PROGRAM [ARGS...]`: starts the ranks with mpirun or srun.
void add_launch_command(CLI::App& app, int& exit_code);

// `accel test [--config_file F]`: the built-in conformance program under a config.
void add_test_command(CLI::App& app, int& exit_code);

// `accel estimate-memory --params P ...`: per-rank memory of DDP and ZeRO-1/2/3 from the ZeRO formulas.
void add_estimate_memory_command(CLI::App& app, int& exit_code);

// `accel bench --num_processes 1,2,4 --strategies DDP,ZERO_3 --out DIR`: the scaling report (step_bench
// through accel launch per run; JSONL + PNG plots).
void add_bench_command(CLI::App& app, int& exit_code);

// `accel tune [--budget GB] [--time_limit MIN] PROGRAM ARGS...`: measures candidate configurations of the
// program (cli/tune_plan.h says which, in which order) and writes the fastest that fits.
void add_tune_command(CLI::App& app, int& exit_code);

// `accel merge-weights CHECKPOINT_DIR OUTPUT_DIR [--dtype] [--max_shard_size]`: a save_state checkpoint to
// the model's full weights as Hugging Face safetensors, offline (checkpoint/merge_weights.h).
void add_merge_weights_command(CLI::App& app, int& exit_code);

}  // namespace accel::cli
