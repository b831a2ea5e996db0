// step_bench --profile: a few steps under libtorch's Kineto profiler (host ops, and the device's
// kernels and copies on CUDA), saved as a Chrome trace (chrome://tracing, Perfetto) and summed up in
// text: the device's kernels per step, the share of the steps' wall time the device was busy (the
// union of its activity intervals), its top kernels, the top host operations and accel's own scopes
// (accel::pre_forward, accel::end_unit, ... from the engine's RECORD_USER_SCOPE; how much of the step
// the engine's hooks take). The PyTorch side's twin is benchmarks/torch_anchor.py --profile.
#pragma once

#include <memory>
#include <string>

namespace accel::bench {

class StepProfile {
 public:
  // Starts profiling host operations, and the device's activity when `cuda`.
  explicit StepProfile(bool cuda);
  ~StepProfile();
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  // Stops, writes the Chrome trace to `trace_path` (nothing when empty) and returns the summary of
  // `steps` steps that took `wall_s` seconds in all, each line prefixed with `label`.
  std::string finish(const std::string& label, int steps, double wall_s, const std::string& trace_path);
  // After finish, on CUDA: the share of the wall time the device was busy with kernels or copies, and
  // with kernels alone (copies and memsets left out); negative without a device.
  double busy_share() const { return busy_share_; }
  double compute_share() const { return compute_share_; }

 private:
  bool cuda_;
  bool active_ = true;
  double busy_share_ = -1, compute_share_ = -1;
};

}  // namespace accel::bench
