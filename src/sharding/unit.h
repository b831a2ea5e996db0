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
// Dispatch (src/dispatch/) uses the same slots for inference: hooks that page a unit's weights in
// from disk around its forward, and move its tensor arguments to the unit's device (input_device).
//
// Outputs: a Tensor or a std::vector<at::Tensor> is tracked for backward. Any other return type is
// passed through and the unit then stays gathered until its gradients are reduced.
//
// Activation checkpointing: accel::unit(m, {.checkpoint = true}), or every unit through
// ShardingSpec::activation_checkpointing. While grad mode is on and something requires grad, the
// unit's forward runs through sharding::checkpoint (activation_checkpoint.h): its activations are
// dropped and recomputed in backward. The at::Tensor arguments are the checkpoint's inputs (they get
// gradients); every other argument is copied and passed again to the recompute (anything in it that
// requires grad is refused in backward). Such a unit must return a Tensor or a std::vector<at::Tensor>.
// Under ZeRO-3 the recompute runs on the parameters that backward gathers for the unit anyway.
#pragma once

#include "sharding/activation_checkpoint.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/GradMode.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
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
  // Where the unit's at::Tensor (and std::vector<at::Tensor>) arguments must be before it runs, for
  // units placed on another device than the model's own code (dispatch, src/dispatch/); other
  // arguments are passed as they are. nullopt (the engine): arguments untouched.
  virtual std::optional<c10::Device> input_device() const { return std::nullopt; }
};

// Told about each unit the moment it is marked (right after it was built), on the marking thread.
// A construction scope that acts per unit sets it for its lifetime (dispatch's init_empty_weights
// frees the unit's parameters) and restores the previous one after.
class UnitBuiltObserver {
 public:
  virtual ~UnitBuiltObserver() = default;
  virtual void unit_built(torch::nn::Module& module) = 0;
};
// This thread's observer (null: none).
UnitBuiltObserver*& unit_built_observer();

// Shared by every copy of one Unit handle; the registry maps the module to it.
struct UnitSlot {
  torch::nn::Module* module = nullptr;
  std::shared_ptr<UnitHooks> hooks;  // null until prepared
  // Recompute the forward during backward instead of keeping activations: set by the unit's own
  // options, or by the engine for every unit (ShardingSpec::activation_checkpointing).
  bool checkpoint = false;
  bool checkpoint_by_spec = false;
  bool checkpointed() const { return checkpoint || checkpoint_by_spec; }
};

// Registers `module` as a unit (idempotent) and returns its slot.
std::shared_ptr<UnitSlot> register_unit(torch::nn::Module* module);
// The slot of a module marked with accel::unit, or null.
std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module);

// Whether the unit's forward is to run through checkpoint() now.
inline bool checkpoint_wanted(const UnitSlot& slot) { return slot.checkpointed() && c10::GradMode::is_enabled(); }
// checkpoint(fn, inputs, the unit module's parameters), named after the module.
std::vector<at::Tensor> checkpoint_unit(const UnitSlot& slot, const CheckpointFn& fn,
                                        const std::vector<at::Tensor>& inputs);
// The std::logic_error for a checkpointed unit whose forward returns something else.
[[noreturn]] void throw_checkpoint_output(const UnitSlot& slot);

namespace detail {
template <class T>
inline constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, at::Tensor>;
// How many of the first I elements of Tuple are tensors.
template <class Tuple, std::size_t I>
constexpr std::size_t tensors_before() {
  return []<std::size_t... J>(std::index_sequence<J...>) {
    return (std::size_t{0} + ... + (is_tensor_v<std::tuple_element_t<J, Tuple>> ? 1 : 0));
  }
  (std::make_index_sequence<I>{});
}
// Argument I of a recorded call: a tensor from the checkpoint's inputs, anything else as captured.
template <std::size_t I, class Tuple>
decltype(auto) pick(Tuple& captured, const std::vector<at::Tensor>& tensors) {
  if constexpr (is_tensor_v<std::tuple_element_t<I, Tuple>>)
    return (tensors[tensors_before<Tuple, I>()]);
  else
    return (std::get<I>(captured));
}
// An argument on its way to a unit on another device: tensors (and vectors of them) are moved there.
template <class A>
decltype(auto) on_device(A&& a, c10::Device device) {
  if constexpr (is_tensor_v<A>)
    return at::Tensor(a.defined() ? a.to(device) : a);
  else if constexpr (std::is_same_v<std::decay_t<A>, std::vector<at::Tensor>>) {
    std::vector<at::Tensor> out;
    for (const auto& t : a) out.push_back(t.defined() ? t.to(device) : t);
    return out;
  } else
    return std::forward<A>(a);
}
template <class M, class Tuple, std::size_t... I>
decltype(auto) call_recorded(M& m, Tuple& captured, const std::vector<at::Tensor>& tensors, std::index_sequence<I...>) {
  return m.forward(pick<I>(captured, tensors)...);
}
// What the recorded call keeps of an argument: tensors travel as the checkpoint's inputs instead.
template <class A>
std::decay_t<A> keep(A&& a) {
  if constexpr (is_tensor_v<A>)
    return at::Tensor();
  else
    return std::forward<A>(a);
}
}  // namespace detail

}  // namespace accel::sharding

