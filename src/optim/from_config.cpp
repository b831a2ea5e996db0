// The optimizer and schedule of a DeepSpeed config's blocks (from_config.h).
#include "optim/from_config.h"

#include "base/edit_distance.h"
#include "base/error.h"
#include "base/log.h"
#include "optim/lr_schedules.h"

#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

namespace accel::optim {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

[[noreturn]] void fail(const std::string& msg) { throw accel::InvalidArgumentError(msg); }

// The block's params, read one key at a time; finish() refuses the keys nobody read.
class Params {
 public:
  explicit Params(const ConfigBlock& b) : b_(b) {
    std::set<std::string> seen;
    for (const auto& [k, v] : b.params)
      if (!seen.insert(k).second) fail(fmt::format("{}: '{}' is given twice", key(k), k));
  }

  std::string key(const std::string& name) const { return b_.name + ".params." + name; }
  bool is_auto(const std::string& name) const {
    for (const auto& [k, v] : b_.params)
      if (k == name) return v.kind == ConfigValue::Kind::Auto;
    return false;
  }

  // Numbers; "auto" is auto_value, or an error without one.
  std::optional<double> number(const std::string& name, double lo, std::optional<double> auto_value = std::nullopt) {
    const ConfigValue* v = find(name);
    if (!v) return std::nullopt;
    if (v->kind == ConfigValue::Kind::Auto) return auto_or_fail(name, auto_value);
    if (v->kind != ConfigValue::Kind::Number || !std::isfinite(v->number) || v->number < lo)
      fail(fmt::format("{} is '{}', expected a number >= {}", key(name), v->text, lo));
    return v->number;
  }
  std::optional<std::int64_t> integer(const std::string& name, std::int64_t lo,
                                      std::optional<std::int64_t> auto_value = std::nullopt) {
    const ConfigValue* v = find(name);
    if (!v) return std::nullopt;
    if (v->kind == ConfigValue::Kind::Auto) return auto_or_fail(name, auto_value);
    if (v->kind != ConfigValue::Kind::Number || std::floor(v->number) != v->number || v->number < lo ||
        v->number > 9.0e18)
      fail(fmt::format("{} is '{}', expected an integer >= {}", key(name), v->text, lo));
    return static_cast<std::int64_t>(v->number);
  }
  std::optional<bool> boolean(const std::string& name) {
    const ConfigValue* v = find(name);
    if (!v) return std::nullopt;
    if (v->kind != ConfigValue::Kind::Bool) fail(fmt::format("{} is '{}', expected true or false", key(name), v->text));
    return v->flag;
  }
  std::optional<std::string> text(const std::string& name) {
    const ConfigValue* v = find(name);
    if (!v) return std::nullopt;
    if (v->kind != ConfigValue::Kind::String) fail(fmt::format("{} is '{}', expected a string", key(name), v->text));
    return v->text;
  }
  // A number or a list of numbers (DeepSpeed's "float or list": one per param group).
  std::optional<std::vector<double>> numbers(const std::string& name,
                                             std::optional<std::vector<double>> auto_value = std::nullopt) {
    const ConfigValue* v = find(name);
    if (!v) return std::nullopt;
    if (v->kind == ConfigValue::Kind::Auto) return auto_or_fail(name, auto_value);
    if (v->kind == ConfigValue::Kind::Number && std::isfinite(v->number) && v->number >= 0)
      return std::vector<double>{v->number};
    const bool ok =
        v->kind == ConfigValue::Kind::Numbers && !v->numbers.empty() &&
        std::all_of(v->numbers.begin(), v->numbers.end(), [](double d) { return std::isfinite(d) && d >= 0; });
    if (!ok) fail(fmt::format("{} is '{}', expected a number >= 0 or a list of them", key(name), v->text));
    return v->numbers;
  }
  // [beta1, beta2], each in [0, 1).
  std::optional<std::array<double, 2>> betas(const std::string& name, const std::array<double, 2>& auto_value) {
    const ConfigValue* v = find(name);
    if (!v) return std::nullopt;
    if (v->kind == ConfigValue::Kind::Auto) return auto_value;
    if (v->kind != ConfigValue::Kind::Numbers || v->numbers.size() != 2 ||
        std::any_of(v->numbers.begin(), v->numbers.end(), [](double d) { return !(d >= 0 && d < 1); }))
      fail(fmt::format("{} is '{}', expected two numbers in [0, 1), e.g. [0.9, 0.999]", key(name), v->text));
    return std::array<double, 2>{v->numbers[0], v->numbers[1]};
  }

