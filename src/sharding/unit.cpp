#include "sharding/unit.h"

#include "sharding/sharded_init.h"

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
  return slot;
}

std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto& r = registry();
  auto it = r.find(module);
  return it == r.end() ? nullptr : it->second.lock();
}

}  // namespace accel::sharding
