// accel::sharding::WrapPolicy — which modules marked with accel::unit become sharding units
// (FSDP's auto-wrap policies, over the marks a model makes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace accel::sharding {

struct WrapPolicy {
  enum class Kind { Marked, TypeName, Size, None };
  // Marked: every module marked with accel::unit is a unit. TypeName: marked modules whose type name
  // (torch::nn::Module::name(), e.g. "BlockImpl") is in type_names. Size: marked modules holding at
  // least min_num_params parameters (their whole subtree). None: only the root unit.
  Kind kind = Kind::Marked;
  std::vector<std::string> type_names;
  std::int64_t min_num_params = 0;

  // Throws std::invalid_argument naming the field for a bad value.
  void validate() const;
  // Whether the marked module m becomes a unit of its own.
  bool wraps(torch::nn::Module& m) const;
};

}  // namespace accel::sharding
