// accel::optim::fused_step against torch::optim itself: the same optimizer type and options stepped by
// its own step() on clones of the same random parameters and gradients, several steps with new
// gradients each time, and every parameter, state tensor and step counter compared bit for bit
// (memcmp, stricter than torch::equal). Lengths that are not multiples of any vector width, 1 to 3 threads (so ATen
// splits its loops at other places than the fused step), Adam/AdamW with weight decay and amsgrad, SGD with every
// momentum option, param groups, parameters without gradients, and the cases it must refuse. ctest runs this binary
// under each ATEN_CPU_CAPABILITY this machine has (tests/optim/optim.cmake).
#include "optim/fused_step.h"
#include "optim/multi_tensor_step.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torch::optim::Optimizer;

// Distance in units in the last place between two floats, for the failure messages (NaNs: large).
std::int64_t ulps(float a, float b) {
  auto ordered = [](float x) {
    std::int32_t i;
    std::memcpy(&i, &x, sizeof i);
    return i < 0 ? std::int64_t{INT32_MIN} - i : std::int64_t{i};
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// "" when the two float tensors hold the same bits (stricter than torch::equal: -0 is not +0, a NaN
// equals the same NaN), else how they differ (count, worst ulps, first index).
std::string difference(const at::Tensor& expected, const at::Tensor& actual) {
  if (!expected.defined() || !actual.defined())
    return expected.defined() == actual.defined() ? "" : "one of the two is undefined";
  if (expected.sizes() != actual.sizes() || expected.scalar_type() != actual.scalar_type()) return "shape or dtype";
  const at::Tensor e = expected.contiguous(), a = actual.contiguous();
  const float* pe = e.data_ptr<float>();
  const float* pa = a.data_ptr<float>();
  std::int64_t count = 0, worst = 0, first = -1;
  for (std::int64_t i = 0; i < e.numel(); ++i) {
    if (std::memcmp(pe + i, pa + i, sizeof(float)) == 0) continue;
    if (first < 0) first = i;
    ++count;
    worst = std::max(worst, ulps(pe[i], pa[i]));
  }
  if (count == 0) return "";
  std::ostringstream out;
  out << count << " of " << e.numel() << " elements differ, by up to " << worst << " ulp; first at " << first << ": "
      << pe[first] << " expected, " << pa[first] << " got";
  return out.str();
}

// Every parameter and every state tensor and counter of `ref` (torch's step) and `fused` (fused_step)
// are identical; `what` names the case in failures.
void expect_same(Optimizer& ref, Optimizer& fused, const std::string& what) {
  ASSERT_EQ(ref.param_groups().size(), fused.param_groups().size());
  ASSERT_EQ(ref.state().size(), fused.state().size()) << what << ": number of state entries";
  for (std::size_t gi = 0; gi < ref.param_groups().size(); ++gi) {
    const auto& rp = ref.param_groups()[gi].params();
    const auto& fp = fused.param_groups()[gi].params();
    ASSERT_EQ(rp.size(), fp.size());
    for (std::size_t i = 0; i < rp.size(); ++i) {
      const std::string where = what + ", group " + std::to_string(gi) + ", param " + std::to_string(i);
      EXPECT_EQ(difference(rp[i], fp[i]), "") << where << ": parameter";
      auto rs = ref.state().find(rp[i].unsafeGetTensorImpl());
      auto fs = fused.state().find(fp[i].unsafeGetTensorImpl());
      ASSERT_EQ(rs == ref.state().end(), fs == fused.state().end()) << where << ": state present in one only";
      if (rs == ref.state().end()) continue;
      if (auto* r = dynamic_cast<torch::optim::AdamParamState*>(rs->second.get())) {
        auto* f = dynamic_cast<torch::optim::AdamParamState*>(fs->second.get());
        ASSERT_NE(f, nullptr) << where;
        EXPECT_EQ(r->step(), f->step()) << where << ": step";
        EXPECT_EQ(difference(r->exp_avg(), f->exp_avg()), "") << where << ": exp_avg";
        EXPECT_EQ(difference(r->exp_avg_sq(), f->exp_avg_sq()), "") << where << ": exp_avg_sq";
        EXPECT_EQ(difference(r->max_exp_avg_sq(), f->max_exp_avg_sq()), "") << where << ": max_exp_avg_sq";
      } else if (auto* r = dynamic_cast<torch::optim::AdamWParamState*>(rs->second.get())) {
        auto* f = dynamic_cast<torch::optim::AdamWParamState*>(fs->second.get());
        ASSERT_NE(f, nullptr) << where;
        EXPECT_EQ(r->step(), f->step()) << where << ": step";
        EXPECT_EQ(difference(r->exp_avg(), f->exp_avg()), "") << where << ": exp_avg";
        EXPECT_EQ(difference(r->exp_avg_sq(), f->exp_avg_sq()), "") << where << ": exp_avg_sq";
        EXPECT_EQ(difference(r->max_exp_avg_sq(), f->max_exp_avg_sq()), "") << where << ": max_exp_avg_sq";
      } else if (auto* r = dynamic_cast<torch::optim::SGDParamState*>(rs->second.get())) {
        auto* f = dynamic_cast<torch::optim::SGDParamState*>(fs->second.get());
        ASSERT_NE(f, nullptr) << where;
        EXPECT_EQ(difference(r->momentum_buffer(), f->momentum_buffer()), "") << where << ": momentum_buffer";
        EXPECT_FALSE(f->momentum_buffer().requires_grad()) << where;
      } else {
        FAIL() << where << ": unexpected state type";
      }
    }
  }
}

// Parameters of the given lengths, random, with requires_grad like a model's; `twin` gets clones.
std::vector<at::Tensor> make_params(const std::vector<std::int64_t>& lengths) {
  std::vector<at::Tensor> out;
  for (std::int64_t n : lengths) out.push_back(at::randn({n}).set_requires_grad(true));
  return out;
}
std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().set_requires_grad(true));
  return out;
}

