#include "zero/plan.h"

#include "base/error.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace accel::zero {

Groups groups_for(const ShardingSpec& spec, const std::shared_ptr<comm::Communicator>& world) {
  if (const int n = spec.groups_of_ranks()) {
    check_shard_groups(n, world->size());
    if (n == world->size()) return {world, nullptr};
    return {world->block(n), world->across_blocks(n)};
  }
  if (!spec.groups_by_node()) return {world, nullptr};
  check_hybrid_nodes(*world, spec);
  return {world->node_local(), world->cross_node()};
}

void check_shard_groups(int group_size, int world_size) {
  if (group_size >= 1 && world_size % group_size == 0) return;
  throw accel::InvalidArgumentError(fmt::format(
      "shard groups of {} rank{} do not divide the {} ranks of the job (each group holds a whole sharded copy of "
      "the model): launch a multiple of {} ranks, or choose a group size that divides {}",
      group_size, group_size == 1 ? "" : "s", world_size, group_size, world_size));
}

void check_hybrid_nodes(comm::Communicator& world, const ShardingSpec& spec) {
  if (world.size() == 1) return;
  const comm::Topology& topo = world.topology();
  const at::Tensor mine = at::tensor(std::vector<std::int64_t>{topo.node_rank, topo.local_world_size},
                                     at::TensorOptions().dtype(at::kLong));
  at::Tensor all = at::empty({2 * world.size()}, at::kLong);
  world.all_gather(mine, all);
  const auto* v = all.data_ptr<std::int64_t>();
  std::map<std::int64_t, std::int64_t> ranks_of_node;
  for (int q = 0; q < world.size(); ++q) ranks_of_node[v[2 * q]] = v[2 * q + 1];
  std::string sizes;
  bool even = true;
  for (const auto& [node, n] : ranks_of_node) {
    sizes += fmt::format("{}{}", sizes.empty() ? "" : ", ", n);
    even = even && n == ranks_of_node.begin()->second;
  }
  if (!even) {
    // HYBRID_SHARD is FULL_SHARD so; HYBRID_SHARD_ZERO2 (ZeRO-2 with node groups) is SHARD_GRAD_OP so.
    const bool zero3 = spec.shards_parameters();
    throw accel::InvalidArgumentError(fmt::format(
        "{} needs the same number of ranks on every node (it shards within a node and mirrors each shard on the "
        "other nodes), but the {} nodes hold {} rank(s){}. Launch as many ranks on each node, or use {}, which "
        "shards over all ranks",
        zero3 ? info(Strategy::HybridShard).fsdp_name : kHybridShardZero2, ranks_of_node.size(), sizes,
        topo.simulated ? " (ACCEL_RANKS_PER_NODE)" : "",
        zero3 ? info(Strategy::Zero3).fsdp_name : info(Strategy::Zero2).fsdp_name));
  }
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
