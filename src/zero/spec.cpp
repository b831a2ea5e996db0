#include "zero/spec.h"
#include "base/error.h"

#include "base/check.h"

#include <fmt/format.h>

#include <stdexcept>

namespace accel::zero {

c10::ScalarType ShardingSpec::window_dtype(c10::ScalarType reduce) const {
  if (accumulate_dtype) return *accumulate_dtype;
  if (master_dtype == c10::kBFloat16 && param_dtype == c10::kBFloat16) return c10::kBFloat16;
  return reduce;
}

namespace {

// clang-format off
const std::vector<StrategyInfo> kStrategies = {
  // strategy             name            short      label                     fsdp_name        fsdp_label                     fsdp#  stage  optim  grads  params hybrid
  {Strategy::NoShard,     "NO_SHARD",     "DDP",     "DDP (NO_SHARD)",         "NO_SHARD",      "NO_SHARD (like DDP)",           3, 0, false, false, false, false},
  {Strategy::Zero1,       "ZERO_1",       "ZeRO-1",  "ZeRO-1",                 nullptr,         "none (ZeRO-1 has no FSDP name)", 0, 1, true,  false, false, false},
  {Strategy::Zero2,       "ZERO_2",       "ZeRO-2",  "ZeRO-2 (SHARD_GRAD_OP)", "SHARD_GRAD_OP", "SHARD_GRAD_OP (like ZeRO-2)",   2, 2, true,  true,  false, false},
  {Strategy::Zero3,       "ZERO_3",       "ZeRO-3",  "ZeRO-3 (FULL_SHARD)",    "FULL_SHARD",    "FULL_SHARD (like ZeRO-3)",      1, 3, true,  true,  true,  false},
  {Strategy::HybridShard, "HYBRID_SHARD", "HYBRID_SHARD", "HYBRID_SHARD (ZeRO-3 inside each machine, replicated across machines)",
                                                                               "HYBRID_SHARD",  "HYBRID_SHARD (ZeRO-3 inside each machine, replicated across machines)",
                                                                                                                               4, 3, true,  true,  true,  true},
};
// clang-format on

}  // namespace

const std::vector<StrategyInfo>& strategies() { return kStrategies; }

const StrategyInfo& info(Strategy s) {
  for (const auto& row : kStrategies)
    if (row.strategy == s) return row;
  ACCEL_CHECK(false, "strategy {} is not in the strategy table", static_cast<int>(s));
}

const StrategyInfo* find_fsdp(const std::string& fsdp_name) {
  for (const auto& row : kStrategies)
    if (row.fsdp_name && fsdp_name == row.fsdp_name) return &row;
  return nullptr;
}

const StrategyInfo* find_fsdp(int fsdp_number) {
  for (const auto& row : kStrategies)
    if (row.fsdp_name && row.fsdp_number == fsdp_number) return &row;
  return nullptr;
}

std::string fsdp_names(const char* sep) {
  std::string out;
  for (int n = 1; const StrategyInfo* row = find_fsdp(n); ++n) out += (n > 1 ? sep : "") + std::string(row->fsdp_name);
  return out;
}

const char* to_string(Strategy s) { return info(s).name; }

const char* to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::Cpu: return "cpu";
    case OffloadDevice::Nvme: return "nvme";
    default: return "none";
  }
}

ShardingSpec ShardingSpec::ddp() { return {}; }

ShardingSpec ShardingSpec::zero(int stage) {
  // Stage 3 is ZeRO-3, not HYBRID_SHARD (which stores the same): the first row with the stage.
  for (const auto& row : kStrategies)
    if (row.zero_stage == stage) {
      ShardingSpec s;
      s.strategy = row.strategy;
      return s;
    }
  throw accel::InvalidArgumentError(fmt::format("ZeRO stage must be 0, 1, 2 or 3, got {}", stage));
}

ShardingSpec ShardingSpec::fsdp(const std::string& name) {
  if (name == kHybridShardZero2) {
    ShardingSpec s = zero(2);
    s.shard_group_size = kNodeGroup;
    return s;
  }
  const StrategyInfo* row = find_fsdp(name);
  if (!row)
    throw accel::InvalidArgumentError(
        fmt::format("FSDP sharding strategy '{}' is not one of {}, {}", name, fsdp_names(), kHybridShardZero2));
  ShardingSpec s;
  s.strategy = row->strategy;
  return s;
}

