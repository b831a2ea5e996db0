// Mixed precision through the Accelerator at world sizes 1..3 (accelerator/precision.h,
// mixed_precision/autocast.h):
//   * fp16 overflow: an inf in ONE rank's gradient skips the step on every rank, leaves parameters,
//     optimizer state, step counter and LR schedule untouched, and moves the loss scale by DeepSpeed's
//     rule (hysteresis 2 by default; 1 from a DeepSpeed JSON); the next clean step trains as if the
//     skipped ones never happened; an overflow at min_loss_scale is an error saying what to change.
//   * fp16 unscaling: the step and clip_grad_norm_ see the gradients divided by the loss scale exactly
//     once (against an fp64 reference on the same fp16-rounded weights and inputs), clipping included.
//   * autocast scopes: bf16/fp16 matmuls inside acc.autocast(), fp32 inside autocast(true), off after.
//   * the dtype policy: bf16 compute with fp32 masters, bf16 masters from DeepSpeed's
//     bf16_master_weights_and_grads, and the combinations that are refused.
//   * the loss scaler's state (scale and hysteresis) in save_state / load_state.
#include "accelerator/accelerator.h"
#include "accelerator/rows.h"
#include "mixed_precision/float8_linear.h"
#include "mixed_precision/loss_scaler.h"
#include "support/compare.h"
#include "support/models.h"
#include "test_world.h"

#include <ATen/autocast_mode.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>