  void finish(const std::vector<std::string>& valid) const {
    for (const auto& [k, v] : b_.params) {
      if (read_.count(k)) continue;
      std::string msg = fmt::format("unknown key '{}' for {} '{}'", key(k), b_.name, b_.type);
      std::string near;
      std::size_t best = 3;
      for (const auto& c : valid)
        if (const std::size_t d = edit_distance(lower(k), c); d < best) best = d, near = c;
      if (!near.empty()) msg += fmt::format("; did you mean '{}'?", near);
      fail(msg + fmt::format(" (valid keys: {})", join(valid)));
    }
  }

 private:
  const ConfigValue* find(const std::string& name) {
    for (const auto& [k, v] : b_.params)
      if (k == name) {
        read_.insert(k);
        return &v;
      }
    return nullptr;
  }
  template <class T>
  T auto_or_fail(const std::string& name, const std::optional<T>& value) const {
    if (!value)
      fail(fmt::format("{} is 'auto', which has no value here: 'auto' stands for the program's value of {}", key(name),
                       b_.name == "optimizer" ? "lr, betas, eps, weight_decay and momentum"
                                              : "warmup_min_lr, warmup_max_lr, warmup_num_steps and total_num_steps"));
    return *value;
  }

  const ConfigBlock& b_;
  std::set<std::string> read_;
};

// ---------------------------------------------------------------------------------------------------
// Optimizers

const std::vector<std::string> kOptimizers = {"Adam", "AdamW", "SGD", "Adagrad", "RMSprop"};

std::string canonical_optimizer(const std::string& type, const std::string& where) {
  for (const auto& n : kOptimizers)
    if (lower(type) == lower(n)) return n;
  static const std::set<std::string> deepspeed_own = {
      "lamb",      "onebitadam", "zerooneadam", "onebitlamb", "lion", "muon",       "muadam", "muadamw", "musgd",
      "adafactor", "adamax",     "nadam",       "radam",      "asgd", "sparseadam", "lbfgs",  "rprop",   "adadelta"};
  if (deepspeed_own.count(lower(type)))
    fail(
        fmt::format("{}: optimizer type '{}' is not one accel builds; use one of {} (or build the optimizer in the "
                    "program and pass it to prepare())",
                    where, type, join(kOptimizers)));
  fail(fmt::format("{}: unknown optimizer type '{}'; expected one of {}", where, type, join(kOptimizers)));
}

template <class Options>
Options adam_options(Params& p, const OptimizerDefaults& d, double default_weight_decay) {
  Options o(p.number("lr", 0, d.lr).value_or(1e-3));
  const auto betas = p.betas("betas", d.betas).value_or(std::array<double, 2>{0.9, 0.999});
  o.betas(std::make_tuple(betas[0], betas[1]));
  o.eps(p.number("eps", 0, d.eps).value_or(1e-8));
  o.weight_decay(p.number("weight_decay", 0, d.weight_decay).value_or(default_weight_decay));
  o.amsgrad(p.boolean("amsgrad").value_or(false));
  return o;
}

// The optimizer over the groups: a group's own lr or weight_decay on a copy of the options.
template <class Opt, class Options>
std::shared_ptr<torch::optim::Optimizer> with_groups(const std::vector<ParamGroup>& groups, const Options& options) {
  std::vector<torch::optim::OptimizerParamGroup> gs;
  for (const auto& g : groups) {
    if (!g.lr && !g.weight_decay) {
      gs.emplace_back(g.params);
      continue;
    }
    auto o = std::make_unique<Options>(options);
    if (g.lr) o->lr(*g.lr);
    if (g.weight_decay) o->weight_decay(*g.weight_decay);
    gs.emplace_back(g.params, std::move(o));
  }
  return std::make_shared<Opt>(std::move(gs), options);
}

// Keys torch.optim or DeepSpeed accept that choose an implementation, not the arithmetic: accepted
// with any value, except `maximize` (torch's sign flip), which libtorch does not have.
const std::vector<std::string> kImplementationKeys = {"foreach", "fused", "capturable", "differentiable", "maximize"};
void read_implementation_keys(Params& p) {
  for (const auto& k : kImplementationKeys) {
    const auto b = p.boolean(k);
    if (k == "maximize" && b && *b) fail(fmt::format("{} is true: libtorch's optimizers only minimize", p.key(k)));
  }
}
std::vector<std::string> with_implementation_keys(std::vector<std::string> keys) {
  keys.insert(keys.end(), kImplementationKeys.begin(), kImplementationKeys.end());
  return keys;
}

std::shared_ptr<torch::optim::Optimizer> build_optimizer(const ConfigBlock& block,
                                                         const std::vector<ParamGroup>& groups,
                                                         const OptimizerDefaults& d) {
  const std::string type = canonical_optimizer(block.type, block.name + ".type");
  for (const auto& [k, v] : block.params)
    if (k == "max_grad_norm")
      fail(
          fmt::format("{}.params.max_grad_norm is not an optimizer parameter (DeepSpeed refuses it too): use the "
                      "top-level gradient_clipping",
                      block.name));
  Params p(block);
  read_implementation_keys(p);
  if (type == "Adam" || type == "AdamW") {
    // DeepSpeed: AdamW for "AdamW" whatever adam_w_mode says, and for "Adam" unless it says false.
    const bool adam_w_mode = p.boolean("adam_w_mode").value_or(true);
    const bool torch_adam = p.boolean("torch_adam").value_or(false);
    if (!p.boolean("bias_correction").value_or(true))
      fail(fmt::format("{} is false: torch's Adam and AdamW always correct the bias", p.key("bias_correction")));
    if (!p.boolean("fp32_optimizer_states").value_or(true))
      fail(fmt::format("{} is false: accel keeps the optimizer state in fp32", p.key("fp32_optimizer_states")));
    (void)p.boolean("set_grad_none");  // (FusedAdam's zero_grad(set_to_none): zero_grad's argument here)
    const std::vector<std::string> keys =
        with_implementation_keys({"lr", "betas", "eps", "weight_decay", "amsgrad", "adam_w_mode", "torch_adam",
                                  "bias_correction", "fp32_optimizer_states", "set_grad_none"});
    // (torch.optim.AdamW's weight decay is 0.01 by default; DeepSpeed's FusedAdam's is 0.)
    if (type == "AdamW" || adam_w_mode) {
      const auto o = adam_options<torch::optim::AdamWOptions>(p, d, torch_adam ? 1e-2 : 0.0);
      p.finish(keys);
      return with_groups<torch::optim::AdamW>(groups, o);
    }
    const auto o = adam_options<torch::optim::AdamOptions>(p, d, 0.0);
    p.finish(keys);
    return with_groups<torch::optim::Adam>(groups, o);
  }
  if (type == "SGD") {
    torch::optim::SGDOptions o(p.number("lr", 0, d.lr).value_or(1e-3));
    o.momentum(p.number("momentum", 0, d.momentum).value_or(0.0));
    o.dampening(p.number("dampening", 0).value_or(0.0));
    o.weight_decay(p.number("weight_decay", 0, d.weight_decay).value_or(0.0));
    o.nesterov(p.boolean("nesterov").value_or(false));
    if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0))
      fail(fmt::format("{}: nesterov needs a momentum > 0 and dampening 0", block.name + ".params"));
    p.finish(with_implementation_keys({"lr", "momentum", "dampening", "weight_decay", "nesterov"}));
    return with_groups<torch::optim::SGD>(groups, o);
  }
  if (type == "Adagrad") {
    torch::optim::AdagradOptions o(p.number("lr", 0, d.lr).value_or(1e-2));
    o.lr_decay(p.number("lr_decay", 0).value_or(0.0));
    o.weight_decay(p.number("weight_decay", 0, d.weight_decay).value_or(0.0));
    o.initial_accumulator_value(p.number("initial_accumulator_value", 0).value_or(0.0));
    o.eps(p.number("eps", 0, d.eps).value_or(1e-10));
    (void)p.boolean("adam_w_mode");  // (DeepSpeed drops Adam's two switches for Adagrad)
    (void)p.boolean("torch_adam");
    p.finish(with_implementation_keys(
        {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "adam_w_mode", "torch_adam"}));
    return with_groups<torch::optim::Adagrad>(groups, o);
  }
  // RMSprop
  torch::optim::RMSpropOptions o(p.number("lr", 0, d.lr).value_or(1e-2));
  o.alpha(p.number("alpha", 0).value_or(0.99));
  o.eps(p.number("eps", 0, d.eps).value_or(1e-8));
  o.weight_decay(p.number("weight_decay", 0, d.weight_decay).value_or(0.0));
  o.momentum(p.number("momentum", 0, d.momentum).value_or(0.0));
  o.centered(p.boolean("centered").value_or(false));
  p.finish(with_implementation_keys({"lr", "alpha", "eps", "weight_decay", "momentum", "centered"}));
  return with_groups<torch::optim::RMSprop>(groups, o);
}

