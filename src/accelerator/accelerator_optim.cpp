// Accelerator::create_optimizer / create_scheduler (accelerator.h): the optimizer and the schedule a
// DeepSpeed config's blocks name, built by optim/from_config.h.
#include "accelerator/accelerator.h"

#include "base/error.h"
#include "base/log.h"

#include <fmt/format.h>

namespace accel {

namespace {
std::string config_name(const AcceleratorConfig& cfg) { return cfg.source.empty() ? "the config" : cfg.source; }

// build() with its errors named: the config file's where the block decided, else the program's call.
template <class F>
auto built(const AcceleratorConfig& cfg, const std::optional<optim::ConfigBlock>& block, const char* call, F&& build)
    -> decltype(build(nullptr)) {
  try {
    return build(block ? &*block : nullptr);
  } catch (const ConfigError&) {
    throw;
  } catch (const accel::InvalidArgumentError& e) {
    if (!block) throw accel::InvalidArgumentError(fmt::format("Accelerator::{}: {}", call, e.what()));
    throw ConfigError(fmt::format("{}: {}", config_name(cfg), e.what()));
  }
}
}  // namespace

std::shared_ptr<torch::optim::Optimizer> Accelerator::create_optimizer(const std::vector<at::Tensor>& params,
                                                                       const optim::OptimizerDefaults& defaults) {
  return create_optimizer(std::vector<optim::ParamGroup>{optim::ParamGroup{params}}, defaults);
}

std::shared_ptr<torch::optim::Optimizer> Accelerator::create_optimizer(const std::vector<optim::ParamGroup>& groups,
                                                                       const optim::OptimizerDefaults& defaults) {
  auto opt = built(cfg_, cfg_.optimizer, "create_optimizer",
                   [&](const optim::ConfigBlock* b) { return optim::make_optimizer(b, groups, defaults); });
  created_optimizer_ = opt;
  if (is_main_process())
    log::info(fmt::format("optimizer: {} ({})", optim::describe(*opt),
                          cfg_.optimizer ? "the optimizer block of " + config_name(cfg_) : "the program's defaults"));
  return opt;
}

std::shared_ptr<AcceleratedScheduler> Accelerator::create_scheduler(const optim::SchedulerDefaults& defaults) {
  if (!optimizer_)
    throw accel::LogicError(
        "Accelerator::create_scheduler: prepare the model and optimizer first (the schedule "
        "steps the prepared optimizer)");
  auto s = built(cfg_, cfg_.scheduler, "create_scheduler", [&](const optim::ConfigBlock* b) {
    return optim::make_scheduler(b, *optimizer_, defaults, is_main_process());
  });
  if (is_main_process() && (cfg_.scheduler || !defaults.type.empty()))
    log::info(fmt::format("scheduler: {} ({})", cfg_.scheduler ? cfg_.scheduler->type : defaults.type,
                          cfg_.scheduler ? "the scheduler block of " + config_name(cfg_) : "the program's defaults"));
  creating_scheduler_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{creating_scheduler_};
  return prepare_scheduler(std::move(s));
}

}  // namespace accel