namespace accel::test {
namespace {

// The job's directory for config files (test::scratch_dir), made by the first test that asks.
const std::string& run_dir() {
  static const std::string dir = scratch_dir("mixed_precision");
  return dir;
}

std::string mp_config_file(const std::string& name, const std::string& text) {
  const std::string p = run_dir() + "/" + name;
  if (world()->rank() == 0) std::ofstream(p) << text;
  world()->barrier();
  return p;
}

AcceleratorOptions mp_options(std::optional<std::string> file = std::nullopt) {
  AcceleratorOptions o;
  o.config_file = std::move(file);
  o.report_ignored_keys = false;
  return o;
}

struct Case {
  std::string name, text;  // a config file's name and contents
};
const std::string kUnits =
    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LinearImpl\n";
// The four strategies of the brief, fp16 with DeepSpeed's default dynamic scaler (2^16, hysteresis 2).
std::vector<Case> fp16_cases() {
  return {
      {"fp16_ddp.yaml", "distributed_type: MULTI_CPU\nmixed_precision: fp16\n"},
      {"fp16_zero1.yaml", "distributed_type: DEEPSPEED\nmixed_precision: fp16\ndeepspeed_config:\n  zero_stage: 1\n"},
      {"fp16_zero3.yaml", "distributed_type: DEEPSPEED\nmixed_precision: fp16\ndeepspeed_config:\n  zero_stage: 3\n"},
      {"fp16_full_shard.yaml",
       "distributed_type: FSDP\nmixed_precision: fp16\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n" + kUnits},
  };
}

// fp32 MLP (6 -> 10 -> 10 -> 3, each Linear a unit, plus a root-unit parameter); same on every rank.
std::shared_ptr<MLPImpl> make_fp32_mlp(int seed = 1234) {
  at::manual_seed(seed);
  return std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
}

constexpr int64_t G = 6;  // global batch: divides evenly over 1, 2 and 3 ranks
struct Data {
  at::Tensor x, y;
};
// Global batch number k (the same on every rank); small targets keep the scaled fp16 gradients finite.
Data global_batch(int k) {
  at::manual_seed(500 + k);
  at::Tensor x = at::randn({G, 6});
  at::Tensor y = 0.1 * at::randn({G, 3});
  return {x, y};
}
Data my_rows(const Data& d, const Accelerator& acc) {
  const int64_t per = G / acc.num_processes(), b = per * acc.process_index();
  return {d.x.narrow(0, b, per), d.y.narrow(0, b, per)};
}
// A loader handed to prepare() only so that DeepSpeed learns the micro batch (G / N per rank); the
// tests feed my_rows() themselves.
DataLoader<Rows> micro_batch_loader() {
  return DataLoader<Rows>(Rows(at::zeros({G, 6}), at::zeros({G, 3})), {.batch_size = G, .split_batches = true});
}

// Forward (under the Accelerator's autocast) and backward of this rank's part of batch k. inject:
// the LAST rank puts +inf into one element of the first layer's weight gradient (a tensor hook), so
// only that rank's local gradient holds it before the reduction.
at::Tensor forward_backward(Accelerator& acc, MLPImpl& m, int k, bool inject) {
  Data d = my_rows(global_batch(k), acc);
  at::Tensor loss;
  {
    auto ac = acc.autocast();
    loss = at::mse_loss(m.forward(d.x).to(at::kFloat), d.y);
  }
  const bool here = inject && acc.is_last_process();
  at::Tensor& w = m.layers[0]->weight;
  unsigned hook = 0;
  if (here)
    hook = w.register_hook([](const at::Tensor& g) {
      at::Tensor h = g.clone();
      h.view({-1})[0].fill_(std::numeric_limits<double>::infinity());
      return h;
    });
  acc.backward(loss);
  if (here) w.remove_hook(hook);
  return loss.detach();
}

// What a skipped step must leave exactly as it was, on this rank.
struct Snapshot {
  std::vector<at::Tensor> masters, params, moments;  // engine masters, compute shards/buffers, AdamW moments
  std::vector<int64_t> adam_steps;
  std::map<std::string, at::Tensor> full;  // rank 0: the full (compute dtype) parameters
  double lr = 0;
  int64_t sched_steps = 0, acc_steps = 0;
};
Snapshot snapshot(Accelerator& acc, AcceleratedOptimizer& opt, AcceleratedScheduler& sched) {
  Snapshot s;
  for (const auto& f : acc.engine()->flats()) {
    if (f.master.defined()) s.masters.push_back(f.master.detach().clone());
    s.params.push_back(f.flat_param->shard().detach().clone());
  }
  auto& state = opt.inner().state();
  for (auto& group : opt.inner().param_groups())
    for (auto& p : group.params()) {
      auto it = state.find(p.unsafeGetTensorImpl());
      if (it == state.end()) {
        s.adam_steps.push_back(-1);
        continue;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      s.adam_steps.push_back(st.step());
      s.moments.push_back(st.exp_avg().clone());
      s.moments.push_back(st.exp_avg_sq().clone());
    }
  for (auto& [name, t] : acc.get_state_dict()) s.full[name] = t;
  s.lr = opt.inner().param_groups()[0].options().get_lr();
  s.sched_steps = sched.steps();
  s.acc_steps = acc.step();
  return s;
}
void expect_unchanged(const Snapshot& a, const Snapshot& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.masters.size(), b.masters.size());
  for (std::size_t i = 0; i < a.masters.size(); ++i)
    EXPECT_TRUE(at::equal(a.masters[i], b.masters[i])) << "master " << i;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(at::equal(a.params[i], b.params[i])) << "flat " << i;
  EXPECT_EQ(a.adam_steps, b.adam_steps) << "AdamW's step counts";
  ASSERT_EQ(a.moments.size(), b.moments.size());
  for (std::size_t i = 0; i < a.moments.size(); ++i)
    EXPECT_TRUE(at::equal(a.moments[i], b.moments[i])) << "moment " << i;
  ASSERT_EQ(a.full.size(), b.full.size());
  for (const auto& [name, t] : a.full) EXPECT_TRUE(at::equal(t, b.full.at(name))) << name;
  EXPECT_EQ(a.lr, b.lr) << "the LR scheduler stepped";
  EXPECT_EQ(a.sched_steps, b.sched_steps);
  EXPECT_EQ(a.acc_steps, b.acc_steps) << "Accelerator::step() counted a skipped step";
}

// Every rank's flag, gathered: the test fails on every rank if any rank disagrees.
std::vector<int64_t> all_flags(Accelerator& acc, bool mine) {
  at::Tensor all = acc.gather(at::full({1}, static_cast<int64_t>(mine), at::kLong));
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
}

struct Trainer {
  Accelerator acc;
  std::shared_ptr<MLPImpl> model = make_fp32_mlp();
  torch::optim::AdamW adamw{model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1)};
  DataLoader<Rows> loader = micro_batch_loader();
  Prepared p;
  explicit Trainer(const AcceleratorOptions& o) : acc(o) {
    p = acc.prepare(model, adamw, loader, [](torch::optim::Optimizer& inner) {
      return std::make_shared<torch::optim::StepLR>(inner, 1, 0.5);
    });
  }
  // One optimizer step on batch k; returns clip_grad_norm_'s result when clip.
  double step(int k, bool inject, bool clip = false) {
    forward_backward(acc, *model, k, inject);
    double norm = clip ? acc.clip_grad_norm_(1e3) : 0.0;
    p.optimizer->step();
    p.scheduler->step();
    p.optimizer->zero_grad();
    return norm;
  }
  Snapshot snap() { return snapshot(acc, *p.optimizer, *p.scheduler); }
};

std::vector<int64_t> ones(const Accelerator& acc) { return std::vector<int64_t>(acc.num_processes(), 1); }
std::vector<int64_t> zeros(const Accelerator& acc) { return std::vector<int64_t>(acc.num_processes(), 0); }

// (a) One rank's inf skips the step everywhere; DeepSpeed's default hysteresis (2): the first
// overflow keeps 2^16, the second halves it; the clean step after trains as if nothing had happened.
TEST(MixedPrecision, Fp16OverflowOnOneRankSkipsTheStepEverywhere) {
  for (const Case& c : fp16_cases()) {
    SCOPED_TRACE(c.name);
    Trainer t(mp_options(mp_config_file(c.name, c.text)));
    ASSERT_EQ(t.acc.mixed_precision(), MixedPrecision::Fp16);
    ASSERT_TRUE(t.acc.loss_scale().has_value());
    EXPECT_EQ(*t.acc.loss_scale(), 65536.0) << "DeepSpeed's initial_scale_power 16";
    for (int k = 0; k < 2; ++k) {
      t.step(k, false);
      EXPECT_EQ(all_flags(t.acc, t.acc.optimizer_step_was_skipped()), zeros(t.acc)) << "clean step " << k << " skipped";
    }
    EXPECT_EQ(t.acc.step(), 2);
    const Snapshot before = t.snap();
    ASSERT_FALSE(before.moments.empty()) << "AdamW has state after two steps";

    // First overflow (clip_grad_norm_ called: it reports inf on every rank); hysteresis 2 -> 1.
    const double norm = t.step(2, /*inject=*/true, /*clip=*/true);
    EXPECT_TRUE(std::isinf(norm)) << "clip_grad_norm_ on an overflowing step returned " << norm;
    EXPECT_EQ(all_flags(t.acc, t.acc.optimizer_step_was_skipped()), ones(t.acc));
    EXPECT_EQ(*t.acc.loss_scale(), 65536.0) << "the first overflow is absorbed by the hysteresis";
    expect_unchanged(before, t.snap(), "after the first overflow");

    // Second consecutive overflow (no clip_grad_norm_ call): the scale halves.
    t.step(2, true);
    EXPECT_EQ(all_flags(t.acc, t.acc.optimizer_step_was_skipped()), ones(t.acc));
    EXPECT_EQ(*t.acc.loss_scale(), 32768.0);
    expect_unchanged(before, t.snap(), "after the second overflow");

    // A clean step steps, on the clean gradients of its own batch only.
    t.step(2, false);
    EXPECT_EQ(all_flags(t.acc, t.acc.optimizer_step_was_skipped()), zeros(t.acc));
    EXPECT_EQ(*t.acc.loss_scale(), 32768.0) << "no doubling before loss_scale_window (1000) clean steps";
    EXPECT_EQ(t.acc.step(), 3);
    const Snapshot after = t.snap();
    ASSERT_EQ(after.masters.size(), before.masters.size());
    bool changed = false;
    for (std::size_t i = 0; i < after.masters.size(); ++i) changed |= !at::equal(after.masters[i], before.masters[i]);
    EXPECT_TRUE(changed || after.masters.empty()) << "the clean step did not change the parameters";
    for (int64_t s : after.adam_steps) EXPECT_TRUE(s == 3 || s == -1) << "AdamW step count " << s << ", want 3";

    // The same three clean steps without the overflows in between: the same weights (the scale is a
    // power of two, so fp16 gradients differ only by that factor), same optimizer state, same LR.
    Trainer ref(mp_options(mp_config_file(c.name, c.text)));
    for (int k = 0; k < 3; ++k) ref.step(k, false);
    const Snapshot r = ref.snap();
    ASSERT_EQ(r.masters.size(), after.masters.size());
    for (std::size_t i = 0; i < r.masters.size(); ++i)
      EXPECT_TRUE(at::allclose(after.masters[i], r.masters[i], 1e-5, 1e-7))
          << "master " << i << ": max |diff| " << (after.masters[i] - r.masters[i]).abs().max().item<double>();
    EXPECT_EQ(after.adam_steps, r.adam_steps);
    EXPECT_EQ(after.lr, r.lr);
    for (const auto& [name, v] : r.full)
      EXPECT_TRUE(at::allclose(after.full.at(name).to(at::kFloat), v.to(at::kFloat), 1e-3, 1e-5)) << name;
    t.acc.end_training();
    ref.acc.end_training();
  }
}

// (a) DeepSpeed JSON with hysteresis 1: one overflow halves the scale (2^8 -> 2^7).
TEST(MixedPrecision, Fp16HysteresisOneFromDeepSpeedJsonHalvesAtOnce) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string json = R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1,
      "fp16": {"enabled": true, "hysteresis": 1, "initial_scale_power": 8},
      "zero_optimization": {"stage": )" +
                             std::to_string(stage) + "}}";
    Trainer t(mp_options(mp_config_file("ds_h1_" + std::to_string(stage) + ".json", json)));
    EXPECT_EQ(t.acc.distributed_type(), DistributedType::DeepSpeed);
    EXPECT_EQ(*t.acc.loss_scale(), 256.0);
    t.step(0, false);
    EXPECT_FALSE(t.acc.optimizer_step_was_skipped());
    EXPECT_EQ(*t.acc.loss_scale(), 256.0);
    const Snapshot before = t.snap();
    t.step(1, true);
    EXPECT_EQ(all_flags(t.acc, t.acc.optimizer_step_was_skipped()), ones(t.acc));
    EXPECT_EQ(*t.acc.loss_scale(), 128.0);
    expect_unchanged(before, t.snap(), "after the overflow");
    t.step(1, false);
    EXPECT_EQ(all_flags(t.acc, t.acc.optimizer_step_was_skipped()), zeros(t.acc));
    EXPECT_EQ(*t.acc.loss_scale(), 128.0);
  }
}

