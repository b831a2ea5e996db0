#include "zero/optimizers.h"
#include "base/error.h"

#include "base/memory.h"
#include "optim/fused_step.h"
#include "zero/engine.h"

#include <ATen/record_function.h>
#include <c10/util/Type.h>
#include <fmt/format.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <type_traits>

namespace accel::zero {
namespace {

namespace optim = torch::optim;
using Tensors = std::map<std::string, at::Tensor>;

OffloadRule rule_of(const optim::OptimizerOptions& options);

// The user's optimizer type, stepping master shards, bracketed by the engine.
template <class Opt, class Options>
class Sharded final : public Opt {
 public:
  Sharded(const std::vector<optim::OptimizerParamGroup>& groups, const Options& defaults,
          std::shared_ptr<Engine> engine)
      : Opt(groups, defaults), engine_(std::move(engine)) {
    if (!engine_->spec().step_in_backward) return;
    // The engine steps each master alone as its gradient is final: the fused CPU kernels' step of one
    // parameter, which exist for these three.
    constexpr bool fused =
        std::is_same_v<Opt, optim::Adam> || std::is_same_v<Opt, optim::AdamW> || std::is_same_v<Opt, optim::SGD>;
    if (!fused)
      throw InvalidArgumentError(fmt::format(
          "step_in_backward steps each shard with accel's fused CPU kernels, which exist for Adam, AdamW and SGD; "
          "the optimizer is {}",
          c10::demangle(typeid(Opt).name())));
    engine_->set_step_one(
        [this](const at::Tensor& master) { return accel::optim::fused_step_param(*this, typeid(Opt), master); });
  }
  ~Sharded() override {
    if (!engine_->spec().step_in_backward) return;
    try {
      engine_->set_step_one(nullptr);  // (after the steps still running on this optimizer)
    } catch (...) {
    }
  }

  at::Tensor step(optim::Optimizer::LossClosure closure = nullptr) override {
    RECORD_USER_SCOPE("accel::optimizer_step");       // (the engine's before/after and the sharded step)
    if (closure && engine_->spec().step_in_backward)  // (its backward would step the masters, then this again)
      throw InvalidArgumentError(
          "step(closure) with step_in_backward: the closure's backward already steps each shard; call backward, "
          "then step() without a closure");
    engine_->before_step();
    try {
      return sharded_step(std::move(closure));
    } catch (const std::exception& e) {
      engine_->step_failed(e.what());  // (the peers are inside the step's collectives: the job ends)
      throw;
    }
  }

 private:
  at::Tensor sharded_step(optim::Optimizer::LossClosure closure) {
    at::Tensor loss;
    // The masters the engine stepped in backward (step_in_backward) are left out: without their
    // gradients for the step, every optimizer skips them; the gradients are back afterwards.
    struct Hidden {
      std::vector<std::pair<at::Tensor, at::Tensor>> grads;
      ~Hidden() {
        for (auto& [m, g] : grads) m.mutable_grad() = g;
      }
    } hidden;
    for (const at::Tensor& m : engine_->stepped_in_backward()) {
      at::Tensor master = m;
      hidden.grads.emplace_back(master, master.grad());
      master.mutable_grad() = at::Tensor();
    }
    {
      memory::CategoryScope cat(memory::Category::OptimizerState);
      if (engine_->optimizer_offload()) {
        if (closure) {
          at::AutoGradMode grad(true);
          loss = closure();
          engine_->before_param_writes();  // the closure's forward read the node-shared parameters
        }
        std::vector<OffloadRule> rules;
        for (const auto& g : this->param_groups())
          rules.push_back(rule_of(g.has_options() ? g.options() : this->defaults()));
        engine_->offloaded_step(rules);
      } else if (closure || !accel::optim::fused_step_as(*this, typeid(Opt))) {  // (Opt's own arithmetic)
        // torch's optimizers call the closure before they write: with node-shared parameters no rank
        // may write its shard while a peer's closure still runs forward over it.
        optim::Optimizer::LossClosure after = closure;
        if (closure)
          after = [this, closure] {
            at::Tensor l = closure();
            engine_->before_param_writes();
            return l;
          };
        loss = Opt::step(std::move(after));
      }
    }
    engine_->after_step();
    return loss;
  }

