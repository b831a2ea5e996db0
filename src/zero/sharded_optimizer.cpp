#include "zero/sharded_optimizer.h"
#include "base/error.h"

#include "base/memory.h"
#include "sharding/sharded_init.h"
#include "zero/optimizers.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/optim/lbfgs.h>

#include <fmt/format.h>

#include <stdexcept>

namespace accel::zero {

bool builds_on_the_host(const ShardingSpec& spec, int shard_size) {
  // (A shard group of one rank without parameter offload shards nothing: the engine trains the
  // parameters where they are.)
  return spec.shards_parameters() && (shard_size > 1 || spec.offload.param_offloaded());
}

void place_model(torch::nn::Module& model, ShardingSpec& spec, c10::Device device, int shard_size) {
  // (A model the program already put on a device, or partly, is moved whole, as before: the device held
  // it whole already.)
  const bool sharded = builds_on_the_host(spec, shard_size);
  bool on_the_host = true;
  for (const auto& p : model.parameters()) on_the_host = on_the_host && p.device().is_cpu();
  if (device.is_cpu()) {  // (the engine gives units built sharded their values back, here)
    model.to(device);
    return;
  }
  if (!sharded || !on_the_host) {
    // Units built under sharding::ShardedInit get their values back first: moved whole, the model
    // needs them (a strategy that keeps whole parameters, or a shard group of one).
    for (const auto& p : model.parameters()) sharding::materialize(p);
    model.to(device);
    return;
  }
  c10::NoGradGuard no_grad;
  for (auto& b : model.buffers())
    if (b.defined()) b.set_data(b.to(device));
  spec.device = device;
}

namespace {
const OptimizerRow& optimizer_row(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::LBFGS*>(&optimizer))
    throw accel::InvalidArgumentError(fmt::format(
        "accel::prepare: torch::optim::LBFGS cannot be sharded: its line search and curvature history work on "
        "whole parameter tensors through a closure. Use {}",
        optimizer_names("or")));
  const OptimizerRow* row = find_optimizer_row(optimizer);
  if (!row)
    throw accel::InvalidArgumentError(fmt::format(
        "accel::prepare: optimizer type {} is not supported (accel rebuilds the optimizer over parameter shards and "
        "knows how for {})",
        c10::demangle(typeid(optimizer).name()), optimizer_names("and")));
  return *row;
}
}  // namespace

void check_optimizer(const torch::optim::Optimizer& optimizer) { (void)optimizer_row(optimizer); }

EngineAndOptimizer prepare(std::shared_ptr<torch::nn::Module> model, const torch::optim::Optimizer& optimizer,
                           const ShardingSpec& spec, std::shared_ptr<comm::Communicator> world) {
  if (!model) throw accel::InvalidArgumentError("accel::prepare: the model is null");
  const OptimizerRow* row = &optimizer_row(optimizer);
  auto engine = std::make_shared<Engine>(std::move(model), &optimizer, spec, std::move(world));
  engine->install_hooks();
  memory::CategoryScope cat(memory::Category::OptimizerState);  // Adagrad allocates its state here
  return {engine, row->make_sharded(optimizer, engine)};
}

}  // namespace accel::zero
