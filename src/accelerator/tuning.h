// accel::TuneRun — the Accelerator's side of `accel tune` (cli/tune_plan.h). A run started with
// ACCEL_TUNE set measures itself and ends; the program needs nothing for it (the hook sits in
// prepare() and in the prepared optimizer's step):
//   ACCEL_TUNE=probe,report=PATH
//       prepare() writes the model's parameter count, the micro batch, the world size and the device
//       to PATH (one JSON line, main process) and ends the process (exit code 0) before any step;
//   ACCEL_TUNE=warmup=W,steps=S,report=PATH[,budget=BYTES]
//       after W unmeasured (W >= 1: the first step's time holds whatever the program does after
//       prepare()) and S measured optimizer steps, the main process writes one JSON line to
//       PATH: the median step time (rank 0's clock), samples per second (the global batch over the
//       median), the peak memory (the largest over ranks: resident set, the counting allocator's
//       peak over the measured steps, the device's caching allocator peak), the parameter count and the
//       ranks and nodes it ran on;
//       then every rank ends (exit code 0). With a budget, a step after which some rank's resident
//       peak is over it ends the run at once with {"status": "over_budget"} and exit code 3.
// Every rank agrees on when to end (one all-reduce per step).
#pragma once

#include "comm/communicator.h"

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel {

struct TuneSpec {
  bool probe = false;
  int warmup = 2, steps = 5;
  std::string report;
  double budget_bytes = 0;  // 0: none
};
// ACCEL_TUNE, parsed; nullopt when unset. Throws ConfigError naming the part that does not parse.
std::optional<TuneSpec> tune_spec_from_env();
// TuneSpec from its text (the same rules; `where` names it in errors).
TuneSpec parse_tune_spec(const std::string& text, const std::string& where = "ACCEL_TUNE (environment)");

class TuneRun {
 public:
  TuneRun(TuneSpec spec, std::shared_ptr<comm::Communicator> world, c10::Device device, std::int64_t global_batch,
          std::int64_t params);
  // In prepare(): a probe writes its line and ends the process here.
  void after_prepare(std::int64_t micro_batch, std::int64_t accumulation);
  // After each optimizer step (skipped fp16 steps count as steps).
  void after_step();

 private:
  [[noreturn]] void end(const std::string& json, int code);
  TuneSpec spec_;
  std::shared_ptr<comm::Communicator> world_;
  c10::Device device_;
  std::int64_t global_batch_, params_;
  int done_ = 0;
  std::chrono::steady_clock::time_point last_;
  std::vector<double> step_s_;
};

}  // namespace accel
