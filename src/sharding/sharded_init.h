// accel::sharding::ShardedInit — build a model without ever holding all of it (DeepSpeed's
// zero.Init, for accel's units).
//
// While a ShardedInit is alive on this thread, each module marked with accel::unit(...) is sharded
// the moment it is marked (right after it was built): every rank takes rank 0's values (one broadcast
// per parameter), keeps 1/G of the unit's flattened parameters, and frees the parameters' storage
// (their shapes, dtypes and names stay). So building a model holds, beyond the shards, one unit at a
// time plus what is not in any unit. Engine::build gives each unit its values back (materialize: one
// all-gather) right before it flattens and shards that unit, one unit at a time; zero::place_model
// gives all of them back first where the model goes to a device whole. Until then, touching a sharded
// parameter's data (moving the model, reading it) throws a message that says so.
//
// Parameters of a unit must share one dtype and device and be contiguous; a parameter already in an
// earlier (nested) unit stays with that unit. CPU tensors (a model for a device is built in host
// memory). Collective: every rank builds the same model in the same order.
#pragma once

#include "comm/communicator.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace torch::nn {
class Module;
}

namespace accel::sharding {

class ShardedInit {
 public:
  // world: rank 0's values are broadcast over it; shard_group: whose ranks split each unit. shard false:
  // a scope that shards nothing (units are built whole, as without it; prepare() then takes rank 0's
  // values), for where the model goes to a device whole anyway.
  ShardedInit(std::shared_ptr<comm::Communicator> world, std::shared_ptr<comm::Communicator> shard_group,
              bool shard = true);
  ~ShardedInit();
  ShardedInit(const ShardedInit&) = delete;
  ShardedInit& operator=(const ShardedInit&) = delete;

  // The scope active on this thread, or null.
  static ShardedInit* active();
  // Called by register_unit for each newly marked module.
  void shard_unit(torch::nn::Module& module);

  std::int64_t units_sharded() const { return units_; }
  std::int64_t shard_bytes() const { return shard_bytes_; }   // held by this rank
  std::int64_t sharded_bytes() const { return full_bytes_; }  // the units' full size

 private:
  std::shared_ptr<comm::Communicator> world_, group_;
  bool shard_ = true;
  ShardedInit* previous_ = nullptr;
  std::int64_t units_ = 0, shard_bytes_ = 0, full_bytes_ = 0;
};

// Whether p's values currently live only as construction shards.
bool is_presharded(const at::Tensor& p);
// Collective over the group p's unit was sharded over: gives every parameter of that unit its values
// back. No-op when p is not presharded.
void materialize(const at::Tensor& p);
// Parameters still presharded (for checks and tests).
std::int64_t presharded_count();

}  // namespace accel::sharding
