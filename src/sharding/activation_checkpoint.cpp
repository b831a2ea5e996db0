#include "sharding/activation_checkpoint.h"
#include "base/error.h"

#include "base/memory.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <mutex>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace accel::sharding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The RNG and autocast states of one forward.
struct Rng {
  at::Generator gen;
  at::Tensor state;
};
struct Autocast {
  c10::DeviceType device;
  bool enabled;
  c10::ScalarType dtype;
};
constexpr c10::DeviceType kAutocastDevices[] = {c10::kCPU, c10::kCUDA};

at::Tensor get_state(at::Generator& gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_state(at::Generator& gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The CPU default generator and the default generator of every CUDA device `tensors` live on, with
// their states now.
std::vector<Rng> capture_rng(const std::vector<at::Tensor>& tensors) {
  std::vector<Rng> out;
  auto add = [&](at::Generator gen) {
    for (const auto& r : out)
      if (r.gen == gen) return;
    at::Tensor s = get_state(gen);
    out.push_back({std::move(gen), std::move(s)});
  };
  add(at::detail::getDefaultCPUGenerator());
  for (const auto& t : tensors)
    if (t.defined() && t.is_cuda()) add(at::globalContext().defaultGenerator(t.device()));
  return out;
}

struct State : torch::CustomClassHolder {
  CheckpointFn fn;
  std::string name;
  std::size_t num_inputs = 0;
  std::vector<char> input_requires_grad;
  std::vector<at::Tensor> params;  // the module's parameters, whose gradients the node returns
  std::vector<Rng> rng;
  std::vector<Autocast> autocast;
  bool autocast_cache = true;
};

// Sets the forward's RNG states for the recompute; puts back the states it found.
class RngSwap {
 public:
  explicit RngSwap(std::vector<Rng>& forward) : forward_(forward) {
    for (auto& r : forward_) found_.push_back(get_state(r.gen));
    for (auto& r : forward_) set_state(r.gen, r.state);
  }
  ~RngSwap() {
    for (std::size_t i = 0; i < forward_.size(); ++i) set_state(forward_[i].gen, found_[i]);
  }
  RngSwap(const RngSwap&) = delete;
  RngSwap& operator=(const RngSwap&) = delete;

 private:
  std::vector<Rng>& forward_;
  std::vector<at::Tensor> found_;
};

// Sets the forward's autocast state for the recompute (a fresh cast cache, as torch.autocast would);
// restores what it found.
class AutocastSwap {
 public:
  explicit AutocastSwap(const State& st) {
    for (auto d : kAutocastDevices)
      found_.push_back({d, at::autocast::is_autocast_enabled(d), at::autocast::get_autocast_dtype(d)});
    found_cache_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::increment_nesting();
    for (const auto& a : st.autocast) {
      at::autocast::set_autocast_enabled(a.device, a.enabled);
      at::autocast::set_autocast_dtype(a.device, a.dtype);
    }
    at::autocast::set_autocast_cache_enabled(st.autocast_cache);
  }
  ~AutocastSwap() {
    for (const auto& a : found_) {
      at::autocast::set_autocast_enabled(a.device, a.enabled);
      at::autocast::set_autocast_dtype(a.device, a.dtype);
    }
    at::autocast::set_autocast_cache_enabled(found_cache_);
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }
  AutocastSwap(const AutocastSwap&) = delete;
  AutocastSwap& operator=(const AutocastSwap&) = delete;

 private:
  std::vector<Autocast> found_;
  bool found_cache_ = true;
};

// No cast made under no-grad may land in autocast's cache: a later use of the same parameter with
// grad (outside this unit) would get the cached cast, which has no history.
class NoAutocastCache {
 public:
  NoAutocastCache() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(was_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool was_;
};

// Every leaf requiring grad that the recomputed graph reaches must be one whose gradient the node
// returns (an input or a param): throws naming the first other one.
void check_leaves(const State& st, const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& wrt) {
  std::unordered_set<const c10::TensorImpl*> allowed;
  for (const auto& t : wrt) allowed.insert(t.unsafeGetTensorImpl());
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& o : outputs)
    if (o.defined() && o.requires_grad() && o.grad_fn()) stack.push_back(o.grad_fn().get());
  while (!stack.empty()) {
    torch::autograd::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) {
      if (!allowed.count(acc->variable.unsafeGetTensorImpl()))
        throw accel::RuntimeError(fmt::format(
            "activation checkpointing of {}: its forward uses a tensor that requires grad (shape {}) which is "
            "neither a Tensor argument nor one of its parameters (a captured tensor, or another module's "
            "parameter); its gradient would be lost. Pass it as an at::Tensor argument, or do not checkpoint "
            "this unit",
            st.name, c10::str(acc->variable.sizes())));
      continue;
    }
    for (const auto& e : n->next_edges())
      if (e.is_valid()) stack.push_back(e.function.get());
  }
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList all, c10::intrusive_ptr<State> st) {
    ctx->set_materialize_grads(false);
    std::vector<at::Tensor> inputs(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(st->num_inputs));
    std::vector<at::Tensor> tensors(all.begin(), all.end());
    st->rng = capture_rng(tensors);
    for (auto d : kAutocastDevices)
      st->autocast.push_back({d, at::autocast::is_autocast_enabled(d), at::autocast::get_autocast_dtype(d)});
    st->autocast_cache = at::autocast::is_autocast_cache_enabled();
    for (const auto& t : inputs) st->input_requires_grad.push_back(t.defined() && t.requires_grad());
    ctx->save_for_backward(inputs);
    variable_list outputs;
    {
      NoAutocastCache no_cache;
      outputs = st->fn(inputs);
    }
    ctx->saved_data["state"] = at::IValue::make_capsule(std::move(st));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs(st->num_inputs), outputs;
    {
      RngSwap rng(st->rng);
      AutocastSwap autocast(*st);
      for (std::size_t i = 0; i < st->num_inputs; ++i) {
        if (!saved[i].defined()) continue;
        inputs[i] = saved[i].detach();
        if (st->input_requires_grad[i]) inputs[i].requires_grad_(true);
      }
      at::AutoGradMode grad(true);
      memory::CategoryScope cat(memory::Category::Activations);
      outputs = st->fn(inputs);
    }
    if (outputs.size() != grads.size())
      throw accel::RuntimeError(
          fmt::format("activation checkpointing of {}: the recomputed forward returned {} tensors, the forward {}",
                      st->name, outputs.size(), grads.size()));
    std::vector<at::Tensor> diff_outputs, grad_outputs;
    for (std::size_t j = 0; j < outputs.size(); ++j)
      if (outputs[j].defined() && outputs[j].requires_grad() && grads[j].defined()) {
        diff_outputs.push_back(outputs[j]);
        grad_outputs.push_back(grads[j]);
      }
    // What gets a gradient: the inputs and params that require one (position in the node's inputs).
    std::vector<at::Tensor> wrt;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        where.push_back(i);
      }
    for (std::size_t i = 0; i < st->params.size(); ++i)
      if (st->params[i].defined() && st->params[i].requires_grad()) {
        wrt.push_back(st->params[i]);
        where.push_back(st->num_inputs + i);
      }
    // One per tensor of the forward's TensorList, and one (undefined) for the state.
    variable_list result(st->num_inputs + st->params.size() + 1);
    if (diff_outputs.empty() || wrt.empty()) return result;
    check_leaves(*st, diff_outputs, wrt);
    variable_list g = torch::autograd::grad(diff_outputs, wrt, grad_outputs, /*retain_graph=*/false,
                                            /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t k = 0; k < g.size(); ++k) result[where[k]] = std::move(g[k]);
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params, const std::string& name) {
  bool any = false;
  for (const auto& t : inputs) any = any || (t.defined() && t.requires_grad());
  for (const auto& t : params) any = any || (t.defined() && t.requires_grad());
  if (!c10::GradMode::is_enabled() || !any) return fn(inputs);
  auto st = c10::make_intrusive<State>();
  st->fn = fn;
  st->name = name;
  st->num_inputs = inputs.size();
  st->params = params;
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), params.begin(), params.end());
  return CheckpointFunction::apply(at::TensorList(all), st);
}

}  // namespace accel::sharding
