// Models the sharding tests train: an MLP whose layers are units, and the examples' GPT
// (examples/models/gpt.h, which step_bench includes too), whose blocks are units, with its output
// head tied to the token embedding (a parameter shared inside the root unit). Construction is
// deterministic given the seed, so every rank and the single-process reference build the same weights.
#pragma once

#include "models/gpt.h"
#include "sharding/unit.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <string>
#include <vector>

namespace accel::test {

struct MLPImpl : torch::nn::Module {
  // widths {in, h1, ..., out}; every Linear is a unit; `root_scale` is a parameter of the root unit.
  MLPImpl(std::vector<int64_t> widths, bool root_param = true) {
    for (std::size_t i = 0; i + 1 < widths.size(); ++i)
      layers.push_back(
          accel::unit(register_module("fc" + std::to_string(i), torch::nn::Linear(widths[i], widths[i + 1]))));
    if (root_param) scale = register_parameter("scale", at::ones({1}));
  }
  at::Tensor forward(at::Tensor x) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      x = layers[i](x);
      if (i + 1 < layers.size()) x = at::tanh(x);
    }
    return scale.defined() ? x * scale : x;
  }
  std::vector<accel::Unit<torch::nn::LinearImpl>> layers;
  at::Tensor scale;
};

using examples::BlockImpl;
using examples::GPTConfig;
using examples::GPTImpl;
using examples::lm_loss;

}  // namespace accel::test