// The program's defaults as a block: the same construction, with every value from them.
ConfigBlock defaults_block(const OptimizerDefaults& d) {
  ConfigBlock b;
  b.name = "OptimizerDefaults";
  b.type = d.type;
  auto add = [&](const char* k, double v) {
    ConfigValue c;
    c.number = v;
    c.text = fmt::format("{}", v);
    b.params.emplace_back(k, c);
  };
  add("lr", d.lr);
  add("weight_decay", d.weight_decay);
  const std::string t = lower(d.type);
  if (t == "adam" || t == "adamw") {
    ConfigValue c;
    c.kind = ConfigValue::Kind::Numbers;
    c.numbers = {d.betas[0], d.betas[1]};
    c.text = fmt::format("[{}, {}]", d.betas[0], d.betas[1]);
    b.params.emplace_back("betas", c);
  }
  if (t == "adam" || t == "adamw" || t == "rmsprop") add("eps", d.eps);
  if (t == "sgd" || t == "rmsprop") add("momentum", d.momentum);
  return b;
}

// ---------------------------------------------------------------------------------------------------
// Schedules

const std::vector<std::string> kSchedules = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"};

std::string canonical_schedule(const std::string& type, const std::string& where) {
  for (const auto& n : kSchedules)
    if (lower(type) == lower(n)) return n;
  fail(
      fmt::format("{}: unknown scheduler type '{}'; expected one of {} (DeepSpeed's schedules; for another, build it "
                  "in the program and pass it to prepare_scheduler())",
                  where, type, join(kSchedules)));
}