// (a) An overflow at min_loss_scale cannot lower the scale: an error on every rank that says what to change.
TEST(MixedPrecision, Fp16OverflowAtMinimumScaleIsAnError) {
  const std::string json = R"({"train_micro_batch_size_per_gpu": "auto",
    "fp16": {"enabled": true, "hysteresis": 1, "initial_scale_power": 3, "min_loss_scale": 4},
    "zero_optimization": {"stage": 3}})";
  Trainer t(mp_options(mp_config_file("ds_min.json", json)));
  EXPECT_EQ(*t.acc.loss_scale(), 8.0);
  t.step(0, true);
  EXPECT_TRUE(t.acc.optimizer_step_was_skipped());
  EXPECT_EQ(*t.acc.loss_scale(), 4.0);
  forward_backward(t.acc, *t.model, 1, true);
  bool threw = false;
  try {
    t.p.optimizer->step();
  } catch (const mixed_precision::LossScaleAtMinimumError& e) {
    threw = true;
    const std::string m = e.what();
    for (const char* needle : {"min_loss_scale", "bf16", "inf/nan"})
      EXPECT_NE(m.find(needle), std::string::npos) << "'" << needle << "' missing from: " << m;
  }
  EXPECT_EQ(all_flags(t.acc, threw), ones(t.acc)) << "every rank must raise the error";
  EXPECT_EQ(*t.acc.loss_scale(), 4.0);
}

// (b) Unscaling happens exactly once. One SGD step (lr 1) under fp16 must move the fp32 masters by
// the gradient of the fp16-rounded weights on the fp16-rounded inputs, computed here in fp64, times
// the clip coefficient; clip_grad_norm_ must return that gradient's norm. Tolerance 1e-2 relative
// (norm-wise): fp16 keeps 11 significant bits (unit roundoff 2^-11 = 4.9e-4), and the forward and
// backward round every activation and gradient to fp16 in 3 layers (+ tanh), so a few 1e-3 is what
// honest fp16 gets (measured: ~5e-4); missing or doubled unscaling is off by the loss scale (2^16 or
// 1024), a clip coefficient applied wrongly by 4x.
struct RefGrad {
  std::map<std::string, at::Tensor> grad;  // fp32 copies of the fp64 gradients
  double norm = 0;
};
// The mean over micro-batches 0..n-1 of the fp64 gradient of the global-batch loss.
RefGrad reference_gradient(int n) {
  auto m = make_fp32_mlp();
  m->to(at::kDouble);
  {
    c10::NoGradGuard ng;
    for (auto& p : m->parameters()) p.copy_(p.to(at::kHalf).to(at::kDouble));
  }
  for (int k = 0; k < n; ++k) {
    Data d = global_batch(k);
    (at::mse_loss(m->forward(d.x.to(at::kHalf).to(at::kDouble)), d.y.to(at::kDouble)) / n).backward();
  }
  RefGrad r;
  for (const auto& kv : m->named_parameters()) {
    r.grad[kv.key()] = kv.value().grad().to(at::kFloat);
    r.norm += kv.value().grad().pow(2).sum().item<double>();
  }
  r.norm = std::sqrt(r.norm);
  return r;
}

