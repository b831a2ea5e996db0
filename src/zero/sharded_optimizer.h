// accel::zero::prepare — builds the Engine for a model and replaces the user's optimizer by one of
// the same type (a row of zero/optimizers.h: dynamic_cast to it works) with the same param groups
// and options, over this rank's master shards.
//
// Its step(): the engine checks backward is over, the inner optimizer steps the master shards
// (allocations charged to memory::Category::OptimizerState), and the engine writes the shards back
// and all-gathers the parameters where the strategy keeps them replicated. zero_grad() clears the
// master gradients. Param groups are index-for-index the user's (an LR scheduler works on them).
#pragma once

#include "zero/engine.h"

#include <memory>

namespace accel::zero {

struct EngineAndOptimizer {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
};

// Whether a model handed over on the host stays there for prepare() on a device, each unit reaching the
// device as this rank's shard: the strategy shards parameters over a shard group of shard_size > 1 ranks,
// or offloads them (offload_param). Otherwise the model goes to the device whole.
bool builds_on_the_host(const ShardingSpec& spec, int shard_size);

// Puts a model on the device it trains on, before prepare(): all of it, or, where its parameters are
// on the host and are to be sharded on a device (ZeRO-3 / FULL_SHARD / HYBRID_SHARD over a shard group
// of shard_size > 1 ranks: the world, or a node under HYBRID_SHARD; or offloaded with offload_param,
// ZeRO-Infinity), only its buffers, with spec.device set: prepare() then builds the flats on the host
// and moves each to the device as its shard (or, offloaded, empty), so the device never holds the
// whole model (as FSDP moves a module on the CPU to device_id unit by unit). A model built under
// sharding::ShardedInit takes that path too, or else gets its units' values back (collective) before it
// is moved whole.
void place_model(torch::nn::Module& model, ShardingSpec& spec, c10::Device device, int shard_size);

// Throws std::invalid_argument for an optimizer prepare() cannot shard, naming its type and the
// supported ones (before place_model, so that a refused optimizer leaves the model where it was).
void check_optimizer(const torch::optim::Optimizer& optimizer);

// Throws std::invalid_argument for an optimizer it cannot shard (naming its type and the supported
// ones), a parameter shared across two units, or a bad spec.
EngineAndOptimizer prepare(std::shared_ptr<torch::nn::Module> model, const torch::optim::Optimizer& optimizer,
                           const ShardingSpec& spec, std::shared_ptr<comm::Communicator> world);

}  // namespace accel::zero
