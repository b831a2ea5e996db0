// A DeepSpeed config's optimizer and scheduler blocks (optim/from_config.h): which torch optimizer
// each type is, with DeepSpeed's defaults and "auto" filled from the program's, the schedules, and
// an error for every block DeepSpeed would not run or accel cannot build.
#include "optim/from_config.h"

#include "base/error.h"
#include "optim/lr_schedules.h"

#include <ATen/ops/zeros.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace accel::optim {
namespace {

ConfigValue num(double v) {
  ConfigValue c;
  c.number = v;
  c.text = std::to_string(v);
  return c;
}
ConfigValue nums(std::vector<double> v) {
  ConfigValue c;
  c.kind = ConfigValue::Kind::Numbers;
  c.numbers = std::move(v);
  c.text = "[...]";
  return c;
}
ConfigValue flag(bool b) {
  ConfigValue c;
  c.kind = ConfigValue::Kind::Bool;
  c.flag = b;
  c.text = b ? "true" : "false";
  return c;
}
ConfigValue text(std::string s) {
  ConfigValue c;
  c.kind = s == "auto" ? ConfigValue::Kind::Auto : ConfigValue::Kind::String;
  c.text = std::move(s);
  return c;
}

ConfigBlock block(const std::string& name, const std::string& type,
                  std::vector<std::pair<std::string, ConfigValue>> params = {}) {
  return ConfigBlock{name, type, std::move(params)};
}

std::vector<at::Tensor> params() { return {at::zeros({3})}; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const accel::InvalidArgumentError& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(OptimizerFromConfig, AdamIsAdamWUnlessAdamWModeIsFalse) {
  const ConfigBlock adam = block("optimizer", "Adam");
  auto a = make_optimizer(&adam, params(), {});
  const auto* w = dynamic_cast<torch::optim::AdamW*>(a.get());
  ASSERT_NE(w, nullptr);
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(w->defaults());
  EXPECT_DOUBLE_EQ(o.lr(), 1e-3);  // FusedAdam's defaults
  EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.9);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.999);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-8);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.0);

  const ConfigBlock l2 = block("optimizer", "adam", {{"adam_w_mode", flag(false)}, {"weight_decay", num(0.1)}});
  auto b = make_optimizer(&l2, params(), {});
  ASSERT_NE(dynamic_cast<torch::optim::Adam*>(b.get()), nullptr);
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::AdamOptions&>(b->defaults()).weight_decay(), 0.1);

  // "AdamW" is AdamW whatever adam_w_mode says; with torch_adam, torch's default weight decay (0.01).
  const ConfigBlock aw = block("optimizer", "ADAMW", {{"adam_w_mode", flag(false)}, {"torch_adam", flag(true)}});
  auto c = make_optimizer(&aw, params(), {});
  ASSERT_NE(dynamic_cast<torch::optim::AdamW*>(c.get()), nullptr);
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::AdamWOptions&>(c->defaults()).weight_decay(), 0.01);
  const ConfigBlock at = block("optimizer", "Adam", {{"torch_adam", flag(true)}});  // torch.optim.AdamW too
  EXPECT_DOUBLE_EQ(
      static_cast<const torch::optim::AdamWOptions&>(make_optimizer(&at, params(), {})->defaults()).weight_decay(),
      0.01);
}

TEST(OptimizerFromConfig, AutoTakesTheProgramsValues) {
  const ConfigBlock b = block("optimizer", "AdamW",
                              {{"lr", text("auto")},
                               {"betas", text("auto")},
                               {"eps", text("auto")},
                               {"weight_decay", text("auto")},
                               {"amsgrad", flag(true)}});
  auto opt = make_optimizer(&b, params(), {.lr = 3e-4, .weight_decay = 0.1, .betas = {0.9, 0.95}, .eps = 1e-6});
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(opt->defaults());
  EXPECT_DOUBLE_EQ(o.lr(), 3e-4);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.95);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-6);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.1);
  EXPECT_TRUE(o.amsgrad());
  EXPECT_EQ(describe(*opt), "AdamW (lr 0.0003, betas [0.9, 0.95], eps 1e-06, weight_decay 0.1, amsgrad)");
  EXPECT_HAS(error_of([] {
               const ConfigBlock x = block("optimizer", "SGD", {{"dampening", text("auto")}});
               make_optimizer(&x, params(), {});
             }),
             "optimizer.params.dampening is 'auto', which has no value here");
  const ConfigBlock sgd = block("optimizer", "SGD", {{"momentum", text("auto")}});
  EXPECT_DOUBLE_EQ(
      static_cast<const torch::optim::SGDOptions&>(make_optimizer(&sgd, params(), {.momentum = 0.8})->defaults())
          .momentum(),
      0.8);
}

