// accel::zero::Plan — what the engine executes: a ShardingSpec resolved, once, against the groups it
// runs on and the model's dtypes. The spec says what a strategy shards; the plan says what happens on
// this run (a group of one rank shards nothing; a world of one with nothing to convert needs no
// engine machinery at all). The engine reads only the plan's fields, never the spec's switches.
#pragma once

#include "comm/communicator.h"
#include "zero/grad_reducer.h"
#include "zero/spec.h"

#include <memory>

namespace accel::zero {

// The groups a spec shards over (ShardingSpec::shard_group_size): the world; under HYBRID_SHARD (or
// kNodeGroup) the ranks of this node (shard) and the same local rank on every node (replicate); with
// groups of n ranks, this rank's block of n consecutive ranks and the ranks at its place in every
// block. Collective (the groups are split from world, once). Throws InvalidArgumentError on every
// rank where nodes hold different numbers of ranks (check_hybrid_nodes), or n does not divide the world
// (check_shard_groups).
struct Groups {
  std::shared_ptr<comm::Communicator> shard, replicate;  // replicate: null when one group holds every rank
};
Groups groups_for(const ShardingSpec& spec, const std::shared_ptr<comm::Communicator>& world);

// Throws InvalidArgumentError unless groups of `group_size` ranks cut `world_size` ranks evenly.
void check_shard_groups(int group_size, int world_size);

// HYBRID_SHARD (and HYBRID_SHARD_ZERO2) shards within each node and mirrors each shard, rank for rank,
// on the other nodes: every node must hold as many ranks (FSDP's device mesh, replicate x shard, has the
// same rule). Collective over the world (an all-gather of the node sizes); throws InvalidArgumentError
// naming them, and spec's strategy, on every rank where they differ.
void check_hybrid_nodes(comm::Communicator& world, const ShardingSpec& spec);

struct Plan {
  // A world of one rank with no dtype conversion and nothing offloaded to disk: no hooks, no flat gradients, no masters
  // of our own; the optimizer steps the user's parameters on autograd's gradients (the plain libtorch loop).
  bool passthrough = false;
  // The optimizer steps this rank's shard of each flat buffer (else the whole buffer). Holds at any
  // group size, so that masters and checkpoints have one shape per strategy.
  bool masters_are_shards = false;
  // Optimizer state and gradients are split over a shard group of more than one rank: gradient norms
  // need an all-reduce, element-wise clipping of whole gradients is impossible, and replicated
  // parameters are all-gathered from the updated shards after each step.
  bool state_split = false;
  // Units' parameters live as shards and are gathered around each use (ZeRO-3, FULL_SHARD,
  // HYBRID_SHARD over more than one rank, or over one when the shards live on disk). The root unit
  // then stays gathered from step to step.
  bool params_sharded = false;
  // How gradients are reduced: all-reduce (replicated optimizer), reduce-scatter into the own slice of
  // the full buffer (ZeRO-1), or into a separate shard (ZeRO-2/3).
  GradReducer::Mode reduce_mode = GradReducer::Mode::AllReduce;
  // Sharded parameters or gradients are freed and re-allocated every step: keep freed CPU pages warm.
  bool churns_memory = false;

  // dtypes_convert: some parameter's compute or master dtype differs from its own.
  static Plan resolve(const ShardingSpec& spec, int world_size, int shard_size, bool dtypes_convert);
};

}  // namespace accel::zero