WarmupType warmup_type(Params& p) {
  const auto t = p.text("warmup_type");
  if (!t) return WarmupType::Log;
  if (lower(*t) == "log") return WarmupType::Log;
  if (lower(*t) == "linear") return WarmupType::Linear;
  fail(fmt::format("{} is '{}', expected log or linear", p.key("warmup_type"), *t));
}

// A schedule's constructor, its errors named as the block's ("scheduler.params.warmup_min_lr: ...").
template <class S, class... Args>
std::shared_ptr<torch::optim::LRScheduler> construct(const ConfigBlock& block, Args&&... args) {
  try {
    return std::make_shared<S>(std::forward<Args>(args)...);
  } catch (const accel::InvalidArgumentError& e) {
    fail(fmt::format("{}.params.{}", block.name, e.what()));
  }
}

// checking: only the block is looked at ("auto" total_num_steps is taken as known); warn: say what
// DeepSpeed warns about (a schedule shorter than its warmup, OneCycle's momentum off).
std::shared_ptr<torch::optim::LRScheduler> build_schedule(const ConfigBlock& block, torch::optim::Optimizer& opt,
                                                          const SchedulerDefaults& d, bool checking, bool warn) {
  const std::string type = canonical_schedule(block.type, block.name + ".type");
  Params p(block);
  if (opt.param_groups().empty()) fail(fmt::format("{}: the optimizer has no param groups", block.name));
  if (auto it = p.integer("last_batch_iteration", -1); it && *it != -1)
    fail(fmt::format("{} is {}: accel starts a schedule at -1 and resumes it from its checkpoints",
                     p.key("last_batch_iteration"), *it));
  const double optimizer_lr = opt.param_groups()[0].options().get_lr();
  std::optional<std::int64_t> auto_total;
  if (checking)
    auto_total = 1;
  else if (d.total_num_steps > 0)
    auto_total = d.total_num_steps;
  auto total = [&]() -> std::int64_t {
    if (!auto_total && p.is_auto("total_num_steps"))
      fail(
          fmt::format("{} is 'auto': give the program's SchedulerDefaults::total_num_steps (the optimizer steps of "
                      "the run), or a number here",
                      p.key("total_num_steps")));
    const auto t = p.integer("total_num_steps", 1, auto_total);
    if (!t) fail(fmt::format("{}: {} needs total_num_steps (the optimizer steps of the run)", block.name, type));
    return *t;
  };
  auto warn_short = [&](std::int64_t total_steps, std::int64_t warmup) {
    if (warn && !checking && total_steps < warmup)
      log::warning(fmt::format("{}: total_num_steps {} is less than warmup_num_steps {}", type, total_steps, warmup));
  };

  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    WarmupOptions o;
    o.warmup_min_lr = p.numbers("warmup_min_lr", std::vector<double>{0.0}).value_or(std::vector<double>{0.0});
    o.warmup_max_lr = p.numbers("warmup_max_lr", std::vector<double>{optimizer_lr}).value_or(std::vector<double>{});
    o.warmup_num_steps = p.integer("warmup_num_steps", 1, d.warmup_num_steps).value_or(1000);
    o.warmup_type = warmup_type(p);
    if (type == "WarmupLR") {
      p.finish({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"});
      return construct<WarmupLR>(block, opt, o);
    }
    const std::int64_t t = total();
    p.finish({"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
              "last_batch_iteration"});
    warn_short(t, o.warmup_num_steps);
    return construct<WarmupDecayLR>(block, opt, t, o);
  }
  if (type == "WarmupCosineLR") {
    WarmupCosineOptions o;
    o.warmup_min_ratio = p.number("warmup_min_ratio", 0).value_or(0.0);
    o.warmup_num_steps = p.integer("warmup_num_steps", 1, d.warmup_num_steps).value_or(1000);
    o.cos_min_ratio = p.number("cos_min_ratio", 0).value_or(1e-4);
    o.warmup_type = warmup_type(p);
    const std::int64_t t = total();
    p.finish({"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
              "last_batch_iteration"});
    warn_short(t, o.warmup_num_steps);
    return construct<WarmupCosineLR>(block, opt, t, o);
  }
  if (type == "LRRangeTest") {
    LRRangeTestOptions o;
    o.lr_range_test_min_lr = p.numbers("lr_range_test_min_lr").value_or(std::vector<double>{1e-3});
    o.lr_range_test_step_size = p.integer("lr_range_test_step_size", 1).value_or(2000);
    o.lr_range_test_step_rate = p.number("lr_range_test_step_rate", 0).value_or(1.0);
    o.lr_range_test_staircase = p.boolean("lr_range_test_staircase").value_or(false);
    p.finish({"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase",
              "last_batch_iteration"});
    return construct<LRRangeTest>(block, opt, o);
  }
  // OneCycle
  OneCycleOptions o;
  const auto min_lr = p.number("cycle_min_lr", 0), max_lr = p.number("cycle_max_lr", 0);
  if (!min_lr || !max_lr) fail(fmt::format("{}: OneCycle needs cycle_min_lr and cycle_max_lr", block.name + ".params"));
  o.cycle_min_lr = *min_lr;
  o.cycle_max_lr = *max_lr;
  o.decay_lr_rate = p.number("decay_lr_rate", 0).value_or(0.0);
  o.cycle_first_step_size = p.integer("cycle_first_step_size", 1).value_or(2000);
  o.cycle_second_step_size = p.integer("cycle_second_step_size", 1).value_or(-1);
  // (A stair count of -1, DeepSpeed's command-line default, is no stairs; an absent second count is the first's.)
  o.cycle_first_stair_count = std::max<std::int64_t>(0, p.integer("cycle_first_stair_count", -1).value_or(0));
  if (const auto second = p.integer("cycle_second_stair_count", -1))
    o.cycle_second_stair_count = std::max<std::int64_t>(0, *second);
  o.decay_step_size = p.integer("decay_step_size", 0).value_or(0);
  o.cycle_momentum = p.boolean("cycle_momentum").value_or(true);
  o.cycle_min_mom = p.number("cycle_min_mom", 0).value_or(0.8);
  o.cycle_max_mom = p.number("cycle_max_mom", 0).value_or(0.9);
  o.decay_mom_rate = p.number("decay_mom_rate", 0).value_or(0.0);
  p.finish({"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
            "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum", "cycle_min_mom",
            "cycle_max_mom", "decay_mom_rate", "last_batch_iteration"});
  auto s = construct<OneCycle>(block, opt, o);
  if (warn && !checking && o.cycle_momentum && !static_cast<const OneCycle&>(*s).cycles_momentum())
    log::warning(
        "OneCycle: cycle_momentum is off: the optimizer has no betas (DeepSpeed cycles Adam's and AdamW's "
        "beta1 only)");
  return s;
}

ConfigBlock schedule_defaults_block(const SchedulerDefaults& d) {
  ConfigBlock b;
  b.name = "SchedulerDefaults";
  b.type = d.type;
  const std::string t = lower(d.type);
  auto add = [&](const char* k) {
    ConfigValue c;
    c.kind = ConfigValue::Kind::Auto;
    c.text = "auto";
    b.params.emplace_back(k, c);
  };
  if (t == "warmuplr" || t == "warmupdecaylr") add("warmup_max_lr");  // (the optimizer's lr)
  if (t == "warmuplr" || t == "warmupdecaylr" || t == "warmupcosinelr") add("warmup_num_steps");
  if (t == "warmupdecaylr" || t == "warmupcosinelr") add("total_num_steps");
  return b;
}

// libtorch's own checks (a negative lr, betas out of range) as accel's error.
template <class F>
auto torch_checked(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    fail(fmt::format("{}: {}", where, e.what_without_backtrace()));
  }
}

}  // namespace