// New gradients for step `step` on both sets: random, of varied scale (so that the square, the
// moments and the fused multiply-adds see every exponent range), identical in both. skip(i, step):
// parameter i has no gradient at that step (left undefined, as after zero_grad(set_to_none)).
void set_grads(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, int step,
               const std::function<bool(std::size_t, int)>& skip = nullptr) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (skip && skip(i, step)) {
      a[i].mutable_grad() = at::Tensor();
      b[i].mutable_grad() = at::Tensor();
      continue;
    }
    at::Tensor g = at::randn_like(a[i]) * at::exp(at::randn_like(a[i]) * 3);
    a[i].mutable_grad() = g.clone();
    b[i].mutable_grad() = g.clone();
  }
}

// Steps `ref` with its own step() and `fused` with fused_step, `steps` times, and compares after each.
void run_and_compare(Optimizer& ref, Optimizer& fused, const std::vector<at::Tensor>& ref_params,
                     const std::vector<at::Tensor>& fused_params, int steps, const std::string& what,
                     const std::function<bool(std::size_t, int)>& skip = nullptr) {
  for (int s = 0; s < steps; ++s) {
    set_grads(ref_params, fused_params, s, skip);
    ref.step();
    ASSERT_TRUE(accel::optim::fused_step(fused)) << what;
    expect_same(ref, fused, what + ", step " + std::to_string(s + 1));
    if (::testing::Test::HasFailure()) return;
  }
}

// Runs `body` at 1, 2 and 3 threads (ATen splits a 1000003-element loop at different places).
void for_thread_counts(const std::function<void(int)>& body) {
  const int saved = at::get_num_threads();
  for (int t : {1, 2, 3}) {
    at::set_num_threads(t);
    body(t);
    if (::testing::Test::HasFailure()) break;
  }
  at::set_num_threads(saved);
}

const std::vector<std::int64_t> kLengths = {1, 7, 45, 1000003};

struct AdamCase {
  bool adamw;
  double weight_decay;
  bool amsgrad;
};

class FusedAdam : public ::testing::TestWithParam<AdamCase> {};

