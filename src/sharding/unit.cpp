#include "sharding/unit.h"
#include "base/error.h"

#include "sharding/sharded_init.h"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <mutex>
#include <unordered_map>

namespace accel::sharding {
namespace {
std::mutex g_mu;
std::unordered_map<const torch::nn::Module*, std::weak_ptr<UnitSlot>>& registry() {
  static std::unordered_map<const torch::nn::Module*, std::weak_ptr<UnitSlot>> r;
  return r;
}
}  // namespace

std::shared_ptr<UnitSlot> register_unit(torch::nn::Module* module) {
  std::shared_ptr<UnitSlot> slot;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto& r = registry();
    if (auto it = r.find(module); it != r.end())
      if (auto s = it->second.lock()) return s;
    slot = std::make_shared<UnitSlot>();
    slot->module = module;
    r[module] = slot;
  }
  // Inside a sharded-construction scope the unit is sharded now, as soon as it is built (collective).
  if (auto* init = ShardedInit::active()) init->shard_unit(*module);
  if (auto* observer = unit_built_observer()) observer->unit_built(*module);
  return slot;
}

UnitBuiltObserver*& unit_built_observer() {
  thread_local UnitBuiltObserver* observer = nullptr;
  return observer;
}

std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto& r = registry();
  auto it = r.find(module);
  return it == r.end() ? nullptr : it->second.lock();
}

std::vector<at::Tensor> checkpoint_unit(const UnitSlot& slot, const CheckpointFn& fn,
                                        const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> params;
  for (const auto& p : slot.module->parameters())
    if (p.requires_grad()) params.push_back(p);
  return checkpoint(fn, inputs, params, slot.module->name());
}

void throw_checkpoint_output(const UnitSlot& slot) {
  throw accel::LogicError(
      fmt::format("activation checkpointing of unit {}: its forward must return an at::Tensor or a "
                  "std::vector<at::Tensor> (the outputs the recompute reproduces)",
                  slot.module->name()));
}

}  // namespace accel::sharding