void check_optimizer_block(const ConfigBlock& block) {
  // ("auto" momentum is the program's: a probe above 0, so that nesterov's check waits for the real one.)
  OptimizerDefaults probe;
  probe.momentum = 0.9;
  torch_checked(block.name, [&] { return build_optimizer(block, {ParamGroup{{at::zeros({1})}}}, probe); });
}

void check_scheduler_block(const ConfigBlock& block) {
  // A probe optimizer with as many groups as the lists give values: their count is checked against
  // the program's optimizer when the schedule is built.
  std::size_t groups = 1;
  std::string first;  // the first list of more than one value
  for (const auto& [k, v] : block.params) {
    if (v.kind != ConfigValue::Kind::Numbers || v.numbers.size() < 2) continue;
    if (first.empty()) {
      first = k;
      groups = v.numbers.size();
    } else if (v.numbers.size() != groups) {
      fail(
          fmt::format("{}.params: {} has {} values and {} has {}; lists give one value per param group, so they are "
                      "as long as each other",
                      block.name, first, groups, k, v.numbers.size()));
    }
  }
  std::vector<torch::optim::OptimizerParamGroup> gs;
  for (std::size_t g = 0; g < groups; ++g) gs.emplace_back(std::vector<at::Tensor>{at::zeros({1})});
  torch::optim::AdamW probe(std::move(gs));
  torch_checked(block.name, [&] { return build_schedule(block, probe, SchedulerDefaults{}, true, false); });
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(const ConfigBlock* block, const std::vector<ParamGroup>& groups,
                                                        const OptimizerDefaults& defaults) {
  const ConfigBlock b = block ? *block : defaults_block(defaults);
  return torch_checked(b.name, [&] { return build_optimizer(b, groups, defaults); });
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(const ConfigBlock* block, const std::vector<at::Tensor>& params,
                                                        const OptimizerDefaults& defaults) {
  return make_optimizer(block, std::vector<ParamGroup>{ParamGroup{params}}, defaults);
}

std::shared_ptr<torch::optim::LRScheduler> make_scheduler(const ConfigBlock* block, torch::optim::Optimizer& optimizer,
                                                          const SchedulerDefaults& defaults, bool warn) {
  if (!block && defaults.type.empty()) return std::make_shared<ConstantLR>(optimizer);
  if (!block) {
    const std::string t = lower(defaults.type);
    if (t != "warmuplr" && t != "warmupdecaylr" && t != "warmupcosinelr")
      fail(
          fmt::format("SchedulerDefaults::type '{}': without a scheduler block the program's schedule is one of "
                      "WarmupLR, WarmupDecayLR, WarmupCosineLR (or \"\": a constant learning rate)",
                      defaults.type));
  }
  const ConfigBlock b = block ? *block : schedule_defaults_block(defaults);
  return torch_checked(b.name, [&] { return build_schedule(b, optimizer, defaults, false, warn); });
}

std::string describe(const torch::optim::Optimizer& opt) {
  const auto& d = opt.defaults();
  auto adam = [](const char* name, const auto& o) {
    return fmt::format("{} (lr {}, betas [{}, {}], eps {}, weight_decay {}{})", name, o.lr(), std::get<0>(o.betas()),
                       std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.amsgrad() ? ", amsgrad" : "");
  };
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&d)) return adam("AdamW", *o);
  if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&d)) return adam("Adam", *o);
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&d))
    return fmt::format("SGD (lr {}, momentum {}, dampening {}, weight_decay {}{})", o->lr(), o->momentum(),
                       o->dampening(), o->weight_decay(), o->nesterov() ? ", nesterov" : "");
  if (const auto* o = dynamic_cast<const torch::optim::AdagradOptions*>(&d))
    return fmt::format("Adagrad (lr {}, lr_decay {}, weight_decay {}, eps {})", o->lr(), o->lr_decay(),
                       o->weight_decay(), o->eps());
  if (const auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&d))
    return fmt::format("RMSprop (lr {}, alpha {}, eps {}, weight_decay {}, momentum {}{})", o->lr(), o->alpha(),
                       o->eps(), o->weight_decay(), o->momentum(), o->centered() ? ", centered" : "");
  return fmt::format("an optimizer (lr {})", d.get_lr());
}

}  // namespace accel::optim
