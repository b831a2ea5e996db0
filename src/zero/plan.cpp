#include "zero/plan.h"

namespace accel::zero {

Groups groups_for(const ShardingSpec& spec, const std::shared_ptr<comm::Communicator>& world) {
  if (spec.hybrid()) return {world->node_local(), world->cross_node()};
  return {world, nullptr};
}

Plan Plan::resolve(const ShardingSpec& spec, int world_size, int shard_size, bool dtypes_convert) {
  Plan p;
  // Offloading to disk, or parameters to host memory, needs the engine's own masters and shards, even
  // on one rank.
  const bool on_disk = spec.offload.optimizer_on_disk() || spec.offload.param_offloaded();
  p.passthrough = world_size == 1 && !dtypes_convert && !on_disk;
  p.masters_are_shards = spec.shards_optimizer();
  p.state_split = spec.shards_optimizer() && shard_size > 1;
  p.params_sharded = spec.shards_parameters() && (shard_size > 1 || spec.offload.param_offloaded());
  p.reduce_mode = !spec.shards_optimizer()   ? GradReducer::Mode::AllReduce
                  : !spec.shards_gradients() ? GradReducer::Mode::ReduceScatterInPlace
                                             : GradReducer::Mode::ReduceScatter;
  p.churns_memory = p.params_sharded || (spec.shards_gradients() && shard_size > 1);
  return p;
}

}  // namespace accel::zero