TEST(MixedPrecision, Fp16GradientsAreUnscaledExactlyOnce) {
  std::vector<Case> cases = fp16_cases();
  cases.push_back({"ds_static_1024.json", R"({"train_micro_batch_size_per_gpu": "auto",
      "fp16": {"enabled": true, "loss_scale": 1024}, "zero_optimization": {"stage": 3}})"});
  const RefGrad one = reference_gradient(1), two = reference_gradient(2);
  double worst = 0;

  // kAccumulate: gradient_accumulation_steps 2 (micro-batches 0 and 1), clip_grad_norm_ at the sync step.
  enum Variant { kNoClipCall, kClipNoEffect, kClipQuarter, kAccumulate };
  const char* names[] = {"no clip_grad_norm_ call", "clip_grad_norm_(1e6)", "clip_grad_norm_(norm / 4)",
                         "2 accumulated micro-batches"};
  for (const Case& c : cases) {
    for (Variant v : {kNoClipCall, kClipNoEffect, kClipQuarter, kAccumulate}) {
      SCOPED_TRACE(c.name + ": " + names[v]);
      const RefGrad& ref = v == kAccumulate ? two : one;
      AcceleratorOptions o = mp_options(mp_config_file(c.name, c.text));
      if (v == kAccumulate) o.gradient_accumulation_steps = 2;
      Accelerator acc(o);
      auto model = make_fp32_mlp();
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1.0));
      DataLoader<Rows> loader = micro_batch_loader();
      auto opt = acc.prepare(model, sgd, loader);
      const double scale = *acc.loss_scale();
      EXPECT_EQ(scale, c.name == "ds_static_1024.json" ? 1024.0 : 65536.0);
      std::vector<at::Tensor> before;
      for (const auto& f : acc.engine()->flats()) before.push_back(f.master.detach().clone());
      double coef = 1.0;
      const int micro = v == kAccumulate ? 2 : 1;
      for (int k = 0; k < micro; ++k) {
        auto scope = acc.accumulate(model);
        forward_backward(acc, *model, k, false);
        ASSERT_EQ(acc.sync_gradients(), k + 1 == micro);
        if (v != kNoClipCall && acc.sync_gradients()) {
          const double max_norm = v == kClipQuarter ? ref.norm / 4 : 1e6;
          const double norm = acc.clip_grad_norm_(max_norm);
          EXPECT_NEAR(norm, ref.norm, 1e-2 * ref.norm)
              << "clip_grad_norm_ must return the unscaled norm (scale " << scale << ")";
          coef = std::min(1.0, max_norm / (norm + 1e-6));
        }
        opt->step();
        opt->zero_grad();
      }
      ASSERT_FALSE(acc.optimizer_step_was_skipped());
      EXPECT_EQ(acc.step(), 1);
      EXPECT_EQ(*acc.loss_scale(), scale);
      // Each rank: its master pieces' update against the reference gradient's same elements.
      double err2 = 0, want2 = 0;
      const auto& flats = acc.engine()->flats();
      for (std::size_t i = 0; i < flats.size(); ++i) {
        const auto& f = flats[i];
        ASSERT_TRUE(f.master.defined());
        EXPECT_EQ(f.master.scalar_type(), at::kFloat);
        const sharding::FlatParam& fp = *f.flat_param;
        at::Tensor want = at::zeros({fp.layout().padded()}, at::kFloat);
        for (std::size_t j = 0; j < fp.params().size(); ++j)
          want.narrow(0, fp.layout().offset(j), fp.params()[j].numel())
              .copy_(ref.grad.at(fp.names()[j]).reshape({-1}) * coef);
        auto [b, e] = acc.engine()->master_range(f);
        at::Tensor got = (before[i] - f.master.detach()).to(at::kDouble);  // lr 1: the update is the gradient
        at::Tensor w = want.narrow(0, b, e - b).to(at::kDouble);
        err2 += (got - w).pow(2).sum().item<double>();
        want2 += w.pow(2).sum().item<double>();
      }
      // Replicated masters count N times in both sums, sharded ones once: the ratio is global either way.
      at::Tensor sums = at::tensor({err2, want2}, at::kDouble);
      acc.world()->all_reduce(sums);
      const double rel = std::sqrt(sums[0].item<double>() / sums[1].item<double>());
      EXPECT_LT(rel, 1e-2) << "the fp16 step's update is off the reference gradient by " << rel << " (norm-wise); 2^"
                           << std::log2(scale) << " would mean unscaling missing, its inverse twice";
      worst = std::max(worst, rel);
      acc.end_training();
    }
  }
  if (world()->rank() == 0)
    std::printf(
        "[ info ] fp16 updates vs the fp64 reference: worst relative error %.2e over %zu cases (tolerance 1e-2)\n",
        worst, cases.size() * 4);
}