void ShardingSpec::validate() const {
  if (bucket_bytes < 0)
    throw accel::InvalidArgumentError(fmt::format("ShardingSpec.bucket_bytes must be >= 0, got {}", bucket_bytes));
  if (grad_buckets_in_flight < 1)
    throw accel::InvalidArgumentError(
        fmt::format("ShardingSpec.grad_buckets_in_flight must be >= 1, got {}", grad_buckets_in_flight));
  if (align_elements < 1)
    throw accel::InvalidArgumentError(fmt::format("ShardingSpec.align_elements must be >= 1, got {}", align_elements));
  wrap.validate();
  if (offload.param != OffloadDevice::None && !shards_parameters())
    throw accel::InvalidArgumentError(
        fmt::format("offload_param needs sharded parameters (ZeRO-3, FULL_SHARD or HYBRID_SHARD); the strategy is {}",
                    zero::to_string(strategy)));
  if (offload.optimizer_on_disk() && offload.optimizer_nvme_path.empty())
    throw accel::InvalidArgumentError("offload_optimizer.device is nvme but offload_optimizer.nvme_path is not set");
  if (offload.param_on_disk() && offload.param_nvme_path.empty())
    throw accel::InvalidArgumentError("offload_param.device is nvme but offload_param.nvme_path is not set");
  if (offload.optimizer_buffer_count < 2 || offload.param_buffer_count < 2)
    throw accel::InvalidArgumentError(fmt::format("offload buffer_count must be >= 2, got {} (optimizer), {} (param)",
                                                  offload.optimizer_buffer_count, offload.param_buffer_count));
  if (offload.sub_group_size < 1)
    throw accel::InvalidArgumentError(fmt::format("sub_group_size must be >= 1, got {}", offload.sub_group_size));
  if (shard_group_size < kNodeGroup)
    throw accel::InvalidArgumentError(
        fmt::format("ShardingSpec.shard_group_size must be >= 1 ranks (or 0: the strategy's, -1: a node's), got {}",
                    shard_group_size));
  if (shard_group_size != kStrategyGroup && !shards_gradients())
    throw accel::InvalidArgumentError(
        fmt::format("shard groups other than the strategy's own need a strategy that shards gradients (ZeRO-2, "
                    "ZeRO-3, SHARD_GRAD_OP, FULL_SHARD or HYBRID_SHARD); the strategy is {}",
                    zero::to_string(strategy)));
  for (auto dt : {param_dtype, reduce_dtype, master_dtype, accumulate_dtype})
    if (dt && !c10::isFloatingType(*dt))
      throw accel::InvalidArgumentError(
          fmt::format("ShardingSpec dtypes must be floating point, got {}", c10::toString(*dt)));
}

std::string ShardingSpec::to_string() const {
  std::string s =
      fmt::format("{}: optimizer {}, gradients {}, parameters {}", zero::to_string(strategy),
                  shards_optimizer() ? "sharded" : "replicated", shards_gradients() ? "sharded" : "replicated",
                  shards_parameters() ? "sharded" : "replicated");
  if (shards_parameters()) s += reshard_after_forward ? " (freed after forward)" : " (kept through backward)";
  if (groups_of_ranks() > 0)
    s += fmt::format(", in groups of {} ranks replicated across the groups", groups_of_ranks());
  else if (groups_by_node())
    s += ", replicated across nodes";
  s += fmt::format(", bucket {} B, {} in flight", bucket_bytes, grad_buckets_in_flight);
  if (activation_checkpointing) s += ", activation checkpointing";
  if (offload.optimizer != OffloadDevice::None)
    s += fmt::format(", optimizer state offloaded to {}", zero::to_string(offload.optimizer));
  if (offload.param != OffloadDevice::None)
    s += fmt::format(", parameters offloaded to {}", zero::to_string(offload.param));
  return s;
}

}  // namespace accel::zero
