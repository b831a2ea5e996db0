// What every example accepts on its command line, and the loss log the tests compare.
//   --steps N         optimizer steps to run
//   --batch B         global batch (split across the ranks: the same samples per step at any world size)
//   --config_file F   overrides ACCEL_CONFIG_FILE (set by `accel launch`)
//   --log_file F      the main process writes "step <i> loss <x>" per optimizer step
//   --seed S          data order and initial weights
// Checkpoints (as Accelerate's examples do them):
//   --project_dir D             automatic checkpoints go to D/checkpoints/checkpoint_<i>
//   --checkpointing_steps N     save_state every N optimizer steps
//   --total_limit K             keep the newest K automatic checkpoints
//   --resume_from_checkpoint C  load_state(C) first; "latest" = the newest automatic checkpoint
//   --save_state_to D           save_state(D) once training ends (--full_state: rank 0 writes whole tensors)
//   --save_model_to D           save_model(D): the full weights as safetensors, once training ends
#pragma once

#include "accelerator/accelerator.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

namespace accel::examples {

struct ExampleArgs {
  std::int64_t steps = 30;
  std::int64_t batch = 16;
  std::string config_file, log_file;
  std::uint64_t seed = 0;
  std::string project_dir, resume_from_checkpoint, save_state_to, save_model_to;
  std::int64_t checkpointing_steps = 0;
  int total_limit = 0;
  bool full_state = false;
};

inline void add_common_options(CLI::App& app, ExampleArgs& a) {
  app.add_option("--steps", a.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch, "global batch size (split across ranks)")->check(CLI::PositiveNumber);
  app.add_option("--config_file", a.config_file,
                 "accel/Accelerate YAML or DeepSpeed JSON (default: ACCEL_CONFIG_FILE)");
  app.add_option("--log_file", a.log_file, "write 'step <i> loss <x>' lines here (main process)");
  app.add_option("--seed", a.seed, "data order and initial weights");
  app.add_option("--project_dir", a.project_dir, "automatic checkpoints go to PROJECT_DIR/checkpoints/checkpoint_<i>");
  app.add_option("--checkpointing_steps", a.checkpointing_steps, "save_state every N optimizer steps (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--total_limit", a.total_limit, "keep the newest K automatic checkpoints (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume_from_checkpoint", a.resume_from_checkpoint,
                 "load this checkpoint first (\"latest\": the newest in PROJECT_DIR/checkpoints)");
  app.add_option("--save_state_to", a.save_state_to, "save_state to this directory once training ends");
  app.add_flag("--full_state", a.full_state, "with --save_state_to: rank 0 writes every tensor whole");
  app.add_option("--save_model_to", a.save_model_to, "save_model (safetensors) to this directory once training ends");
}

inline AcceleratorOptions accelerator_options(const ExampleArgs& a) {
  AcceleratorOptions o;
  if (!a.config_file.empty()) o.config_file = a.config_file;
  o.project_dir = a.project_dir;
  o.total_limit = a.total_limit;
  return o;
}

// After prepare(): resumes from --resume_from_checkpoint (the loaders continue where they were).
inline void maybe_resume(Accelerator& acc, const ExampleArgs& a) {
  if (a.resume_from_checkpoint.empty()) return;
  acc.load_state(a.resume_from_checkpoint == "latest" ? std::string() : a.resume_from_checkpoint);
  acc.print("resumed from ", a.resume_from_checkpoint, " at step ", acc.step());
}

// Once training ends: --save_state_to, --save_model_to.
template <class M>
void maybe_save_final(Accelerator& acc, M& model, const ExampleArgs& a) {
  if (!a.save_state_to.empty())
    acc.save_state(a.save_state_to, a.full_state ? std::optional<bool>(true) : std::nullopt);
  if (!a.save_model_to.empty()) acc.save_model(model, a.save_model_to);
}

// Before training: --checkpointing_steps and "--resume_from_checkpoint latest" need a project directory
// (--project_dir, or project_dir in the config file: `project_dir`, as the Accelerator resolved it), so
// that a run without one stops at once and not at its first checkpoint.
inline void check_project_dir(const ExampleArgs& a, const std::string& project_dir) {
  if (!project_dir.empty()) return;
  if (a.checkpointing_steps > 0)
    throw std::invalid_argument(
        "--checkpointing_steps saves under PROJECT_DIR/checkpoints: give --project_dir (or project_dir in the "
        "config file)");
  if (a.resume_from_checkpoint == "latest")
    throw std::invalid_argument(
        "--resume_from_checkpoint latest reads PROJECT_DIR/checkpoints: give --project_dir (or project_dir in the "
        "config file)");
}

// After each optimizer step: save_state every --checkpointing_steps steps. A step fp16 skipped
// (an overflow) did not advance acc.step(): the state is the one saved at this count already, or,
// before the first step taken, none worth saving.
inline void maybe_checkpoint(Accelerator& acc, const ExampleArgs& a) {
  if (a.checkpointing_steps > 0 && !acc.optimizer_step_was_skipped() && acc.step() % a.checkpointing_steps == 0)
    acc.save_state();
}

// One line per optimizer step on the main process.
class LossLog {
 public:
  // A resumed run (acc.step() > 0: load_state or auto_resume before this) keeps the earlier run's lines
  // up to its step and drops the rest, as the trackers do, so that a job restarted into the same file
  // leaves every step once.
  LossLog(const Accelerator& acc, const std::string& path) {
    if (acc.is_main_process() && !path.empty()) {
      std::string kept, line;
      if (acc.step() > 0) {
        std::ifstream in(path);
        long long s = 0;
        while (std::getline(in, line))
          if (std::sscanf(line.c_str(), "step %lld", &s) == 1 && s <= acc.step()) kept += line + "\n";
      }
      f_ = std::fopen(path.c_str(), "w");
      if (!f_) throw std::runtime_error("cannot write the loss log " + path);
      std::fputs(kept.c_str(), f_);
      std::fflush(f_);
    }
  }
  ~LossLog() {
    if (f_) std::fclose(f_);
  }
  void write(std::int64_t step, double loss) {
    // %.17g: the exact double, so resumed runs can be compared bit for bit.
    // Flushed: a watcher (tests/checkpoint/resume_checks.sh's restarts) reads the step it has reached.
    if (f_) {
      std::fprintf(f_, "step %lld loss %.17g\n", static_cast<long long>(step), loss);
      std::fflush(f_);
    }
  }

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace accel::examples
