// accel::unit(module) — marks a submodule as a sharding unit and gives it forward hooks.
//
// C++ modules have no forward hooks, so the model calls the marked block through a Unit handle:
//
//   struct GPT : torch::nn::Module {
//     std::vector<accel::Unit<BlockImpl>> blocks;
//     GPT() { for (int i = 0; i < n; ++i)
//               blocks.push_back(accel::unit(register_module("h" + std::to_string(i),
//                                                            std::make_shared<BlockImpl>())));}
//     at::Tensor forward(at::Tensor x) { for (auto& b : blocks) x = b(x); return x; }
//   };
//
// Until the model is prepared, calling the Unit is exactly calling module->forward. Once prepared, the
// engine installs UnitHooks: pre_forward gathers the unit's parameters (and prefetches the next unit),
// post_forward frees them again where the strategy says so and hooks the outputs so that backward can
// gather them first. Parameter names and the module tree do not change: the module is registered where
// the model registers it; the Unit is only the call site.
//
// Outputs: a Tensor or a std::vector<at::Tensor> is tracked for backward. Any other return type is
// passed through and the unit then stays gathered until its gradients are reduced.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace accel::sharding {

// What the engine does around a unit's forward. Implemented in zero/.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void pre_forward() = 0;
  // Tracked outputs (every tensor the unit returns); may register backward hooks on them.
  virtual void post_forward(std::vector<at::Tensor>& outputs) = 0;
  // The unit returned something the engine cannot hook: it must not free the parameters now.
  virtual void post_forward_untracked() = 0;
};

// Shared by every copy of one Unit handle; the registry maps the module to it.
struct UnitSlot {
  torch::nn::Module* module = nullptr;
  std::shared_ptr<UnitHooks> hooks;  // null until prepared
  // Recompute the forward during backward instead of keeping activations: set by the unit's own
  // options, or by the engine for every unit (ShardingSpec::activation_checkpointing).
  bool checkpoint = false;
  bool checkpoint_by_spec = false;
};

// Registers `module` as a unit (idempotent) and returns its slot.
std::shared_ptr<UnitSlot> register_unit(torch::nn::Module* module);
// The slot of a module marked with accel::unit, or null.
std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module);

}  // namespace accel::sharding

namespace accel {

template <class M>
class Unit {
 public:
  Unit() = default;
  explicit Unit(std::shared_ptr<M> module)
      : module_(std::move(module)), slot_(sharding::register_unit(static_cast<torch::nn::Module*>(module_.get()))) {}

  template <class... Args>
  auto operator()(Args&&... args) -> decltype(std::declval<M&>().forward(std::forward<Args>(args)...)) {
    auto* hooks = slot_->hooks.get();
    if (!hooks) return module_->forward(std::forward<Args>(args)...);
    hooks->pre_forward();
    auto out = module_->forward(std::forward<Args>(args)...);
    using Out = decltype(out);
    if constexpr (std::is_same_v<Out, at::Tensor>) {
      std::vector<at::Tensor> outs{out};
      hooks->post_forward(outs);
      return std::move(outs[0]);
    } else if constexpr (std::is_same_v<Out, std::vector<at::Tensor>>) {
      hooks->post_forward(out);
      return out;
    } else {
      hooks->post_forward_untracked();
      return out;
    }
  }

  M* operator->() const { return module_.get(); }
  M& operator*() const { return *module_; }
  const std::shared_ptr<M>& ptr() const { return module_; }

 private:
  std::shared_ptr<M> module_;
  std::shared_ptr<sharding::UnitSlot> slot_;
};

template <class M>
Unit<M> unit(std::shared_ptr<M> module) {
  return Unit<M>(std::move(module));
}
// torch::nn::Linear and other ModuleHolders.
template <class Holder>
auto unit(const Holder& holder) -> Unit<typename Holder::ContainedType> {
  return Unit<typename Holder::ContainedType>(holder.ptr());
}

}  // namespace accel
