// accel::mixed_precision::AutocastScope — libtorch's autocast for one block, restored on exit.
//
//   { AutocastScope on(c10::kCPU, at::kBFloat16); logits = model->forward(x); }  // matmuls in bf16
//   { AutocastScope off(c10::kCPU, std::nullopt); y = head(x.to(at::kFloat)); }   // autocast off
//
// With a dtype: autocast is enabled on that device type with that lower-precision dtype (CPU: bf16
// or fp16; CUDA: fp16 or bf16). Ops on autocast's lower-precision list (linear, matmul, conv, ...)
// cast their inputs to it, ops on its fp32 list run in fp32, the rest follow their inputs.
// Without one: autocast is disabled for the block (force fp32): ops run in their inputs' dtypes,
// so cast the inputs to fp32 inside it. Scopes nest; each restores exactly what it found (enabled
// flag, dtype), and the outermost one clears autocast's cast cache on exit, as torch.autocast does.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace accel::mixed_precision {

class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype);
  ~AutocastScope();
  AutocastScope(AutocastScope&& o) noexcept;
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  AutocastScope& operator=(AutocastScope&&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = true;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::ScalarType::Undefined;
};

// The dtype autocast casts a lower-precision op's floating inputs to on `device` (bf16 or fp16), or
// nullopt where autocast is off there (or the device type has none: anything but CPU and CUDA). For a
// layer that is not on autocast's lists but should follow it as torch::nn::Linear does (Float8Linear).
std::optional<c10::ScalarType> autocast_dtype_on(c10::DeviceType device);

}  // namespace accel::mixed_precision
