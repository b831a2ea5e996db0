// The small model of the dispatch tests: a Linear in, `layers` residual blocks (each an accel unit of
// two Linear layers), a Linear out; and helpers that write its weights as a checkpoint.
#pragma once

#include "base/files.h"
#include "checkpoint/safetensors.h"
#include "sharding/unit.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace accel::test {

struct StackBlockImpl : torch::nn::Module {
  explicit StackBlockImpl(int64_t d) {
    a = register_module("a", torch::nn::Linear(d, d));
    b = register_module("b", torch::nn::Linear(d, d));
  }
  at::Tensor forward(at::Tensor x) { return x + b(at::gelu(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

// Two units that must stay together (the no_split tests name its class, "StackPair").
struct StackPairImpl : torch::nn::Module {
  explicit StackPairImpl(int64_t d) {
    first = accel::unit(register_module("first", std::make_shared<StackBlockImpl>(d)));
    second = accel::unit(register_module("second", std::make_shared<StackBlockImpl>(d)));
  }
  at::Tensor forward(at::Tensor x) { return second(first(x)); }
  accel::Unit<StackBlockImpl> first, second;
};

struct StackImpl : torch::nn::Module {
  // pairs: layers are grouped two by two in StackPair modules (layers must be even).
  StackImpl(int64_t d, int64_t layers, bool pairs = false) {
    in = register_module("in", torch::nn::Linear(d, d));
    for (int64_t i = 0; i < layers; ++i) {
      if (pairs) {
        if (i % 2 == 0)
          pair.push_back(register_module("p" + std::to_string(i / 2), std::make_shared<StackPairImpl>(d)));
      } else {
        blocks.push_back(accel::unit(register_module("l" + std::to_string(i), std::make_shared<StackBlockImpl>(d))));
      }
    }
    out = register_module("out", torch::nn::Linear(d, d));
  }
  at::Tensor forward(at::Tensor x) {
    x = in(x);
    for (auto& b : blocks) x = b(x);
    for (auto& p : pair) x = p->forward(x);
    return out(x);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<accel::Unit<StackBlockImpl>> blocks;
  std::vector<std::shared_ptr<StackPairImpl>> pair;
};

inline std::vector<std::pair<std::string, at::Tensor>> named_weights(torch::nn::Module& m,
                                                                     c10::ScalarType dtype = at::kFloat) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().to(dtype));
  return out;
}

// Hugging Face layout: the tensors split over `shards` files and model.safetensors.index.json.
inline void write_sharded_checkpoint(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& ws,
                                     int shards) {
  files::make_dirs(dir);
  nlohmann::json index;
  index["metadata"]["total_size"] = 0;
  for (int s = 0; s < shards; ++s) {
    const std::string file =
        "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    std::vector<std::pair<std::string, at::Tensor>> part;
    for (std::size_t i = s; i < ws.size(); i += shards) {
      part.push_back(ws[i]);
      index["weight_map"][ws[i].first] = file;
    }
    checkpoint::write_safetensors(dir + "/" + file, part, {{"format", "pt"}});
  }
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
}

inline std::string fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string d =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/accel_dispatch_" + name + "_" + std::to_string(::getpid());
  files::remove_tree(d);
  files::make_dirs(d);
  return d;
}

}  // namespace accel::test
