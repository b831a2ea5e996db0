// init_empty_weights (empty_weights.h): frees each unit's parameters as it is built.
#include "dispatch/empty_weights.h"
#include "base/error.h"

#include "sharding/flat_param.h"
#include "sharding/sharded_init.h"
#include "sharding/unit.h"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <stdexcept>
#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace accel {
namespace {
thread_local EmptyWeights* t_active = nullptr;
}  // namespace

struct EmptyWeightsObserver : sharding::UnitBuiltObserver {
  void unit_built(torch::nn::Module& module) override {
    if (auto* scope = EmptyWeights::active()) {
      scope->release_params(module);
      ++scope->units_;
    }
  }
};

namespace {
EmptyWeightsObserver g_observer;  // stateless: it acts on this thread's active scope
}  // namespace

EmptyWeights::EmptyWeights() : previous_(t_active) {
  if (sharding::ShardedInit::active())
    throw accel::LogicError("accel::init_empty_weights: not inside a sharded construction scope (ShardedInit)");
  previous_observer_ = sharding::unit_built_observer();
  sharding::unit_built_observer() = &g_observer;
  t_active = this;
}

EmptyWeights::~EmptyWeights() {
  t_active = previous_;
  sharding::unit_built_observer() = static_cast<sharding::UnitBuiltObserver*>(previous_observer_);
}

EmptyWeights* EmptyWeights::active() { return t_active; }

void EmptyWeights::release_params(torch::nn::Module& m) {
  bool freed = false;
  for (const auto& p : m.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = p.value();
    if (!t.defined() || !sharding::storage_allocated(t) || t.storage().nbytes() == 0) continue;
    bytes_ += static_cast<std::int64_t>(t.storage().nbytes());
    sharding::free_storage(t, fmt::format("parameter {} was built under accel::init_empty_weights and holds no values "
                                          "until load_checkpoint_and_dispatch loads it",
                                          p.key()));
    freed = true;
  }
  // glibc keeps freed heap chunks resident (and, with the alignment libtorch asks for, often does not
  // reuse them for the next unit's parameters): give the pages back, so building costs the memory of
  // one unit at a time.
#ifdef __GLIBC__
  if (freed) ::malloc_trim(0);
#endif
}

void EmptyWeights::release(torch::nn::Module& model) { release_params(model); }

bool is_empty_weight(const at::Tensor& p) {
  return p.defined() && p.numel() > 0 && (p.is_meta() || !sharding::storage_allocated(p));
}

}  // namespace accel
