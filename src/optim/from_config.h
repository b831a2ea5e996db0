// accel::optim::make_optimizer / make_scheduler — the optimizer and the learning-rate schedule a
// DeepSpeed config's "optimizer" and "scheduler" blocks name (config_block.h), built as DeepSpeed
// builds them, for Accelerator::create_optimizer / create_scheduler (Accelerate's DummyOptim and
// DummyScheduler path: the config file, not the program, says which optimizer and schedule run).
//
// Optimizers (type in any case): Adam, AdamW, SGD, Adagrad, RMSprop — the ones accel shards
// (zero/optimizers.h). As in DeepSpeed:
//   * "Adam" is AdamW (decoupled weight decay) unless params.adam_w_mode is false; "AdamW" always is;
//   * Adam's and AdamW's defaults are DeepSpeed's FusedAdam's (lr 1e-3, betas [0.9, 0.999], eps 1e-8,
//     weight_decay 0), or torch's (AdamW weight_decay 0.01) with params.torch_adam true;
//   * SGD, Adagrad and RMSprop take torch.optim's parameters and defaults.
// DeepSpeed's own optimizers (Lamb, Lion, OneBitAdam, ...) and other torch.optim names are refused
// with the list above. "auto" (Hugging Face's convention) takes the program's value for lr, betas,
// eps, weight_decay and momentum (OptimizerDefaults) and is an error anywhere else. Keys that only
// choose torch's implementation (foreach, fused, capturable, set_grad_none) are accepted.
// More lenient than DeepSpeed: type names in any case, and amsgrad without torch_adam.
//
// Schedules: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest
// (lr_schedules.h), their params and defaults DeepSpeed's. "auto": warmup_min_lr 0, warmup_max_lr the
// optimizer's learning rate (Accelerate's is the program's, the same unless the optimizer block sets
// lr), warmup_num_steps and total_num_steps the program's (SchedulerDefaults; total_num_steps counts
// optimizer steps, each of which steps the schedule once).
//
// Without a block, the program's defaults decide: OptimizerDefaults::type with its values, and
// SchedulerDefaults::type ("" : a constant learning rate, as DeepSpeed runs without a scheduler).
// Every error is an InvalidArgumentError naming the key ("optimizer.params.betas: ...").
#pragma once

#include "optim/config_block.h"

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
class LRScheduler;
}  // namespace torch::optim

namespace accel::optim {

// The program's optimizer: what "auto" means, and what runs when the config has no optimizer block.
struct OptimizerDefaults {
  std::string type = "AdamW";  // Adam | AdamW | SGD | Adagrad | RMSprop (any case)
  double lr = 1e-3;
  double weight_decay = 0.0;
  std::array<double, 2> betas{0.9, 0.999};  // Adam, AdamW
  double eps = 1e-8;                        // Adam, AdamW, RMSprop; Adagrad keeps its 1e-10 unless "auto"
  double momentum = 0.0;                    // SGD, RMSprop (a block's "auto" momentum too)
};

// The program's schedule: what "auto" means, and what runs when the config has no scheduler block.
struct SchedulerDefaults {
  std::string type{};                 // "" (constant lr), WarmupLR, WarmupDecayLR or WarmupCosineLR
  std::int64_t total_num_steps = 0;   // optimizer steps in the run (WarmupDecayLR, WarmupCosineLR); 0: unknown
  std::int64_t warmup_num_steps = 0;  // 0: no warmup
};

// A param group as a program gives it: its tensors, and what it sets apart from the optimizer's
// options (Accelerate's DummyOptim groups: {"params": ..., "weight_decay": 0.0}).
struct ParamGroup {
  std::vector<at::Tensor> params;
  std::optional<double> lr{};
  std::optional<double> weight_decay{};
};

// Whether the block is one make_* can build: the type, each key, each value. Throws what make_* would,
// except for what only the program's defaults decide ("auto" total_num_steps).
void check_optimizer_block(const ConfigBlock& block);
void check_scheduler_block(const ConfigBlock& block);

// block null: the defaults' type.
std::shared_ptr<torch::optim::Optimizer> make_optimizer(const ConfigBlock* block, const std::vector<at::Tensor>& params,
                                                        const OptimizerDefaults& defaults);
std::shared_ptr<torch::optim::Optimizer> make_optimizer(const ConfigBlock* block, const std::vector<ParamGroup>& groups,
                                                        const OptimizerDefaults& defaults);
// warn: log what DeepSpeed warns about (a schedule shorter than its warmup; OneCycle's momentum cycle
// off for an optimizer without betas), as the main process does.
std::shared_ptr<torch::optim::LRScheduler> make_scheduler(const ConfigBlock* block, torch::optim::Optimizer& optimizer,
                                                          const SchedulerDefaults& defaults, bool warn = true);

// "AdamW (lr 0.0003, betas [0.9, 0.95], eps 1e-08, weight_decay 0.1)", for the log.
std::string describe(const torch::optim::Optimizer& optimizer);

}  // namespace accel::optim
