// accel::zero optimizer table — the optimizer types accel can shard and checkpoint, one row each
// (torch::optim::Adam, AdamW, SGD, RMSprop, Adagrad). prepare() and the checkpoint code know
// optimizers only through this table: a new optimizer is a new row, a new ability a new column.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
class OptimizerOptions;
class OptimizerParamState;
}  // namespace torch::optim

namespace accel::zero {

class Engine;
struct OffloadRule;

// A parameter's optimizer state: its defined tensors by name ("exp_avg", "momentum_buffer", ...),
// each shaped like the parameter, and its step counter where the optimizer keeps one.
struct OptimizerState {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::optional<std::int64_t> step;
};

struct OptimizerRow {
  const char* name;  // "Adam", "AdamW", ... (as checkpoints record it)
  // The user's optimizer is of this type (dynamic_cast: a subclass counts).
  bool (*is)(const torch::optim::Optimizer& user);
  // An optimizer of this type with the user's param groups and options over the engine's master
  // tensors; its step() is bracketed by engine->before_step() / after_step(). `user` must be `is`.
  std::shared_ptr<torch::optim::Optimizer> (*make_sharded)(const torch::optim::Optimizer& user,
                                                           const std::shared_ptr<Engine>& engine);
  // A param state of this optimizer type, as named tensors and step (empty for another type).
  OptimizerState (*export_state)(torch::optim::OptimizerParamState& state);
  // A new param state of this type from named tensors (missing names stay undefined) and step.
  std::unique_ptr<torch::optim::OptimizerParamState> (*import_state)(const std::map<std::string, at::Tensor>& tensors,
                                                                     std::int64_t step);
  // How a param group with these options steps when its state is offloaded (the fused CPU kernels);
  // nullptr where there is no fused kernel for this type (the state cannot be offloaded).
  void (*offload_rule)(const torch::optim::OptimizerOptions& options, OffloadRule& rule);
};

// Every row.
std::span<const OptimizerRow> optimizer_rows();
// The row `o` is of, or nullptr when accel does not support its type.
const OptimizerRow* find_optimizer_row(const torch::optim::Optimizer& o);
// The rows' names for messages: "Adam, AdamW, SGD, RMSprop and Adagrad" (`conjunction` = "and").
std::string optimizer_names(const char* conjunction);

}  // namespace accel::zero
