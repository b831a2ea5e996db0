#include "mixed_precision/autocast.h"
#include "base/error.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace accel::mixed_precision {

AutocastScope::AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype) : device_(device) {
  if (device != c10::kCPU && device != c10::kCUDA)
    throw accel::InvalidArgumentError(
        fmt::format("AutocastScope: autocast runs on CPU or CUDA, not {}", c10::DeviceTypeName(device)));
  if (dtype && *dtype != c10::kBFloat16 && *dtype != c10::kHalf)
    throw accel::InvalidArgumentError(
        fmt::format("AutocastScope: the autocast dtype is bf16 or fp16, not {}", c10::toString(*dtype)));
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_enabled(device_, dtype.has_value());
  if (dtype) at::autocast::set_autocast_dtype(device_, *dtype);
}

AutocastScope::AutocastScope(AutocastScope&& o) noexcept
    : device_(o.device_), active_(o.active_), was_enabled_(o.was_enabled_), was_dtype_(o.was_dtype_) {
  o.active_ = false;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

std::optional<c10::ScalarType> autocast_dtype_on(c10::DeviceType device) {
  if ((device != c10::kCPU && device != c10::kCUDA) || !at::autocast::is_autocast_enabled(device)) return std::nullopt;
  return at::autocast::get_autocast_dtype(device);
}

}  // namespace accel::mixed_precision