// fp8_config recipe rowwise reaches every Float8Linear of the prepared model and turns the fp8
// all-gather off (its gathered weight has one scale); the GPT trains under FULL_SHARD with it, and its loss
// follows the tensorwise run's within fp8's precision.
TEST(MixedPrecision, Fp8RowwiseRecipeReachesTheLayersAndTrains) {
  std::map<std::string, std::vector<double>> losses;
  for (const std::string recipe : {"tensorwise", "rowwise"}) {
    Accelerator acc(mp_options(mp_config_file("fp8_" + recipe + ".yaml",
                                              "distributed_type: FSDP\nmixed_precision: fp8\nfsdp_config:\n  "
                                              "fsdp_sharding_strategy: FULL_SHARD\nfp8_config:\n  recipe: " +
                                                  recipe + "\n")));
    at::manual_seed(7);
    auto gpt = std::make_shared<GPTImpl>(examples::GPTConfig{17, 32, 4, 2, 8, /*fp8=*/true});
    torch::optim::AdamW adamw(gpt->parameters(), torch::optim::AdamWOptions(3e-3));
    auto opt = acc.prepare(gpt, adamw);
    int layers = 0;
    for (const auto& m : gpt->modules())
      if (auto* f = dynamic_cast<nn::Float8LinearImpl*>(m.get())) {
        ++layers;
        EXPECT_EQ(f->recipe, mixed_precision::float8_recipe_from_string(recipe));
      }
    EXPECT_EQ(layers, 8);  // 4 per block
    EXPECT_EQ(acc.engine()->spec().fp8_all_gather, recipe == "tensorwise") << recipe;
    at::manual_seed(11 + acc.process_index());
    for (int step = 0; step < 6; ++step) {
      const at::Tensor tokens = at::randint(17, {4, 8}, at::kLong);
      at::Tensor loss;
      {
        auto ac = acc.autocast();
        loss = lm_loss(gpt->forward(tokens).to(at::kFloat), tokens.roll(-1, 1));
      }
      losses[recipe].push_back(acc.reduce(loss.detach(), "mean").item<double>());
      acc.backward(loss);
      opt->step();
      opt->zero_grad();
    }
    acc.end_training();
  }
  for (std::size_t i = 0; i < losses["rowwise"].size(); ++i) {
    EXPECT_TRUE(std::isfinite(losses["rowwise"][i]));
    EXPECT_NEAR(losses["rowwise"][i], losses["tensorwise"][i], 0.05 * losses["tensorwise"][i]) << "step " << i;
  }
  EXPECT_LT(losses["rowwise"].back(), losses["rowwise"].front());
}

// (c) Autocast scopes.
TEST(MixedPrecision, AutocastFollowsTheConfiguredPrecision) {
  at::manual_seed(3);
  const at::Tensor a = at::randn({5, 7}), b = at::randn({7, 4});
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  AcceleratorOptions bf = mp_options(), fp16 = mp_options(), fp8 = mp_options();
  bf.mixed_precision = "bf16";
  fp16.mixed_precision = "fp16";
  fp8.mixed_precision = "fp8";
  Accelerator acc(bf), acc16(fp16), acc8(fp8), acc32(mp_options());
  {
    auto g = acc.autocast();
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    at::Tensor r = at::matmul(a, b);
    EXPECT_EQ(r.scalar_type(), at::kBFloat16);
    {
      at::autocast::set_autocast_enabled(at::kCPU, false);  // the reference: the same product of bf16 inputs
      at::Tensor want = at::matmul(a.to(at::kBFloat16), b.to(at::kBFloat16));
      at::autocast::set_autocast_enabled(at::kCPU, true);
      EXPECT_TRUE(at::equal(r, want));
    }
    {
      auto f = acc.autocast(/*force_fp32=*/true);
      EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
      EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(at::matmul(a, b), a.matmul(b)));
    }
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU)) << "the inner force_fp32 scope must restore autocast";
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
    {
      auto h = acc16.autocast();  // fp16 nested inside bf16, then bf16 again
      EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kHalf);
    }
    EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), at::kBFloat16);
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
  {
    auto g = acc8.autocast();
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16) << "fp8 runs the rest of the model in bf16";
  }
  {
    auto g = acc16.autocast();
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kHalf);
  }
  {
    auto g = acc32.autocast();  // fp32: nothing changes
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(at::matmul(a, b), a.matmul(b)));
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_FALSE(acc32.loss_scale().has_value());
  EXPECT_FALSE(acc.loss_scale().has_value());
}