  std::shared_ptr<Engine> engine_;
};

// The offload rule of an optimizer's options (the rows that have fused kernels).
OffloadRule adam_rule(const optim::OptimizerOptions& options) {
  OffloadRule r;
  if (const auto* o = dynamic_cast<const optim::AdamWOptions*>(&options)) {
    r.adam = {o->lr(), std::get<0>(o->betas()), std::get<1>(o->betas()), o->eps(), o->weight_decay(), o->amsgrad(),
              true};
  } else {
    const auto& a = static_cast<const optim::AdamOptions&>(options);
    r.adam = {a.lr(), std::get<0>(a.betas()), std::get<1>(a.betas()), a.eps(), a.weight_decay(), a.amsgrad(), false};
  }
  return r;
}
OffloadRule sgd_rule(const optim::OptimizerOptions& options) {
  const auto& o = static_cast<const optim::SGDOptions&>(options);
  OffloadRule r;
  r.kind = OffloadRule::Kind::Sgd;
  r.sgd = {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov()};
  return r;
}
void fill_adam_rule(const optim::OptimizerOptions& options, OffloadRule& rule) { rule = adam_rule(options); }
void fill_sgd_rule(const optim::OptimizerOptions& options, OffloadRule& rule) { rule = sgd_rule(options); }
OffloadRule rule_of(const optim::OptimizerOptions& options) {
  if (dynamic_cast<const optim::SGDOptions*>(&options)) return sgd_rule(options);
  return adam_rule(options);
}

// Param groups over the master tensors, index-for-index the user's, with cloned options.
std::vector<optim::OptimizerParamGroup> master_groups(const optim::Optimizer& user, const Engine& e) {
  std::vector<optim::OptimizerParamGroup> groups;
  for (std::size_t g = 0; g < user.param_groups().size(); ++g) {
    std::vector<at::Tensor> params = e.optimizer_params().at(g);
    const auto& ug = user.param_groups()[g];
    if (ug.has_options())
      groups.emplace_back(params, ug.options().clone());
    else
      groups.emplace_back(params, user.defaults().clone());
  }
  return groups;
}

template <class Opt>
bool is(const optim::Optimizer& o) {
  return dynamic_cast<const Opt*>(&o) != nullptr;
}

template <class Opt, class Options>
std::shared_ptr<optim::Optimizer> make_sharded(const optim::Optimizer& user, const std::shared_ptr<Engine>& e) {
  const auto& defaults = static_cast<const Options&>(user.defaults());
  return std::make_shared<Sharded<Opt, Options>>(master_groups(user, *e), defaults, e);
}

at::Tensor get(const Tensors& t, const char* name) {
  auto it = t.find(name);
  return it == t.end() ? at::Tensor() : it->second;
}

OptimizerState named(std::initializer_list<std::pair<const char*, at::Tensor>> tensors,
                     std::optional<std::int64_t> step) {
  OptimizerState out{{}, step};
  for (const auto& [n, t] : tensors)
    if (t.defined()) out.tensors.emplace_back(n, t);
  return out;
}

// Adam and AdamW keep the same state under different types.
template <class State>
OptimizerState export_adam(optim::OptimizerParamState& p) {
  auto* s = dynamic_cast<State*>(&p);
  if (!s) return {};
  return named({{"exp_avg", s->exp_avg()}, {"exp_avg_sq", s->exp_avg_sq()}, {"max_exp_avg_sq", s->max_exp_avg_sq()}},
               s->step());
}
template <class State>
std::unique_ptr<optim::OptimizerParamState> import_adam(const Tensors& t, std::int64_t step) {
  auto s = std::make_unique<State>();
  s->step(step), s->exp_avg(get(t, "exp_avg")), s->exp_avg_sq(get(t, "exp_avg_sq"));
  s->max_exp_avg_sq(get(t, "max_exp_avg_sq"));
  return s;
}

OptimizerState export_sgd(optim::OptimizerParamState& p) {
  auto* s = dynamic_cast<optim::SGDParamState*>(&p);
  return s ? named({{"momentum_buffer", s->momentum_buffer()}}, std::nullopt) : OptimizerState{};
}
std::unique_ptr<optim::OptimizerParamState> import_sgd(const Tensors& t, std::int64_t) {
  auto s = std::make_unique<optim::SGDParamState>();
  s->momentum_buffer(get(t, "momentum_buffer"));
  return s;
}

OptimizerState export_rmsprop(optim::OptimizerParamState& p) {
  auto* s = dynamic_cast<optim::RMSpropParamState*>(&p);
  if (!s) return {};
  return named(
      {{"square_avg", s->square_avg()}, {"momentum_buffer", s->momentum_buffer()}, {"grad_avg", s->grad_avg()}},
      s->step());
}
std::unique_ptr<optim::OptimizerParamState> import_rmsprop(const Tensors& t, std::int64_t step) {
  auto s = std::make_unique<optim::RMSpropParamState>();
  s->step(step), s->square_avg(get(t, "square_avg")), s->momentum_buffer(get(t, "momentum_buffer"));
  s->grad_avg(get(t, "grad_avg"));
  return s;
}

OptimizerState export_adagrad(optim::OptimizerParamState& p) {
  auto* s = dynamic_cast<optim::AdagradParamState*>(&p);
  return s ? named({{"sum", s->sum()}}, s->step()) : OptimizerState{};
}
std::unique_ptr<optim::OptimizerParamState> import_adagrad(const Tensors& t, std::int64_t step) {
  auto s = std::make_unique<optim::AdagradParamState>();
  s->step(step), s->sum(get(t, "sum"));
  return s;
}

const OptimizerRow kRows[] = {
    {"Adam", is<optim::Adam>, make_sharded<optim::Adam, optim::AdamOptions>, export_adam<optim::AdamParamState>,
     import_adam<optim::AdamParamState>, fill_adam_rule},
    {"AdamW", is<optim::AdamW>, make_sharded<optim::AdamW, optim::AdamWOptions>, export_adam<optim::AdamWParamState>,
     import_adam<optim::AdamWParamState>, fill_adam_rule},
    {"SGD", is<optim::SGD>, make_sharded<optim::SGD, optim::SGDOptions>, export_sgd, import_sgd, fill_sgd_rule},
    {"RMSprop", is<optim::RMSprop>, make_sharded<optim::RMSprop, optim::RMSpropOptions>, export_rmsprop, import_rmsprop,
     nullptr},
    {"Adagrad", is<optim::Adagrad>, make_sharded<optim::Adagrad, optim::AdagradOptions>, export_adagrad, import_adagrad,
     nullptr},
};

}  // namespace

std::span<const OptimizerRow> optimizer_rows() { return kRows; }

const OptimizerRow* find_optimizer_row(const torch::optim::Optimizer& o) {
  for (const auto& r : kRows)
    if (r.is(o)) return &r;
  return nullptr;
}

std::string optimizer_names(const char* conjunction) {
  std::string out;
  const std::size_t n = std::size(kRows);
  for (std::size_t i = 0; i < n; ++i)
    out += std::string(i == 0 ? "" : i + 1 == n ? std::string(" ") + conjunction + " " : ", ") + kRows[i].name;
  return out;
}

}  // namespace accel::zero
