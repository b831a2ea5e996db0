// The device optimizer step (multi_tensor_step.h).
#include "optim/multi_tensor_step.h"
#include "optim/torch_state.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <map>
#include <optional>
#include <vector>

namespace accel::optim {
namespace {

// Contiguous float32 with `numel` elements on `device` (set from the first tensor seen).
bool same_place(const at::Tensor& t, std::int64_t numel, std::optional<c10::Device>& device) {
  if (!t.defined() || t.is_sparse() || t.scalar_type() != at::kFloat || !t.is_contiguous() || t.numel() != numel)
    return false;
  if (!device) device = t.device();
  return t.device() == *device;
}

template <class Options, class State>
bool placeable(torch::optim::Optimizer& opt, bool any_device) {
  std::optional<c10::Device> device;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!same_place(p, p.numel(), device) || !same_place(p.grad(), p.numel(), device)) return false;
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;
      auto* st = dynamic_cast<State*>(it->second.get());
      if (st == nullptr) return false;
      if constexpr (std::is_same_v<State, torch::optim::SGDParamState>) {
        if (!same_place(st->momentum_buffer(), p.numel(), device)) return false;
      } else {
        if (!same_place(st->exp_avg(), p.numel(), device) || !same_place(st->exp_avg_sq(), p.numel(), device))
          return false;
        if (static_cast<const Options&>(group.options()).amsgrad() &&
            !same_place(st->max_exp_avg_sq(), p.numel(), device))
          return false;
      }
    }
  return device && (any_device || !device->is_cpu());
}

template <class Options, class State>
bool multi_adam(torch::optim::Optimizer& opt, bool decoupled, bool any_device) {
  if (!placeable<Options, State>(opt, any_device)) return false;
  at::NoGradGuard no_grad;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, maxes, steps;
    std::map<std::int64_t, at::Tensor> step_of;  // one step tensor per distinct step count (read only)
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& st = detail::adam_state<State>(opt, p, o.amsgrad());
      st.step(st.step() + 1);  // torch counts first, then steps with the new count
      auto& s = step_of[st.step()];
      if (!s.defined()) s = at::full({}, static_cast<double>(st.step()), p.options());
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      if (o.amsgrad()) maxes.push_back(st.max_exp_avg_sq());
      steps.push_back(s);
    }
    if (params.empty()) continue;
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    if (decoupled)
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, maxes, steps, o.lr(), beta1, beta2, o.weight_decay(),
                        o.eps(), o.amsgrad(), /*maximize=*/false);
    else
      at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, maxes, steps, o.lr(), beta1, beta2, o.weight_decay(),
                       o.eps(), o.amsgrad(), /*maximize=*/false);
  }
  return true;
}

bool multi_sgd(torch::optim::SGD& opt, bool any_device) {
  if (!placeable<torch::optim::SGDOptions, torch::optim::SGDParamState>(opt, any_device)) return false;
  at::NoGradGuard no_grad;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    // Parameters whose momentum buffer exists, and those whose first step makes it (torch: buf =
    // d_p.clone()): two calls, as is_first_step is one flag per call.
    std::vector<at::Tensor> params[2], grads[2], bufs[2];
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      int first = 0;
      at::Tensor buf;
      if (o.momentum() != 0) {
        auto it = opt.state().find(p.unsafeGetTensorImpl());
        if (it == opt.state().end()) {
          first = 1;
          buf = at::empty_like(p.grad(), at::MemoryFormat::Preserve);
          auto st = std::make_unique<torch::optim::SGDParamState>();
          st->momentum_buffer(buf);
          opt.state()[p.unsafeGetTensorImpl()] = std::move(st);
        } else {
          buf = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
        }
        bufs[first].push_back(buf);
      }
      params[first].push_back(p);
      grads[first].push_back(p.grad());
    }
    for (int first : {0, 1})
      if (!params[first].empty())
        at::_fused_sgd_(params[first], grads[first], bufs[first], o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                        o.nesterov(), /*maximize=*/false, /*is_first_step=*/first == 1);
  }
  return true;
}

}  // namespace

bool multi_tensor_step(torch::optim::Optimizer& opt, const std::type_info& type, bool any_device) {
  if (type == typeid(torch::optim::AdamW))
    return multi_adam<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt, true, any_device);
  if (type == typeid(torch::optim::Adam))
    return multi_adam<torch::optim::AdamOptions, torch::optim::AdamParamState>(opt, false, any_device);
  if (type == typeid(torch::optim::SGD)) return multi_sgd(dynamic_cast<torch::optim::SGD&>(opt), any_device);
  return false;
}

}  // namespace accel::optim