// (d) The dtype policy after prepare.
TEST(MixedPrecision, PrecisionPolicyGivesComputeAndMasterDtypes) {
  struct PolicyCase {
    Case c;
    std::optional<std::string> mp;  // AcceleratorOptions::mixed_precision
    at::ScalarType compute, master;
  };
  const std::vector<PolicyCase> cases = {
      {{"p_ddp.yaml", "distributed_type: MULTI_CPU\n"}, "bf16", at::kBFloat16, at::kFloat},
      {{"p_zero3.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"},
       "bf16",
       at::kBFloat16,
       at::kFloat},
      {{"p_full_shard_bf16.yaml",
        "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n" + kUnits},
       std::nullopt,
       at::kBFloat16,
       at::kFloat},
      {{"p_fp16_zero1.yaml",
        "distributed_type: DEEPSPEED\nmixed_precision: fp16\ndeepspeed_config:\n  zero_stage: 1\n"},
       std::nullopt,
       at::kHalf,
       at::kFloat},
      {{"p_bf16_masters.json", R"({"train_micro_batch_size_per_gpu": "auto",
          "bf16": {"enabled": true, "bf16_master_weights_and_grads": true}, "zero_optimization": {"stage": 3}})"},
       std::nullopt,
       at::kBFloat16,
       at::kBFloat16},
      {{"p_bf16_masters_z1.json", R"({"train_micro_batch_size_per_gpu": "auto",
          "bf16": {"enabled": true, "bf16_master_weights_and_grads": true}, "zero_optimization": {"stage": 1}})"},
       std::nullopt,
       at::kBFloat16,
       at::kBFloat16},
      {{"p_bf16_no_masters.json", R"({"train_micro_batch_size_per_gpu": "auto",
          "bf16": {"enabled": true, "bf16_master_weights_and_grads": false}, "zero_optimization": {"stage": 3}})"},
       std::nullopt,
       at::kBFloat16,
       at::kFloat},
  };
  for (const PolicyCase& pc : cases) {
    SCOPED_TRACE(pc.c.name);
    AcceleratorOptions o = mp_options(mp_config_file(pc.c.name, pc.c.text));
    o.mixed_precision = pc.mp;
    Accelerator acc(o);
    auto model = make_fp32_mlp();
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
    DataLoader<Rows> loader = micro_batch_loader();
    auto opt = acc.prepare(model, adamw, loader);
    for (const auto& kv : model->named_parameters()) EXPECT_EQ(kv.value().scalar_type(), pc.compute) << kv.key();
    const auto& flats = acc.engine()->flats();
    ASSERT_FALSE(flats.empty());
    for (const auto& f : flats) {
      ASSERT_TRUE(f.master.defined());
      EXPECT_EQ(f.master.scalar_type(), pc.master);
      EXPECT_EQ(f.flat_param->shard().scalar_type(), pc.compute);
    }
    for (auto& g : opt->inner().param_groups())
      for (auto& p : g.params()) EXPECT_EQ(p.scalar_type(), pc.master) << "the optimizer steps the masters";
    // One step: the optimizer state follows the masters, and the compute copy is the master rounded.
    forward_backward(acc, *model, 0, false);
    opt->step();
    ASSERT_FALSE(acc.optimizer_step_was_skipped());
    auto& state = opt->inner().state();
    int with_state = 0;
    for (auto& g : opt->inner().param_groups())
      for (auto& p : g.params()) {
        auto it = state.find(p.unsafeGetTensorImpl());
        if (it == state.end()) continue;
        ++with_state;
        EXPECT_EQ(static_cast<torch::optim::AdamWParamState&>(*it->second).exp_avg().scalar_type(), pc.master);
      }
    EXPECT_GT(with_state, 0);
    for (const auto& f : flats) {
      const at::Tensor& dst = acc.engine()->spec().shards_optimizer() ? f.flat_param->shard() : f.flat_param->full();
      EXPECT_TRUE(at::equal(dst, f.master.to(pc.compute))) << "compute parameters are not the masters rounded";
    }
    acc.end_training();
  }
  // fp32: parameters and masters stay fp32 (masters only where the engine keeps them).
  {
    Accelerator acc(
        mp_options(mp_config_file("p_fp32.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n")));
    auto model = make_fp32_mlp();
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
    DataLoader<Rows> loader = micro_batch_loader();
    acc.prepare(model, adamw, loader);
    for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
    for (const auto& f : acc.engine()->flats())
      if (f.master.defined()) EXPECT_EQ(f.master.scalar_type(), at::kFloat);
  }
  // bf16 masters need bf16 compute: with fp16 (or fp32) chosen elsewhere, a ConfigError naming the key.
  auto expect_config_error = [](const AcceleratorOptions& o, const std::string& precision) {
    try {
      Accelerator acc(o);
      ADD_FAILURE() << "no error for bf16 masters under " << precision;
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("bf16_master_weights_and_grads"), std::string::npos) << m;
      EXPECT_NE(m.find("'" + precision + "'"), std::string::npos) << m;
    }
  };
  const std::string masters_on = R"({"train_micro_batch_size_per_gpu": 2,
      "bf16": {"enabled": true, "bf16_master_weights_and_grads": true}, "zero_optimization": {"stage": 3}})";
  const std::string masters_auto = R"({"train_micro_batch_size_per_gpu": 2,
      "bf16": {"enabled": "auto", "bf16_master_weights_and_grads": true}, "zero_optimization": {"stage": 3}})";
  for (const auto& [name, text] :
       {std::pair{"bad_masters_on.json", masters_on}, std::pair{"bad_masters_auto.json", masters_auto}}) {
    SCOPED_TRACE(name);
    AcceleratorOptions o = mp_options(mp_config_file(name, text));
    o.mixed_precision = "fp16";
    expect_config_error(o, "fp16");
    o.mixed_precision = "no";
    expect_config_error(o, "no");
  }
}

// (e) The loss scaler's state (scale and hysteresis) goes through save_state / load_state.
TEST(MixedPrecision, Fp16ScalerStateSurvivesACheckpoint) {
  const std::vector<Case> cases = {fp16_cases()[0], fp16_cases()[2]};  // DDP, ZeRO-3
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string cfg = mp_config_file(c.name, c.text);
    const std::string one = run_dir() + "/ckpt_one_overflow_" + c.name,
                      two = run_dir() + "/ckpt_two_overflows_" + c.name;
    {
      Trainer t(mp_options(cfg));
      t.step(0, false);
      t.step(1, true);  // hysteresis 2 -> 1, scale stays 2^16
      ASSERT_TRUE(t.acc.optimizer_step_was_skipped());
      ASSERT_EQ(*t.acc.loss_scale(), 65536.0);
      t.acc.save_state(one);
      t.step(1, true);  // halves: 2^15 (hysteresis stays 1 until a doubling)
      ASSERT_EQ(*t.acc.loss_scale(), 32768.0);
      t.acc.save_state(two);
      t.step(1, true);
      EXPECT_EQ(*t.acc.loss_scale(), 16384.0) << "the uninterrupted run, for comparison";
      t.acc.end_training();
    }
    {
      // Hysteresis: the first overflow after loading halves at once (a fresh scaler would keep 2^16).
      Trainer t(mp_options(cfg));
      EXPECT_EQ(*t.acc.loss_scale(), 65536.0);
      t.acc.load_state(one);
      EXPECT_EQ(*t.acc.loss_scale(), 65536.0);
      EXPECT_EQ(t.acc.step(), 1);
      t.step(1, true);
      EXPECT_TRUE(t.acc.optimizer_step_was_skipped());
      EXPECT_EQ(*t.acc.loss_scale(), 32768.0) << "the hysteresis was not restored";
      t.acc.end_training();
    }
    {
      Trainer t(mp_options(cfg));
      t.acc.load_state(two);
      EXPECT_EQ(*t.acc.loss_scale(), 32768.0) << "the scale was not restored";
      t.step(1, true);
      EXPECT_EQ(*t.acc.loss_scale(), 16384.0);
      t.step(2, false);
      EXPECT_FALSE(t.acc.optimizer_step_was_skipped());
      EXPECT_EQ(t.acc.step(), 2);
      t.acc.end_training();
    }
  }
}

}  // namespace
}  // namespace accel::test

