#include "zero/sharded_optimizer.h"

#include "base/memory.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

namespace accel::zero {
namespace {

// The user's optimizer type, stepping master shards, bracketed by the engine.
template <class Opt, class Options>
class Sharded final : public Opt {
 public:
  Sharded(const std::vector<torch::optim::OptimizerParamGroup>& groups, const Options& defaults,
          std::shared_ptr<Engine> engine)
      : Opt(groups, defaults), engine_(std::move(engine)) {}

  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    engine_->before_step();
    at::Tensor loss;
    {
      memory::CategoryScope cat(memory::Category::OptimizerState);
      loss = Opt::step(std::move(closure));
    }
    engine_->after_step();
    return loss;
  }

 private:
  std::shared_ptr<Engine> engine_;
};

// Param groups over the master tensors, index-for-index the user's, with cloned options.
std::vector<torch::optim::OptimizerParamGroup> master_groups(const torch::optim::Optimizer& user, const Engine& e) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
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

template <class Opt, class Options>
std::shared_ptr<torch::optim::Optimizer> try_make(const torch::optim::Optimizer& user, const std::shared_ptr<Engine>& e) {
  if (!dynamic_cast<const Opt*>(&user)) return nullptr;
  const auto& defaults = static_cast<const Options&>(user.defaults());
  return std::make_shared<Sharded<Opt, Options>>(master_groups(user, *e), defaults, e);
}

std::string type_name(const torch::optim::Optimizer& o) { return c10::demangle(typeid(o).name()); }

}  // namespace

Prepared prepare(std::shared_ptr<torch::nn::Module> model, const torch::optim::Optimizer& optimizer,
                 const ShardingSpec& spec, std::shared_ptr<comm::Communicator> world) {
  if (!model) throw std::invalid_argument("accel::prepare: the model is null");
  if (dynamic_cast<const torch::optim::LBFGS*>(&optimizer))
    throw std::invalid_argument(
        "accel::prepare: torch::optim::LBFGS cannot be sharded: its line search and curvature history work on "
        "whole parameter tensors through a closure. Use Adam, AdamW, SGD, RMSprop or Adagrad");
  if (!dynamic_cast<const torch::optim::Adam*>(&optimizer) && !dynamic_cast<const torch::optim::AdamW*>(&optimizer) &&
      !dynamic_cast<const torch::optim::SGD*>(&optimizer) && !dynamic_cast<const torch::optim::RMSprop*>(&optimizer) &&
      !dynamic_cast<const torch::optim::Adagrad*>(&optimizer))
    throw std::invalid_argument("accel::prepare: optimizer type " + type_name(optimizer) +
                                " is not supported (accel rebuilds the optimizer over parameter shards and knows "
                                "how for Adam, AdamW, SGD, RMSprop and Adagrad)");
  auto engine = std::make_shared<Engine>(std::move(model), &optimizer, spec, std::move(world));
  engine->install_hooks();
  memory::CategoryScope cat(memory::Category::OptimizerState);  // Adagrad allocates its state here
  std::shared_ptr<torch::optim::Optimizer> opt;
  if (!opt) opt = try_make<torch::optim::AdamW, torch::optim::AdamWOptions>(optimizer, engine);
  if (!opt) opt = try_make<torch::optim::Adam, torch::optim::AdamOptions>(optimizer, engine);
  if (!opt) opt = try_make<torch::optim::SGD, torch::optim::SGDOptions>(optimizer, engine);
  if (!opt) opt = try_make<torch::optim::RMSprop, torch::optim::RMSpropOptions>(optimizer, engine);
  if (!opt) opt = try_make<torch::optim::Adagrad, torch::optim::AdagradOptions>(optimizer, engine);
  return {engine, opt};
}

}  // namespace accel::zero
