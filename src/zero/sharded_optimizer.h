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

// Throws std::invalid_argument for an optimizer it cannot shard (naming its type and the supported
// ones), a parameter shared across two units, or a bad spec.
EngineAndOptimizer prepare(std::shared_ptr<torch::nn::Module> model, const torch::optim::Optimizer& optimizer,
                           const ShardingSpec& spec, std::shared_ptr<comm::Communicator> world);

}  // namespace accel::zero