template <class Opt, class Options>
void adam_case(const AdamCase& c, int threads) {
  torch::manual_seed(1234 + threads);
  auto pr = make_params(kLengths);
  auto pf = clones(pr);
  // Non-default lr, betas and eps, so no constant is the default's.
  auto options = Options(3e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(c.weight_decay).amsgrad(c.amsgrad);
  Opt ref(pr, options), fused(pf, options);
  std::ostringstream what;
  what << (c.adamw ? "AdamW" : "Adam") << " wd " << c.weight_decay << " amsgrad " << c.amsgrad << ", " << threads
       << " threads";
  run_and_compare(ref, fused, pr, pf, 5, what.str());
}

TEST_P(FusedAdam, EqualsTorchBitForBit) {
  const AdamCase c = GetParam();
  for_thread_counts([&](int threads) {
    if (c.adamw)
      adam_case<torch::optim::AdamW, torch::optim::AdamWOptions>(c, threads);
    else
      adam_case<torch::optim::Adam, torch::optim::AdamOptions>(c, threads);
  });
}

INSTANTIATE_TEST_SUITE_P(Options, FusedAdam,
                         ::testing::Values(AdamCase{false, 0.0, false}, AdamCase{false, 0.1, false},
                                           AdamCase{false, 0.0, true}, AdamCase{false, 0.1, true},
                                           AdamCase{true, 0.0, false}, AdamCase{true, 0.1, false},
                                           AdamCase{true, 0.0, true}, AdamCase{true, 0.1, true}),
                         [](const auto& info) {
                           const AdamCase& c = info.param;
                           return std::string(c.adamw ? "AdamW" : "Adam") + (c.weight_decay != 0 ? "_wd" : "_nowd") +
                                  (c.amsgrad ? "_amsgrad" : "");
                         });

struct SgdCase {
  double momentum, dampening;
  bool nesterov;
  double weight_decay;
};

class FusedSgd : public ::testing::TestWithParam<SgdCase> {};

TEST_P(FusedSgd, EqualsTorchBitForBit) {
  const SgdCase c = GetParam();
  for_thread_counts([&](int threads) {
    torch::manual_seed(99 + threads);
    auto pr = make_params(kLengths);
    auto pf = clones(pr);
    auto options = torch::optim::SGDOptions(0.05)
                       .momentum(c.momentum)
                       .dampening(c.dampening)
                       .nesterov(c.nesterov)
                       .weight_decay(c.weight_decay);
    torch::optim::SGD ref(pr, options), fused(pf, options);
    std::ostringstream what;
    what << "SGD momentum " << c.momentum << " dampening " << c.dampening << " nesterov " << c.nesterov << " wd "
         << c.weight_decay << ", " << threads << " threads";
    run_and_compare(ref, fused, pr, pf, 4, what.str());
  });
}

// Every combination torch accepts (nesterov needs momentum and no dampening).
std::vector<SgdCase> sgd_cases() {
  std::vector<SgdCase> out;
  for (double m : {0.0, 0.9})
    for (double d : {0.0, 0.1})
      for (bool n : {false, true})
        for (double wd : {0.0, 0.01})
          if (!n || (m > 0 && d == 0)) out.push_back({m, d, n, wd});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Options, FusedSgd, ::testing::ValuesIn(sgd_cases()), [](const auto& info) {
  const SgdCase& c = info.param;
  return std::string(c.momentum != 0 ? "momentum" : "plain") + (c.dampening != 0 ? "_dampening" : "") +
         (c.nesterov ? "_nesterov" : "") + (c.weight_decay != 0 ? "_wd" : "");
});

// Gradients that are exactly zero where an embedding's are (rows no batch used), so the second
// moments hold +0 in whole blocks and scattered among other values: the fused step takes those roots
// itself (MKL's vmsSqrt is slow on zeros) and must still give torch's bits. Also gradients whose
// square underflows (v = +0 while m is not), -0 gradients, and, under amsgrad, a state holding -0
// (written into both optimizers' state).
void adam_zero_moments_case(bool adamw, bool amsgrad, int threads) {
  torch::manual_seed(21 + threads);
  const std::int64_t rows = 300, width = 384;
  auto pr = make_params({rows * width, 1000003, 45});
  {
    // Where the gradients square to 0, parameters small enough that the update m / (root + eps)
    // shows in their bits: a wrong root of those zeros changes them.
    at::NoGradGuard no_grad;
    pr[1].slice(0, 1, 1000003, 7).fill_(1e-20f);
    pr[0].narrow(0, 0, 10 * width).fill_(1e-20f);
  }
  auto pf = clones(pr);
  std::unique_ptr<Optimizer> ref, fused;
  if (adamw) {
    auto o = torch::optim::AdamWOptions(2e-3).weight_decay(0.1).amsgrad(amsgrad);
    ref = std::make_unique<torch::optim::AdamW>(pr, o);
    fused = std::make_unique<torch::optim::AdamW>(pf, o);
  } else {
    auto o = torch::optim::AdamOptions(2e-3).amsgrad(amsgrad);  // (L2 decay: no gradient is zero)
    ref = std::make_unique<torch::optim::Adam>(pr, o);
    fused = std::make_unique<torch::optim::Adam>(pf, o);
  }
  const std::string what =
      std::string(adamw ? "AdamW" : "Adam") + (amsgrad ? " amsgrad" : "") + ", " + std::to_string(threads) + " threads";
  for (int s = 0; s < 4; ++s) {
    std::vector<at::Tensor> grads;
    // The "embedding": rows 10-99 never used, 100-199 only at step 0, the rest at random; within a
    // used row every third element -0 at odd steps. Rows 0-9 get gradients that square to 0 (whole
    // blocks of zero second moments under moving parameters).
    at::Tensor used = at::rand({rows}) < 0.5;
    used.narrow(0, 0, 100).fill_(false);
    used.narrow(0, 100, 100).fill_(s == 0);
    at::Tensor g0 = at::randn({rows, width}) * used.unsqueeze(1).to(at::kFloat);
    if (s % 2 == 1) g0.view({-1}).slice(0, 0, rows * width, 3).mul_(-0.0);
    g0.narrow(0, 0, 10).fill_(1e-30f);
    grads.push_back(g0.reshape({-1}));
    // Zeros scattered: every fifth element never gets a gradient, every seventh one that squares to 0.
    at::Tensor g1 = at::randn({1000003});
    g1.slice(0, 0, 1000003, 5).zero_();
    g1.slice(0, 1, 1000003, 7).fill_(1e-30f);
    grads.push_back(g1);
    grads.push_back(at::zeros({45}));
    for (std::size_t i = 0; i < grads.size(); ++i) {
      pr[i].mutable_grad() = grads[i].clone();
      pf[i].mutable_grad() = grads[i].clone();
    }
    ref->step();
    ASSERT_TRUE(accel::optim::fused_step(*fused)) << what;
    expect_same(*ref, *fused, what + ", step " + std::to_string(s + 1));
    if (::testing::Test::HasFailure()) return;
    if (amsgrad && s == 0)  // -0 in both states, where the next steps' gradients are zero
      for (auto* o : {ref.get(), fused.get()}) {
        auto& st = o->state().at((o == ref.get() ? pr : pf)[0].unsafeGetTensorImpl());
        at::Tensor vmax = adamw ? static_cast<torch::optim::AdamWParamState&>(*st).max_exp_avg_sq()
                                : static_cast<torch::optim::AdamParamState&>(*st).max_exp_avg_sq();
        vmax.narrow(0, 0, 50 * width).fill_(-0.0);
      }
  }
  // The blocks this is about were there: whole runs of +0 and zeros among other values.
  auto& st = fused->state().at(pf[0].unsafeGetTensorImpl());
  at::Tensor v = adamw ? static_cast<torch::optim::AdamWParamState&>(*st).exp_avg_sq()
                       : static_cast<torch::optim::AdamParamState&>(*st).exp_avg_sq();
  EXPECT_EQ(v.narrow(0, 0, 100 * width).count_nonzero().item<std::int64_t>(), 0) << what;
  EXPECT_GT(v.narrow(0, 200 * width, 100 * width).count_nonzero().item<std::int64_t>(), 0) << what;
  auto& st1 = fused->state().at(pf[1].unsafeGetTensorImpl());
  at::Tensor v1 = adamw ? static_cast<torch::optim::AdamWParamState&>(*st1).exp_avg_sq()
                        : static_cast<torch::optim::AdamParamState&>(*st1).exp_avg_sq();
  const std::int64_t zeros1 = v1.numel() - v1.count_nonzero().item<std::int64_t>();
  EXPECT_GT(zeros1, 1000003 / 5) << what;  // the fifths and the underflowing sevenths
  EXPECT_LT(zeros1, 1000003 / 2) << what;
}

TEST(FusedStep, ZeroSecondMomentsEqualTorch) {
  for (bool adamw : {false, true})
    for (bool amsgrad : {false, true})
      for_thread_counts([&](int threads) { adam_zero_moments_case(adamw, amsgrad, threads); });
}

// Groups with their own options; some parameters without a gradient at some steps (no state until
// their first gradient, skipped at the steps without one, as torch skips them).
TEST(FusedStep, ParamGroupsAndMissingGradients) {
  torch::manual_seed(7);
  auto pr = make_params({33, 1000, 5, 70001});
  auto pf = clones(pr);
  auto skip = [](std::size_t i, int step) { return (i == 1 && step < 2) || (i == 2 && step % 2 == 1); };
  {
    using torch::optim::AdamW;
    using torch::optim::AdamWOptions;
    std::vector<torch::optim::OptimizerParamGroup> gr, gf;
    gr.emplace_back(std::vector<at::Tensor>{pr[0], pr[1]},
                    std::make_unique<AdamWOptions>(AdamWOptions(1e-2).amsgrad(true)));
    gr.emplace_back(std::vector<at::Tensor>{pr[2], pr[3]});
    gf.emplace_back(std::vector<at::Tensor>{pf[0], pf[1]},
                    std::make_unique<AdamWOptions>(AdamWOptions(1e-2).amsgrad(true)));
    gf.emplace_back(std::vector<at::Tensor>{pf[2], pf[3]});
    AdamW ref(gr, AdamWOptions(2e-3).weight_decay(0.05)), fused(gf, AdamWOptions(2e-3).weight_decay(0.05));
    run_and_compare(ref, fused, pr, pf, 5, "AdamW groups", skip);
  }
  {
    using torch::optim::SGD;
    using torch::optim::SGDOptions;
    auto qr = make_params({33, 1000, 5, 70001});
    auto qf = clones(qr);
    std::vector<torch::optim::OptimizerParamGroup> gr, gf;
    gr.emplace_back(std::vector<at::Tensor>{qr[0], qr[2]},
                    std::make_unique<SGDOptions>(SGDOptions(0.1).momentum(0.5).nesterov(true)));
    gr.emplace_back(std::vector<at::Tensor>{qr[1], qr[3]});
    gf.emplace_back(std::vector<at::Tensor>{qf[0], qf[2]},
                    std::make_unique<SGDOptions>(SGDOptions(0.1).momentum(0.5).nesterov(true)));
    gf.emplace_back(std::vector<at::Tensor>{qf[1], qf[3]});
    SGD ref(gr, SGDOptions(0.02).momentum(0.9).dampening(0.2).weight_decay(1e-3));
    SGD fused(gf, SGDOptions(0.02).momentum(0.9).dampening(0.2).weight_decay(1e-3));
    // qr/qf's order differs from the groups'; set_grads only needs the two lists to correspond.
    run_and_compare(ref, fused, qr, qf, 4, "SGD groups", skip);
  }
}

// The state the fused step leaves is torch's own: torch's step continues from it (and the fused step
// from torch's), and the result equals torch stepping throughout.
TEST(FusedStep, StateInterchangeableWithTorch) {
  torch::manual_seed(11);
  auto pr = make_params({1000003, 9});
  auto pf = clones(pr);
  auto options = torch::optim::AdamOptions(1e-3).weight_decay(0.1).amsgrad(true);
  torch::optim::Adam ref(pr, options), mixed(pf, options);
  for (int s = 0; s < 6; ++s) {
    set_grads(pr, pf, s);
    ref.step();
    if (s % 3 == 2)
      mixed.step();  // torch's own step on the fused step's state, and then the fused on torch's
    else
      ASSERT_TRUE(accel::optim::fused_step(mixed));
    expect_same(ref, mixed, "Adam alternating with torch, step " + std::to_string(s + 1));
  }
}

// The span functions: a step over pieces of a tensor (as offloaded sub-groups and shards take it)
// gives the bits of the step over the whole, wherever the pieces are cut.
TEST(FusedStep, SpansEqualTheWhole) {
  torch::manual_seed(5);
  const std::int64_t n = 100003;
  at::Tensor p = at::randn({n}), m = at::randn({n}) * 0.1, v = at::rand({n}), vm = at::rand({n}) * 2;
  at::Tensor g = at::randn({n});
  accel::optim::AdamHyper h;
  h.weight_decay = 0.01;
  h.decoupled_weight_decay = true;
  h.amsgrad = true;
  at::Tensor p1 = p.clone(), m1 = m.clone(), v1 = v.clone(), vm1 = vm.clone();
  accel::optim::adam_step(p1.data_ptr<float>(), g.data_ptr<float>(), m1.data_ptr<float>(), v1.data_ptr<float>(),
                          vm1.data_ptr<float>(), n, 3, h);
  at::Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone(), vm2 = vm.clone();
  for (std::int64_t b = 0, len = 1; b < n; b += len, len = len * 3 + 1) {
    const std::int64_t e = std::min(n, b + len);
    accel::optim::adam_step(p2.data_ptr<float>() + b, g.data_ptr<float>() + b, m2.data_ptr<float>() + b,
                            v2.data_ptr<float>() + b, vm2.data_ptr<float>() + b, e - b, 3, h);
  }
  EXPECT_EQ(difference(p1, p2), "");
  EXPECT_EQ(difference(m1, m2), "");
  EXPECT_EQ(difference(v1, v2), "");
  EXPECT_EQ(difference(vm1, vm2), "");
  // And the step changed them (the comparison above is not between two untouched copies).
  EXPECT_FALSE(torch::equal(p1, p));
  EXPECT_FALSE(torch::equal(vm1, vm));

  accel::optim::SgdHyper s;
  s.lr = 0.1;
  s.momentum = 0.9;
  s.nesterov = true;
  at::Tensor q1 = p.clone(), b1 = m.clone(), q2 = p.clone(), b2 = m.clone();
  accel::optim::sgd_step(q1.data_ptr<float>(), g.data_ptr<float>(), b1.data_ptr<float>(), n, false, s);
  for (std::int64_t b = 0, len = 5; b < n; b += len, len = len * 2 + 3) {
    const std::int64_t e = std::min(n, b + len);
    accel::optim::sgd_step(q2.data_ptr<float>() + b, g.data_ptr<float>() + b, b2.data_ptr<float>() + b, e - b, false,
                           s);
  }
  EXPECT_EQ(difference(q1, q2), "");
  EXPECT_EQ(difference(b1, b2), "");
  EXPECT_FALSE(torch::equal(q1, p));
}

// In-place writes are visible to autograd's version check, as torch's in-place updates are.
TEST(FusedStep, BumpsVersionCounters) {
  auto p = make_params({10});
  torch::optim::SGD opt(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  p[0].mutable_grad() = at::ones({10});
  const auto before = p[0]._version();
  ASSERT_TRUE(accel::optim::fused_step(opt));
  EXPECT_GT(p[0]._version(), before);
}

// What it refuses, with nothing changed: the optimizer's own step() is the caller's fallback.
// The device step (multi_tensor_step.h), run on the CPU through PyTorch's CPU kernels of the same ops:
// it follows torch::optim's own step to float32 rounding (PyTorch's fused arithmetic orders the
// operations differently: measured 1.0e-7 of the largest value at most over 4 steps), keeps torch::optim's
// state (step counters, moments, momentum buffers: the same tensors a later torch::optim step
// reads) and skips parameters without a gradient; other dtypes are refused with nothing changed.
TEST(MultiTensorStep, FollowsTorchOptimAndKeepsItsState) {
  using accel::optim::multi_tensor_step;
  auto close = [](const std::vector<at::Tensor>& want, const std::vector<at::Tensor>& got, const std::string& what) {
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double err = ((got[i] - want[i]).abs().max() / want[i].abs().max()).item<double>();
      EXPECT_LE(err, 5e-7) << what << ", parameter " << i;
    }
  };
  struct Case {
    std::string name;
    std::function<std::unique_ptr<Optimizer>(const std::vector<at::Tensor>&)> make;
    const std::type_info& type;
  };
  const std::vector<Case> cases = {
      {"AdamW wd 0.1",
       [](const auto& ps) {
         return std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
       },
       typeid(torch::optim::AdamW)},
      {"AdamW amsgrad",
       [](const auto& ps) {
         return std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-2).amsgrad(true));
       },
       typeid(torch::optim::AdamW)},
      {"Adam L2 0.05",
       [](const auto& ps) {
         return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-2).weight_decay(0.05));
       },
       typeid(torch::optim::Adam)},
      {"SGD momentum nesterov wd",
       [](const auto& ps) {
         return std::make_unique<torch::optim::SGD>(
             ps, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
       },
       typeid(torch::optim::SGD)},
      {"SGD momentum dampening",
       [](const auto& ps) {
         return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1).momentum(0.8).dampening(0.3));
       },
       typeid(torch::optim::SGD)},
      {"SGD plain",
       [](const auto& ps) { return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1)); },
       typeid(torch::optim::SGD)},
  };
  for (const auto& c : cases) {
    at::manual_seed(3);
    const auto ref_params = make_params({7, 1000, 33});
    const auto dev_params = clones(ref_params);
    auto ref = c.make(ref_params), dev = c.make(dev_params);
    for (int s = 0; s < 4; ++s) {
      set_grads(ref_params, dev_params, s, [](std::size_t i, int step) { return i == 2 && step == 1; });
      ref->step();
      ASSERT_TRUE(multi_tensor_step(*dev, c.type, /*any_device=*/true)) << c.name;
      close(ref_params, dev_params, c.name + ", step " + std::to_string(s + 1));
    }
    // torch::optim's state: the same kinds of objects, counters and (to rounding) moments.
    for (std::size_t i = 0; i < ref_params.size(); ++i) {
      auto rit = ref->state().find(ref_params[i].unsafeGetTensorImpl());
      auto dit = dev->state().find(dev_params[i].unsafeGetTensorImpl());
      ASSERT_EQ(rit == ref->state().end(), dit == dev->state().end()) << c.name;
      if (rit == ref->state().end()) continue;
      if (auto* r = dynamic_cast<torch::optim::AdamWParamState*>(rit->second.get())) {
        auto* d = dynamic_cast<torch::optim::AdamWParamState*>(dit->second.get());
        ASSERT_NE(d, nullptr);
        EXPECT_EQ(d->step(), r->step()) << c.name;
        close({r->exp_avg(), r->exp_avg_sq()}, {d->exp_avg(), d->exp_avg_sq()}, c.name + " moments");
      } else if (auto* r = dynamic_cast<torch::optim::AdamParamState*>(rit->second.get())) {
        auto* d = dynamic_cast<torch::optim::AdamParamState*>(dit->second.get());
        ASSERT_NE(d, nullptr);
        EXPECT_EQ(d->step(), r->step()) << c.name;
      } else if (auto* r = dynamic_cast<torch::optim::SGDParamState*>(rit->second.get())) {
        auto* d = dynamic_cast<torch::optim::SGDParamState*>(dit->second.get());
        ASSERT_NE(d, nullptr);
        close({r->momentum_buffer()}, {d->momentum_buffer()}, c.name + " momentum");
      }
    }
    // Parameter 2 had no gradient at step 2: 3 steps counted, not 4.
    if (auto* d = dynamic_cast<torch::optim::AdamWParamState*>(dev->state()[dev_params[2].unsafeGetTensorImpl()].get()))
      EXPECT_EQ(d->step(), 3) << c.name;
  }
  // Not float32: refused, nothing changed.
  auto p = at::randn({5}, at::kDouble).set_requires_grad(true);
  p.mutable_grad() = at::ones_like(p);
  const at::Tensor before = p.detach().clone();
  torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(0.1));
  EXPECT_FALSE(multi_tensor_step(adamw, typeid(torch::optim::AdamW), true));
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(adamw.state().empty());
  // On the CPU without any_device, fused_step's own path: not this one.
  auto q = at::randn({5}).set_requires_grad(true);
  q.mutable_grad() = at::ones_like(q);
  torch::optim::AdamW cpu({q}, torch::optim::AdamWOptions(0.1));
  EXPECT_FALSE(multi_tensor_step(cpu, typeid(torch::optim::AdamW)));
}