TEST(OptimizerFromConfig, GroupsKeepTheirOwnLearningRateAndWeightDecay) {
  const ConfigBlock b = block("optimizer", "AdamW", {{"lr", num(0.01)}, {"weight_decay", num(0.1)}});
  auto opt =
      make_optimizer(&b, std::vector<ParamGroup>{{params()}, {params(), std::nullopt, 0.0}, {params(), 0.5}}, {});
  ASSERT_EQ(opt->param_groups().size(), 3u);
  auto wd = [&](std::size_t g) {
    return static_cast<const torch::optim::AdamWOptions&>(opt->param_groups()[g].options()).weight_decay();
  };
  EXPECT_DOUBLE_EQ(wd(0), 0.1);
  EXPECT_DOUBLE_EQ(wd(1), 0.0);  // a group without weight decay
  EXPECT_DOUBLE_EQ(wd(2), 0.1);
  EXPECT_DOUBLE_EQ(opt->param_groups()[1].options().get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(opt->param_groups()[2].options().get_lr(), 0.5);
}

TEST(OptimizerFromConfig, TorchOptimizersTakeTheirParameters) {
  const ConfigBlock sgd =
      block("optimizer", "SGD",
            {{"lr", num(0.1)}, {"momentum", num(0.9)}, {"nesterov", flag(true)}, {"weight_decay", num(1e-4)}});
  auto s = make_optimizer(&sgd, params(), {});
  const auto& so = static_cast<const torch::optim::SGDOptions&>(dynamic_cast<torch::optim::SGD&>(*s).defaults());
  EXPECT_DOUBLE_EQ(so.lr(), 0.1);
  EXPECT_DOUBLE_EQ(so.momentum(), 0.9);
  EXPECT_TRUE(so.nesterov());
  EXPECT_DOUBLE_EQ(so.weight_decay(), 1e-4);

  const ConfigBlock ada = block("optimizer", "Adagrad", {{"lr_decay", num(0.01)}});
  auto a = make_optimizer(&ada, params(), {});
  const auto& ao =
      static_cast<const torch::optim::AdagradOptions&>(dynamic_cast<torch::optim::Adagrad&>(*a).defaults());
  EXPECT_DOUBLE_EQ(ao.lr(), 1e-2);  // torch.optim.Adagrad's defaults
  EXPECT_DOUBLE_EQ(ao.eps(), 1e-10);
  EXPECT_DOUBLE_EQ(ao.lr_decay(), 0.01);

  const ConfigBlock rms = block("optimizer", "rmsprop", {{"centered", flag(true)}, {"alpha", num(0.9)}});
  auto r = make_optimizer(&rms, params(), {});
  const auto& ro =
      static_cast<const torch::optim::RMSpropOptions&>(dynamic_cast<torch::optim::RMSprop&>(*r).defaults());
  EXPECT_DOUBLE_EQ(ro.lr(), 1e-2);
  EXPECT_DOUBLE_EQ(ro.alpha(), 0.9);
  EXPECT_TRUE(ro.centered());
}

TEST(OptimizerFromConfig, WithoutABlockTheProgramsDefaultsDecide) {
  auto a = make_optimizer(nullptr, params(), {.lr = 0.02, .weight_decay = 0.05});
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(dynamic_cast<torch::optim::AdamW&>(*a).defaults());
  EXPECT_DOUBLE_EQ(o.lr(), 0.02);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.05);
  auto s = make_optimizer(nullptr, params(), {.type = "SGD", .lr = 0.5, .momentum = 0.9});
  const auto& so = static_cast<const torch::optim::SGDOptions&>(dynamic_cast<torch::optim::SGD&>(*s).defaults());
  EXPECT_DOUBLE_EQ(so.lr(), 0.5);
  EXPECT_DOUBLE_EQ(so.momentum(), 0.9);
  auto g = make_optimizer(nullptr, params(), {.type = "Adagrad"});
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::AdagradOptions&>(g->defaults()).eps(), 1e-10);
  EXPECT_HAS(error_of([] { make_optimizer(nullptr, params(), {.type = "Lion"}); }), "not one accel builds");
}

