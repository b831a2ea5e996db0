// Shared by the sharding tests: the models behind one interface, deterministic batches, optimizers
// with two param groups, and the flattening of reference tensors into an engine FlatParam's layout.
#pragma once

#include "compare.h"
#include "models.h"
#include "test_world.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace accel::test {

enum class ModelKind { MLP, GPT };
enum class OptKind { AdamW, SGD };
inline const char* name(ModelKind m) { return m == ModelKind::MLP ? "MLP" : "GPT"; }
inline const char* name(OptKind o) { return o == OptKind::AdamW ? "AdamW" : "SGD"; }

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor& x, const at::Tensor& y)> loss;
};

// Where the sharding suites put models and batches: the CPU, or ACCEL_TEST_DEVICE=cuda (each rank on
// cuda:(local rank % devices), several ranks sharing a GPU where there are fewer; scripts/gpu_check.sh).
inline c10::Device test_device() {
  static const c10::Device d = [] {
    const char* v = std::getenv("ACCEL_TEST_DEVICE");
    if (v == nullptr || *v == '\0' || std::string(v) == "cpu") return c10::Device(c10::kCPU);
    if (std::string(v) != "cuda")
      throw std::invalid_argument(std::string("ACCEL_TEST_DEVICE='") + v + "': cpu or cuda");
    const int n = static_cast<int>(c10::impl::getDeviceGuardImpl(c10::kCUDA)->deviceCount());
    if (n == 0) throw std::runtime_error("ACCEL_TEST_DEVICE=cuda but no CUDA device is visible");
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world()->topology().local_rank % n));
  }();
  return d;
}

inline Model make_model(ModelKind kind, c10::ScalarType dtype, std::vector<int64_t> mlp_widths = {6, 10, 10, 3}) {
  at::manual_seed(1234);
  Model m;
  if (kind == ModelKind::MLP) {
    auto mlp = std::make_shared<MLPImpl>(mlp_widths);
    m.module = mlp;
    m.loss = [mlp](const at::Tensor& x, const at::Tensor& y) { return at::mse_loss(mlp->forward(x), y); };
  } else {
    auto gpt = std::make_shared<GPTImpl>(GPTConfig{});
    m.module = gpt;
    m.loss = [gpt](const at::Tensor& x, const at::Tensor& y) { return lm_loss(gpt->forward(x), y); };
  }
  m.module->to(test_device(), dtype);
  return m;
}

// Global batch of `rows` for (step, micro): the same on every rank.
inline std::pair<at::Tensor, at::Tensor> make_batch(ModelKind kind, c10::ScalarType dtype, int step, int micro,
                                                    int64_t rows = 12, int64_t in = 6, int64_t out = 3) {
  at::manual_seed(100 + step * 10 + micro);
  const c10::Device d = test_device();
  if (kind == ModelKind::MLP) return {at::randn({rows, in}).to(d, dtype), at::randn({rows, out}).to(d, dtype)};
  GPTConfig c;
  return {at::randint(c.vocab, {rows, c.seq}).to(d), at::randint(c.vocab, {rows, c.seq}).to(d)};
}

// AdamW / SGD(momentum, nesterov) with two groups: matrices decay, vectors (biases, norms) do not.
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptKind kind, torch::nn::Module& m) {
  std::vector<at::Tensor> decay, no_decay;
  for (auto& p : m.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  if (kind == OptKind::AdamW) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(decay,
                   std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.02).weight_decay(0.1)));
    g.emplace_back(no_decay,
                   std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.02).weight_decay(0.0)));
    return std::make_unique<torch::optim::AdamW>(g, torch::optim::AdamWOptions(0.02));
  }
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(
                            torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.01)));
  g.emplace_back(no_decay, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1).momentum(0.9)));
  return std::make_unique<torch::optim::SGD>(g, torch::optim::SGDOptions(0.05));
}

// The reference's tensors (looked up by the flat's parameter names) laid out as the flat buffer.
inline at::Tensor flatten_like(const sharding::FlatParam& f, const std::map<std::string, at::Tensor>& by_name,
                               std::optional<c10::ScalarType> dtype = std::nullopt) {
  at::Tensor out = at::zeros({f.layout().padded()}, f.full().options().dtype(dtype.value_or(f.full().scalar_type())));
  for (std::size_t i = 0; i < f.names().size(); ++i) {
    const at::Tensor& t = by_name.at(f.names()[i]);
    if (t.defined()) out.narrow(0, f.layout().offset(i), t.numel()).copy_(t.reshape({-1}));
  }
  return out;
}

inline at::Tensor own_slice(const sharding::FlatParam& f, const at::Tensor& flat) {
  auto [b, e] = f.layout().shard_range(f.options().rank);
  return flat.narrow(0, b, e - b);
}

inline std::map<std::string, at::Tensor> params_by_name(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (auto& kv : m.named_parameters()) out[kv.key()] = kv.value();
  return out;
}
inline std::map<std::string, at::Tensor> grads_by_name(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (auto& kv : m.named_parameters()) out[kv.key()] = kv.value().grad();
  return out;
}

}  // namespace accel::test