TEST(FusedStep, RefusesWhatItDoesNotImplement) {
  auto unchanged = [](Optimizer& opt, const std::vector<at::Tensor>& params, const std::string& what) {
    std::vector<at::Tensor> before;
    for (const auto& p : params) before.push_back(p.detach().clone());
    const auto states = opt.state().size();
    EXPECT_FALSE(accel::optim::fused_step(opt)) << what;
    EXPECT_EQ(opt.state().size(), states) << what;
    for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i])) << what;
  };
  {  // float64
    auto p = std::vector<at::Tensor>{at::randn({8}, at::kDouble).set_requires_grad(true)};
    p[0].mutable_grad() = at::randn({8}, at::kDouble);
    torch::optim::Adam opt(p);
    unchanged(opt, p, "float64 Adam");
  }
  {  // one fine parameter and one non-contiguous one: nothing at all is stepped
    auto ok = at::randn({16}).set_requires_grad(true);
    auto strided = at::randn({4, 6}).t().set_requires_grad(true);
    ok.mutable_grad() = at::randn({16});
    strided.mutable_grad() = at::randn({6, 4});
    std::vector<at::Tensor> p{ok, strided};
    torch::optim::AdamW opt(p);
    unchanged(opt, p, "non-contiguous AdamW");
  }
  {  // non-contiguous gradient
    auto p = std::vector<at::Tensor>{at::randn({4, 6}).set_requires_grad(true)};
    p[0].mutable_grad() = at::randn({6, 4}).t();
    torch::optim::SGD opt(p, torch::optim::SGDOptions(0.1));
    unchanged(opt, p, "non-contiguous gradient");
  }
  {  // another optimizer
    auto p = std::vector<at::Tensor>{at::randn({8}).set_requires_grad(true)};
    p[0].mutable_grad() = at::randn({8});
    torch::optim::Adagrad opt(p);
    unchanged(opt, p, "Adagrad");
  }
  {  // a subclass: its step() may not be Adam's
    struct MyAdam : torch::optim::Adam {
      using Adam::Adam;
    };
    auto p = std::vector<at::Tensor>{at::randn({8}).set_requires_grad(true)};
    p[0].mutable_grad() = at::randn({8});
    MyAdam opt(p);
    unchanged(opt, p, "subclass of Adam");
  }
  {  // amsgrad switched on after the state was created without its max buffer (torch's step throws)
    auto p = std::vector<at::Tensor>{at::randn({8}).set_requires_grad(true)};
    p[0].mutable_grad() = at::randn({8});
    torch::optim::Adam opt(p);
    ASSERT_TRUE(accel::optim::fused_step(opt));
    static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options()).amsgrad(true);
    unchanged(opt, p, "amsgrad without max_exp_avg_sq");
  }
}

}  // namespace