TEST(OptimizerFromConfig, BlocksItCannotBuildAreRefusedWithTheKey) {
  auto check = [](ConfigBlock b) { return error_of([&] { check_optimizer_block(b); }); };
  EXPECT_HAS(check(block("optimizer", "Lamb")),
             "optimizer type 'Lamb' is not one accel builds; use one of Adam, AdamW");
  EXPECT_HAS(check(block("optimizer", "Adamm")), "unknown optimizer type 'Adamm'");
  EXPECT_HAS(check(block("optimizer", "AdamW", {{"betas", nums({0.9})}})),
             "optimizer.params.betas is '[...]', expected two numbers in [0, 1)");
  EXPECT_HAS(check(block("optimizer", "AdamW", {{"lr", num(-1)}})), "optimizer.params.lr is '-1.000000', expected");
  EXPECT_HAS(check(block("optimizer", "AdamW", {{"lr", text("3e-4")}})), "optimizer.params.lr is '3e-4'");
  EXPECT_HAS(check(block("optimizer", "AdamW", {{"weight_decy", num(0.1)}})),
             "unknown key 'optimizer.params.weight_decy' for optimizer 'AdamW'; did you mean 'weight_decay'?");
  EXPECT_HAS(check(block("optimizer", "AdamW", {{"bias_correction", flag(false)}})), "always correct the bias");
  EXPECT_HAS(check(block("optimizer", "SGD", {{"nesterov", flag(true)}})), "nesterov needs a momentum > 0");
  // ("auto" momentum is the program's: the file alone cannot be refused for it.)
  EXPECT_EQ(check(block("optimizer", "SGD", {{"nesterov", flag(true)}, {"momentum", text("auto")}})), "(no error)");
  EXPECT_HAS(check(block("optimizer", "AdamW", {{"max_grad_norm", num(1)}})), "use the top-level gradient_clipping");
  EXPECT_HAS(check(block("optimizer", "AdamW", {{"lr", num(0.1)}, {"lr", num(0.2)}})), "'lr' is given twice");
  EXPECT_EQ(check(block("optimizer", "AdamW", {{"lr", text("auto")}, {"torch_adam", flag(false)}})), "(no error)");
  // torch's and DeepSpeed's implementation switches are accepted; maximize, which changes the sign, is not.
  EXPECT_EQ(check(block("optimizer", "AdamW",
                        {{"foreach", flag(true)}, {"fused", flag(false)}, {"set_grad_none", flag(true)}})),
            "(no error)");
  EXPECT_EQ(check(block("optimizer", "Adagrad", {{"adam_w_mode", flag(true)}})), "(no error)");
  EXPECT_HAS(check(block("optimizer", "SGD", {{"maximize", flag(true)}})), "only minimize");
  EXPECT_HAS(check(block("optimizer", "Adam", {{"fp32_optimizer_states", flag(false)}})), "in fp32");
}

double current_lr(const torch::optim::Optimizer& o) { return o.param_groups()[0].options().get_lr(); }

TEST(SchedulerFromConfig, DeepSpeedsScheduleWithAutoFromTheProgram) {
  torch::optim::AdamW opt(params(), torch::optim::AdamWOptions(0.1));
  const ConfigBlock b = block("scheduler", "WarmupDecayLR",
                              {{"warmup_min_lr", text("auto")},
                               {"warmup_max_lr", text("auto")},
                               {"warmup_num_steps", text("auto")},
                               {"total_num_steps", text("auto")},
                               {"warmup_type", text("linear")}});
  auto s = make_scheduler(&b, opt, {.total_num_steps = 12, .warmup_num_steps = 4});
  ASSERT_NE(dynamic_cast<WarmupDecayLR*>(s.get()), nullptr);
  EXPECT_DOUBLE_EQ(current_lr(opt), 0.0);  // warmup_min_lr "auto": 0
  for (int k = 0; k < 3; ++k) s->step();
  EXPECT_DOUBLE_EQ(current_lr(opt), 0.05);  // i = 2: 2/4 of the optimizer's 0.1
  for (int k = 0; k < 6; ++k) s->step();
  EXPECT_DOUBLE_EQ(current_lr(opt), 0.1 * 4 / 8);  // i = 8: (12 - 8) / (12 - 4)

  EXPECT_HAS(error_of([&] { make_scheduler(&b, opt, {.warmup_num_steps = 4}); }),
             "scheduler.params.total_num_steps is 'auto': give the program's SchedulerDefaults::total_num_steps");
  const ConfigBlock none = block("scheduler", "WarmupCosineLR");
  EXPECT_HAS(error_of([&] { make_scheduler(&none, opt, {}); }), "WarmupCosineLR needs total_num_steps");
  // check_scheduler_block takes an "auto" total as known: only the program can give it.
  EXPECT_EQ(error_of([&] { check_scheduler_block(b); }), "(no error)");
}

