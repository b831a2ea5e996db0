// Comparing tensors in tests: header-only, ATen only (no engine, no ranks).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>

namespace accel::test {

// Largest |a - b| over largest |b|, in double.
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  double scale = std::max(b.abs().max().item<double>(), 1e-300);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

}  // namespace accel::test