namespace accel::test {
namespace {

// bf16 compute, fp32 reduction: the optimizer gets the fp32 average itself, not the average rounded
// back to bf16. Averaging two ranks' bf16 gradients gives values bf16 cannot hold (a sum of
// different exponents needs more bits), so some master-gradient element differs from its bf16
// rounding wherever a reduction happens (np >= 2), under DDP and ZeRO-1 (whose reductions land in
// the bf16 gradient buffer) as under ZeRO-3.
TEST(MixedPrecision, Bf16ReductionFeedsTheMastersInFp32) {
  if (world()->size() == 1) GTEST_SKIP() << "nothing is reduced at one rank";
  const std::vector<Case> cases = {
      {"bf16_ddp.yaml", "distributed_type: MULTI_CPU\nmixed_precision: bf16\n"},
      {"bf16_zero1.yaml", "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  zero_stage: 1\n"},
      {"bf16_zero3.yaml", "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  zero_stage: 3\n"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Accelerator acc(mp_options(mp_config_file(c.name, c.text)));
    auto model = make_fp32_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    auto loader = micro_batch_loader();
    auto opt = acc.prepare(model, sgd, loader);
    forward_backward(acc, *model, 0, /*inject=*/false);
    std::int64_t finer = 0, total = 0;
    for (const auto& f : acc.engine()->flats()) {
      if (!f.master.defined() || !f.master.grad().defined()) continue;
      const at::Tensor g = f.master.grad();
      ASSERT_EQ(g.scalar_type(), at::kFloat);
      finer += g.ne(g.to(at::kBFloat16).to(at::kFloat)).sum().item<std::int64_t>();
      total += g.numel();
    }
    at::Tensor t = at::full({1}, finer, at::kLong);
    acc.world()->all_reduce(t);  // under ZeRO each rank sees its own shard
    EXPECT_GT(t.item<std::int64_t>(), 0) << "every reduced gradient element is bf16-representable: it was "
                                            "rounded to bf16 after the fp32 reduction (of "
                                         << total << " on this rank)";
    opt->step();
    opt->zero_grad();
  }
}

}  // namespace
}  // namespace accel::test

namespace accel::test {
namespace {

// Each optimizer-owned master gradient of this rank, cloned in fp64 (undefined where none).
std::vector<at::Tensor> master_grads(Accelerator& acc) {
  std::vector<at::Tensor> out;
  for (const auto& f : acc.engine()->flats())
    out.push_back(f.master.defined() && f.master.grad().defined() ? f.master.grad().to(at::kDouble) : at::Tensor());
  return out;
}

const std::vector<Case>& bf16_cases() {
  static const std::vector<Case> cases = {
      {"acc_bf16_ddp.yaml", "distributed_type: MULTI_CPU\nmixed_precision: bf16\n"},
      {"acc_bf16_zero1.yaml",
       "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  zero_stage: 1\n"},
      {"acc_bf16_zero3.yaml",
       "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  zero_stage: 3\n"},
      {"acc_bf16_full_shard.yaml",
       "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n" + kUnits},
      {"acc_bf16_shard_grad_op.yaml",
       "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n" +
           kUnits},
  };
  return cases;
}

// The master gradients after backward passes of `batches`, no step: with accum > 1 as micro-steps of
// one accumulation window (each loss divided by accum); with accum == 1 as sync backwards.
std::vector<at::Tensor> grads_after(const Case& c, const std::vector<int>& batches, std::int64_t accum,
                                    bool sync_each_batch = false) {
  AcceleratorOptions o = mp_options(mp_config_file(c.name, c.text));
  o.gradient_accumulation_steps = accum;
  o.sync_each_batch = sync_each_batch;
  Accelerator acc(o);
  auto model = make_fp32_mlp();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto loader = micro_batch_loader();
  auto opt = acc.prepare(model, sgd, loader);
  for (int k : batches) {
    if (accum > 1) {
      auto scope = acc.accumulate();
      forward_backward(acc, *model, k, false);
    } else {
      forward_backward(acc, *model, k, false);
    }
  }
  return master_grads(acc);
}

// The sum, in fp64, of each batch's master gradients after a sync backward of it alone.
std::vector<at::Tensor> summed_alone(const Case& c, const std::vector<int>& batches) {
  std::vector<at::Tensor> sum;
  for (int k : batches) {
    auto g = grads_after(c, {k}, 1);
    if (sum.empty())
      sum = g;
    else
      for (std::size_t i = 0; i < g.size(); ++i)
        if (g[i].defined()) sum[i] += g[i];
  }
  return sum;
}

// bf16 compute, fp32 reduction: the gradients of an accumulation window add up in fp32, as FSDP2
// (reduce_dtype) and DeepSpeed's bf16 optimizer do, not in the bf16 gradient buffer, whether the
// micro-steps reduce (sync_each_batch) or not (no_sync). The window's master gradient, times accum (a
// power of two: exact), equals the sum of each micro-batch's own reduced gradient to fp32 rounding
// (measured: 0 at 1 and 2 ranks, 8.3e-8 at 3); adding in bf16 was off by 2.9e-3 to 5.4e-3.
TEST(MixedPrecision, Bf16AccumulationAddsInFp32) {
  const std::int64_t K = 4;
  const std::vector<int> batches = {0, 1, 2, 3};
  for (const auto& c : bf16_cases()) {
    const std::vector<at::Tensor> want = summed_alone(c, batches);
    for (bool each : {false, true}) {
      SCOPED_TRACE(c.name + (each ? " sync_each_batch" : " no_sync"));
      auto got = grads_after(c, batches, K, each);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].defined(), want[i].defined()) << i;
        if (got[i].defined()) EXPECT_LE(rel_err(got[i] * K, want[i]), 1e-6) << "flat " << i;
      }
    }
  }
}

