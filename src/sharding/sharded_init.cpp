#include "sharding/sharded_init.h"
#include "base/error.h"

#include "sharding/flat_param.h"
#include "sharding/shard_layout.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

namespace accel::sharding {
namespace {

struct PreSharded {
  std::vector<at::Tensor> params;
  ShardLayout layout;
  at::Tensor shard;
  std::shared_ptr<comm::Communicator> group;
};

std::mutex g_presharded_mu;
std::map<const void*, std::shared_ptr<PreSharded>>& presharded() {
  static std::map<const void*, std::shared_ptr<PreSharded>> r;
  return r;
}
thread_local ShardedInit* t_active = nullptr;

}  // namespace

ShardedInit::ShardedInit(std::shared_ptr<comm::Communicator> world, std::shared_ptr<comm::Communicator> shard_group,
                         bool shard)
    : world_(std::move(world)), group_(std::move(shard_group)), shard_(shard), previous_(t_active) {
  if (!world_ || !group_) throw accel::InvalidArgumentError("ShardedInit: null communicator");
  if (shard_) t_active = this;
}

ShardedInit::~ShardedInit() {
  if (shard_) t_active = previous_;
}

ShardedInit* ShardedInit::active() { return t_active; }

void ShardedInit::shard_unit(torch::nn::Module& module) {
  c10::NoGradGuard ng;
  std::vector<at::Tensor> ps;
  std::set<const void*> seen;
  for (const auto& p : module.parameters()) {
    if (is_presharded(p) || !seen.insert(p.unsafeGetTensorImpl()).second) continue;  // a nested unit's
    if (!p.is_contiguous() || !p.device().is_cpu())
      throw accel::InvalidArgumentError(fmt::format(
          "accel sharded_init: unit {} has a parameter that is not a contiguous CPU tensor", module.name()));
    if (!ps.empty() && p.scalar_type() != ps[0].scalar_type())
      throw accel::InvalidArgumentError(
          fmt::format("accel sharded_init: unit {} mixes parameter dtypes", module.name()));
    ps.push_back(p);
  }
  if (ps.empty()) return;
  for (auto& p : ps) world_->broadcast(p.detach(), {0});  // every rank builds from rank 0's values
  std::vector<std::int64_t> numels;
  for (const auto& p : ps) numels.push_back(p.numel());
  auto e = std::make_shared<PreSharded>(PreSharded{ps, ShardLayout(numels, group_->size()), {}, group_});
  auto [b, end] = e->layout.shard_range(group_->rank());
  at::Tensor shard = at::zeros({end - b}, at::TensorOptions().dtype(ps[0].scalar_type()));
  for (const auto& piece : e->layout.pieces(group_->rank()))
    shard.narrow(0, piece.shard_offset, piece.numel)
        .copy_(ps[piece.tensor].reshape({-1}).narrow(0, piece.tensor_offset, piece.numel));
  e->shard = shard;
  const std::string freed = fmt::format(
      "accel sharded_init: this parameter of a unit ({}) was sharded as it was built (Accelerator::sharded_init): "
      "its values come back in prepare(). Hand the model to prepare() as it was built, without moving or reading "
      "it first",
      module.name());
  for (auto& p : ps) {
    full_bytes_ += p.numel() * p.element_size();
    free_storage(p, freed);
  }
  shard_bytes_ += shard.numel() * shard.element_size();
  ++units_;
  std::lock_guard<std::mutex> lk(g_presharded_mu);
  for (const auto& p : ps) presharded()[p.unsafeGetTensorImpl()] = e;
}

bool is_presharded(const at::Tensor& p) {
  std::lock_guard<std::mutex> lk(g_presharded_mu);
  return presharded().count(p.unsafeGetTensorImpl()) > 0;
}

std::int64_t presharded_count() {
  std::lock_guard<std::mutex> lk(g_presharded_mu);
  return static_cast<std::int64_t>(presharded().size());
}

void materialize(const at::Tensor& p) {
  std::shared_ptr<PreSharded> e;
  {
    std::lock_guard<std::mutex> lk(g_presharded_mu);
    auto it = presharded().find(p.unsafeGetTensorImpl());
    if (it == presharded().end()) return;
    e = it->second;
    for (const auto& q : e->params) presharded().erase(q.unsafeGetTensorImpl());
  }
  c10::NoGradGuard ng;
  at::Tensor full = at::empty({e->layout.padded()}, e->shard.options());
  e->group->all_gather(e->shard, full);
  for (std::size_t i = 0; i < e->params.size(); ++i) {
    const at::Tensor& q = e->params[i];
    alloc_storage(q, static_cast<std::size_t>(q.numel()) * q.element_size());
    q.detach().view({-1}).copy_(full.narrow(0, e->layout.offset(static_cast<int>(i)), q.numel()));
  }
}

}  // namespace accel::sharding
