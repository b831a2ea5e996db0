#include "zero/spec.h"

#include <stdexcept>

namespace accel::zero {

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::NoShard: return "NO_SHARD";
    case Strategy::Zero1: return "ZERO_1";
    case Strategy::Zero2: return "ZERO_2";
    case Strategy::Zero3: return "ZERO_3";
    case Strategy::HybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingSpec ShardingSpec::ddp() { return {}; }

ShardingSpec ShardingSpec::zero(int stage) {
  ShardingSpec s;
  switch (stage) {
    case 0: s.strategy = Strategy::NoShard; break;
    case 1: s.strategy = Strategy::Zero1; break;
    case 2: s.strategy = Strategy::Zero2; break;
    case 3: s.strategy = Strategy::Zero3; break;
    default:
      throw std::invalid_argument("ZeRO stage must be 0, 1, 2 or 3, got " + std::to_string(stage));
  }
  return s;
}

ShardingSpec ShardingSpec::fsdp(const std::string& name) {
  ShardingSpec s;
  if (name == "FULL_SHARD") {
    s.strategy = Strategy::Zero3;
  } else if (name == "SHARD_GRAD_OP") {
    s.strategy = Strategy::Zero2;
  } else if (name == "NO_SHARD") {
    s.strategy = Strategy::NoShard;
  } else if (name == "HYBRID_SHARD") {
    s.strategy = Strategy::HybridShard;
  } else {
    throw std::invalid_argument("FSDP sharding strategy '" + name +
                                "' is not one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD");
  }
  return s;
}

void ShardingSpec::validate() const {
  if (bucket_bytes < 0)
    throw std::invalid_argument("ShardingSpec.bucket_bytes must be >= 0, got " + std::to_string(bucket_bytes));
  if (align_elements < 1)
    throw std::invalid_argument("ShardingSpec.align_elements must be >= 1, got " + std::to_string(align_elements));
  if (wrap.kind == WrapPolicy::Kind::TypeName && wrap.type_names.empty())
    throw std::invalid_argument("ShardingSpec.wrap: the type-name policy needs at least one type name");
  if (wrap.min_num_params < 0)
    throw std::invalid_argument("ShardingSpec.wrap.min_num_params must be >= 0");
  for (auto dt : {param_dtype, reduce_dtype, master_dtype})
    if (dt && !c10::isFloatingType(*dt))
      throw std::invalid_argument(std::string("ShardingSpec dtypes must be floating point, got ") + c10::toString(*dt));
}

std::string ShardingSpec::to_string() const {
  std::string s = zero::to_string(strategy);
  s += std::string(": optimizer ") + (shards_optimizer() ? "sharded" : "replicated");
  s += std::string(", gradients ") + (shards_gradients() ? "sharded" : "replicated");
  s += std::string(", parameters ") + (shards_parameters() ? "sharded" : "replicated");
  if (shards_parameters()) s += reshard_after_forward ? " (freed after forward)" : " (kept through backward)";
  if (hybrid()) s += ", replicated across nodes";
  s += ", bucket " + std::to_string(bucket_bytes) + " B";
  return s;
}

}  // namespace accel::zero