// DeepSpeed's data_types.grad_accum_dtype "bf16" keeps the window in the parameters' dtype (half the
// memory between micro-steps): at one rank, where the reduction is the rank's own gradient, the window
// is each micro-batch's bf16 gradient added in bf16, one after the other, exactly; at more ranks it
// differs from the fp32 sum by bf16 rounding.
TEST(MixedPrecision, Bf16AccumulationInBf16WhenAskedFor) {
  const std::int64_t K = 4;
  const std::vector<int> batches = {0, 1, 2, 3};
  for (int stage : {1, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const std::string base = R"({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": true},
        "zero_optimization": {"stage": )" +
                             std::to_string(stage) + "}";
    const Case fp32{"acc_ds_fp32_" + std::to_string(stage) + ".json", base + "}"};
    const Case bf16{"acc_ds_bf16_" + std::to_string(stage) + ".json",
                    base + R"(, "data_types": {"grad_accum_dtype": "bf16"}})"};
    std::vector<at::Tensor> in_bf16, in_fp32;  // each micro-batch's gradients added in bf16 / fp32
    for (int k : batches) {
      auto g = grads_after(fp32, {k}, 1);
      if (in_bf16.empty()) {
        in_bf16 = g;
        in_fp32 = g;
        continue;
      }
      for (std::size_t i = 0; i < g.size(); ++i)
        if (g[i].defined()) {
          in_bf16[i] = (in_bf16[i] + g[i]).to(at::kBFloat16).to(at::kDouble);
          in_fp32[i] = in_fp32[i] + g[i];
        }
    }
    auto got = grads_after(bf16, batches, K, /*sync_each_batch=*/false);
    double off_fp32 = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].defined(), in_bf16[i].defined()) << i;
      if (!got[i].defined()) continue;
      if (world()->size() == 1) EXPECT_EQ(rel_err(got[i] * K, in_bf16[i]), 0) << "flat " << i;
      off_fp32 = std::max(off_fp32, rel_err(got[i] * K, in_fp32[i]));
    }
    at::Tensor t = at::full({1}, off_fp32, at::kDouble);
    world()->all_reduce(t, {comm::ReduceOp::Max});
    EXPECT_GT(t.item<double>(), 1e-4) << "the window was added in fp32, not in bf16";
  }
}

// An fp32 window under bf16 reductions (DeepSpeed's communication_data_type bf16 with
// grad_accum_dtype fp32): the sum is rounded to bf16 once and reduced as the gradients would be, DDP's
// fused buckets and ZeRO-1's in-place reduction included. Against each micro-batch's own reduced
// gradient, summed: at one rank exactly that sum rounded to bf16; at 2 and 3 ranks within the bf16
// roundings of the reductions (measured at most 4.6e-3; bf16's unit roundoff is 3.9e-3). A rank that
// stepped on its own unreduced sum would be off by the spread of the ranks' gradients, order 1.
TEST(MixedPrecision, Fp32WindowUnderBf16Reductions) {
  const std::int64_t K = 4;
  const std::vector<int> batches = {0, 1, 2, 3};
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string base = R"({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": true},
        "communication_data_type": "bf16", "zero_optimization": {"stage": )" +
                             std::to_string(stage) + "}";
    const Case alone{"acc_bf16_reduce_" + std::to_string(stage) + ".json", base + "}"};
    const Case window{"acc_bf16_reduce_fp32_window_" + std::to_string(stage) + ".json",
                      base + R"(, "data_types": {"grad_accum_dtype": "fp32"}})"};
    const std::vector<at::Tensor> want = summed_alone(alone, batches);
    auto got = grads_after(window, batches, K, /*sync_each_batch=*/false);
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].defined(), want[i].defined()) << i;
      if (!got[i].defined()) continue;
      worst = std::max(worst, rel_err(got[i] * K, want[i]));
      if (world()->size() == 1)  // (the reduction is the rank's own gradient: the sum rounded to bf16 once)
        EXPECT_EQ(rel_err(got[i] * K, want[i].to(at::kBFloat16).to(at::kDouble)), 0) << "flat " << i;
    }
    EXPECT_LE(worst, 1e-2);
  }
}

// An accumulation dtype that holds neither the compute dtype nor more (fp16 under bf16, bf16 under
// fp16) is refused at construction, naming the key; fp32 and the compute dtype are taken.
TEST(MixedPrecision, GradAccumDtypeMustHoldTheComputeDtype) {
  auto config = [](const std::string& precision, const std::string& accum) {
    return mp_config_file("accum_" + precision + "_" + accum + ".json",
                          R"({"train_micro_batch_size_per_gpu": "auto", ")" + precision +
                              R"(": {"enabled": true}, "data_types": {"grad_accum_dtype": ")" + accum + R"("}})");
  };
  for (const auto& [precision, other] : {std::pair{"bf16", "half"}, std::pair{"fp16", "bf16"}}) {
    SCOPED_TRACE(precision);
    try {
      Accelerator acc(mp_options(config(precision, other)));
      ADD_FAILURE() << "no error for grad_accum_dtype " << other << " under " << precision;
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("data_types.grad_accum_dtype"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("cannot hold the ") + precision + " gradients"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("use fp32, or ") + precision + " itself"), std::string::npos) << m;
    }
    for (const char* fine : {"fp32", precision})
      EXPECT_NO_THROW(Accelerator acc(mp_options(config(precision, fine)))) << fine;
  }
}

// Two sync backwards before a step add their reduced gradients, under bf16 compute as in fp32 (DDP
// once added the first average twice: 0.54 off at 2 ranks; the sum was in bf16 at one rank).
TEST(MixedPrecision, Bf16TwoSyncBackwardsAdd) {
  for (const auto& c : bf16_cases()) {
    SCOPED_TRACE(c.name);
    auto a = grads_after(c, {0}, 1), b = grads_after(c, {1}, 1), both = grads_after(c, {0, 1}, 1);
    ASSERT_EQ(both.size(), a.size());
    for (std::size_t i = 0; i < both.size(); ++i) {
      ASSERT_EQ(both[i].defined(), a[i].defined()) << i;
      if (both[i].defined()) EXPECT_LE(rel_err(both[i], a[i] + b[i]), 1e-6) << "flat " << i;
    }
  }
}

}  // namespace
}  // namespace accel::test
