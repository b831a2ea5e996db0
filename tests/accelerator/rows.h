// Rows of (x, y) tensors as a torch::data dataset: what the Accelerator tests hand their loaders.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/data/datasets/base.h>

#include <optional>
#include <utility>

namespace accel::test {

struct Rows : torch::data::datasets::Dataset<Rows> {
  Rows(at::Tensor x, at::Tensor y) : x(std::move(x)), y(std::move(y)) {}
  torch::data::Example<> get(std::size_t i) override { return {x[i], y[i]}; }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(x.size(0)); }
  at::Tensor x, y;
};

}  // namespace accel::test
