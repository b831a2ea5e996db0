#include "sharding/wrap_policy.h"
#include "base/error.h"

#include <torch/nn/module.h>

#include <stdexcept>

namespace accel::sharding {
namespace {

// "BlockImpl" matches "BlockImpl" and "ns::BlockImpl".
bool type_matches(const std::string& module_name, const std::string& wanted) {
  if (module_name == wanted) return true;
  return module_name.size() > wanted.size() + 2 &&
         module_name.compare(module_name.size() - wanted.size() - 2, std::string::npos, "::" + wanted) == 0;
}

std::int64_t subtree_numel(torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace

void WrapPolicy::validate() const {
  if (kind == Kind::TypeName && type_names.empty())
    throw accel::InvalidArgumentError("ShardingSpec.wrap: the type-name policy needs at least one type name");
  if (min_num_params < 0) throw accel::InvalidArgumentError("ShardingSpec.wrap.min_num_params must be >= 0");
}

bool WrapPolicy::wraps(torch::nn::Module& m) const {
  switch (kind) {
    case Kind::Marked: return true;
    case Kind::TypeName:
      for (const auto& t : type_names)
        if (type_matches(m.name(), t)) return true;
      return false;
    case Kind::Size: return subtree_numel(m) >= min_num_params;
    case Kind::None: return false;
  }
  return false;
}

}  // namespace accel::sharding