TEST(SchedulerFromConfig, WithoutABlockTheLearningRateStaysOrTheProgramsTypeRuns) {
  torch::optim::SGD opt(params(), torch::optim::SGDOptions(0.3));
  auto s = make_scheduler(nullptr, opt, {});
  for (int k = 0; k < 4; ++k) s->step();
  EXPECT_DOUBLE_EQ(current_lr(opt), 0.3);
  // The program's WarmupDecayLR without warmup: from the optimizer's 0.3 down to 0 at step 10.
  auto d = make_scheduler(nullptr, opt, {.type = "WarmupDecayLR", .total_num_steps = 10});
  EXPECT_DOUBLE_EQ(current_lr(opt), 0.3);  // no warmup: the first step already runs at the peak
  d->step();
  EXPECT_DOUBLE_EQ(current_lr(opt), 0.3);  // i = 0
  for (int k = 0; k < 5; ++k) d->step();
  EXPECT_DOUBLE_EQ(current_lr(opt), 0.3 * 5 / 10);  // i = 5
  EXPECT_HAS(error_of([&] { make_scheduler(nullptr, opt, {.type = "OneCycle"}); }),
             "SchedulerDefaults::type 'OneCycle': without a scheduler block");
}

TEST(SchedulerFromConfig, ValuesPerGroupAreCheckedAgainstTheProgramsOptimizer) {
  const ConfigBlock b = block("scheduler", "WarmupLR", {{"warmup_min_lr", nums({0.0, 0.01})}});
  EXPECT_EQ(error_of([&] { check_scheduler_block(b); }), "(no error)");  // (the file does not know the groups)
  EXPECT_HAS(error_of([] {
               check_scheduler_block(block("scheduler", "WarmupLR",
                                           {{"warmup_min_lr", nums({0.0, 0.01})}, {"warmup_max_lr", nums({1, 2, 3})}}));
             }),
             "scheduler.params: warmup_min_lr has 2 values and warmup_max_lr has 3");
  torch::optim::SGD one(params(), torch::optim::SGDOptions(0.3));
  EXPECT_HAS(error_of([&] { make_scheduler(&b, one, {}); }),
             "scheduler.params.warmup_min_lr: 2 values for 1 param groups");
  std::vector<torch::optim::OptimizerParamGroup> gs;
  gs.emplace_back(params());
  gs.emplace_back(params());
  torch::optim::SGD two(std::move(gs), torch::optim::SGDOptions(0.3));
  make_scheduler(&b, two, {});
  EXPECT_DOUBLE_EQ(two.param_groups()[1].options().get_lr(), 0.01);
}

TEST(SchedulerFromConfig, BlocksItCannotBuildAreRefusedWithTheKey) {
  auto check = [](ConfigBlock b) { return error_of([&] { check_scheduler_block(b); }); };
  EXPECT_HAS(check(block("scheduler", "StepLR")), "unknown scheduler type 'StepLR'; expected one of WarmupLR");
  // A stair count of -1 (DeepSpeed's command-line default) is no stairs.
  EXPECT_EQ(check(block("scheduler", "OneCycle",
                        {{"cycle_min_lr", num(0.1)}, {"cycle_max_lr", num(1)}, {"cycle_first_stair_count", num(-1)}})),
            "(no error)");
  EXPECT_HAS(check(block("scheduler", "WarmupLR", {{"warmup_type", text("cosine")}})),
             "scheduler.params.warmup_type is 'cosine', expected log or linear");
  EXPECT_HAS(check(block("scheduler", "WarmupLR", {{"warmup_num_steps", num(0)}})),
             "scheduler.params.warmup_num_steps is '0.000000', expected an integer >= 1");
  EXPECT_HAS(check(block("scheduler", "WarmupLR", {{"last_batch_iteration", num(5)}})),
             "resumes it from its checkpoints");
  EXPECT_HAS(check(block("scheduler", "OneCycle", {{"cycle_min_lr", num(0.1)}})),
             "OneCycle needs cycle_min_lr and cycle_max_lr");
  EXPECT_HAS(check(block("scheduler", "WarmupLR", {{"warmup_max_lrr", num(0.1)}})), "did you mean 'warmup_max_lr'?");
  EXPECT_EQ(check(block("scheduler", "onecycle", {{"cycle_min_lr", num(0.1)}, {"cycle_max_lr", num(1)}})),
            "(no error)");
}

}  // namespace
}  // namespace accel::optim