namespace accel {

struct UnitOptions {
  // Recompute this unit's forward during backward instead of keeping its activations.
  bool checkpoint = false;
};

template <class M>
class Unit {
 public:
  Unit() = default;
  explicit Unit(std::shared_ptr<M> module, UnitOptions options = {})
      : module_(std::move(module)), slot_(sharding::register_unit(static_cast<torch::nn::Module*>(module_.get()))) {
    if (options.checkpoint) slot_->checkpoint = true;
  }

  template <class... Args>
  auto operator()(Args&&... args) -> decltype(std::declval<M&>().forward(std::forward<Args>(args)...)) {
    auto* hooks = slot_->hooks.get();
    if (!hooks) return run(std::forward<Args>(args)...);
    hooks->pre_forward();
    auto out = [&] {
      // (A forward that takes a tensor by non-const reference gets its arguments unmoved.)
      if constexpr (requires {
                      std::declval<M&>().forward(
                          sharding::detail::on_device(std::declval<Args>(), std::declval<c10::Device>())...);
                    }) {
        if (auto device = hooks->input_device())
          return run(sharding::detail::on_device(std::forward<Args>(args), *device)...);
      }
      return run(std::forward<Args>(args)...);
    }();
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
  bool checkpointed() const { return slot_->checkpointed(); }
  M& operator*() const { return *module_; }
  const std::shared_ptr<M>& ptr() const { return module_; }

 private:
  template <class... Args>
  auto run(Args&&... args) -> decltype(std::declval<M&>().forward(std::forward<Args>(args)...)) {
    using Out = decltype(std::declval<M&>().forward(std::forward<Args>(args)...));
    if (!sharding::checkpoint_wanted(*slot_)) return module_->forward(std::forward<Args>(args)...);
    if constexpr (!std::is_same_v<Out, at::Tensor> && !std::is_same_v<Out, std::vector<at::Tensor>>) {
      sharding::throw_checkpoint_output(*slot_);
    } else {
      std::vector<at::Tensor> inputs;
      (
          [&](const auto& a) {
            if constexpr (sharding::detail::is_tensor_v<decltype(a)>) inputs.push_back(a);
          }(args),
          ...);
      using Tuple = std::tuple<std::decay_t<Args>...>;
      auto captured = std::make_shared<Tuple>(sharding::detail::keep(std::forward<Args>(args))...);
      sharding::CheckpointFn fn = [module = module_, captured](const std::vector<at::Tensor>& tensors) {
        auto out = sharding::detail::call_recorded(*module, *captured, tensors, std::index_sequence_for<Args...>{});
        if constexpr (std::is_same_v<Out, at::Tensor>)
          return std::vector<at::Tensor>{std::move(out)};
        else
          return std::vector<at::Tensor>(std::move(out));
      };
      auto outs = sharding::checkpoint_unit(*slot_, fn, inputs);
      if constexpr (std::is_same_v<Out, at::Tensor>)
        return std::move(outs.at(0));
      else
        return outs;
    }
  }

  std::shared_ptr<M> module_;
  std::shared_ptr<sharding::UnitSlot> slot_;
};

template <class M>
Unit<M> unit(std::shared_ptr<M> module, UnitOptions options = {}) {
  return Unit<M>(std::move(module), options);
}
// torch::nn::Linear and other ModuleHolders.
template <class Holder>
auto unit(const Holder& holder, UnitOptions options = {}) -> Unit<typename Holder::ContainedType> {
  return Unit<typename Holder::ContainedType>(holder.ptr(), options);
}

}  // namespace accel
