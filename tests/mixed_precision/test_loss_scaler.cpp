// The fp16 loss scaler (DeepSpeed semantics) and its collective helpers.
//
// Expected trajectories come from two independent sources: hand-derived tables (the derivation is in
// the comments) and loss_scaler_reference.py, a line-by-line Python re-implementation of DeepSpeed's
// DynamicLossScaler.update_scale, run through the venv's python (ACCEL_PYTHON) on many sequences.
#include "mixed_precision/loss_scaler.h"
#include "test_world.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace accel::mixed_precision {
namespace {

struct Step {
  bool overflow;
  double scale_after;  // < 0: update() must throw LossScaleAtMinimumError at this step
};

void run_table(const LossScalerOptions& o, const std::vector<Step>& table) {
  LossScaler s(o);
  for (std::size_t i = 0; i < table.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    if (table[i].scale_after < 0) {
      EXPECT_THROW(s.update(table[i].overflow), LossScaleAtMinimumError);
      return;
    }
    EXPECT_EQ(s.update(table[i].overflow), table[i].overflow);  // skip exactly the overflowing steps
    EXPECT_EQ(s.scale(), table[i].scale_after);
  }
}

constexpr bool O = true;   // overflow
constexpr bool C = false;  // clean

TEST(LossScaler, DefaultsAreDeepSpeeds) {
  LossScaler s;
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);  // 2^16
  EXPECT_EQ(s.options().loss_scale_window, 1000);
  EXPECT_EQ(s.options().hysteresis, 2);
  EXPECT_FALSE(s.options().consecutive_hysteresis);
  EXPECT_EQ(s.options().min_loss_scale, 1.0);
  EXPECT_EQ(s.state().cur_hysteresis, 2);
}

// DeepSpeed's own test_dynamic_loss_scale.py setting: initial_scale_power 8, window 2, hysteresis 1.
// stable = iter - last_overflow_iter - 1 with last_overflow_iter = -1 at start, so the first doubling
// is at iter 2 (stable 2); after an overflow at iter k the clean iters k+1, k+2, k+3 have stable
// 0, 1, 2: the scale doubles on the third clean step. Hysteresis 1: every overflow halves.
TEST(LossScaler, HysteresisOneHalvesOnEveryOverflowAndDoublesEveryWindow) {
  LossScalerOptions o;
  o.initial_scale_power = 8;
  o.loss_scale_window = 2;
  o.hysteresis = 1;
  run_table(o, {{C, 256},    // iter 0: stable 0
                {C, 256},    // iter 1: stable 1
                {C, 512},    // iter 2: stable 2 % 2 == 0 -> x2
                {C, 512},    // iter 3: stable 3
                {C, 1024},   // iter 4: stable 4 -> x2
                {O, 512},    // iter 5: overflow, /2, last = 5
                {C, 512},    // iter 6: stable 0
                {C, 512},    // iter 7: stable 1
                {C, 1024},   // iter 8: stable 2 -> x2
                {O, 512},    // iter 9: /2
                {O, 256},    // iter 10: /2
                {O, 128}});  // iter 11: /2
}

// Default hysteresis 2 (delayed shift), window 3, consecutive_hysteresis false.
// cur_hysteresis starts at 2. The first overflow only decrements it (2 -> 1, no halving); from then on
// every overflow halves (cur_hysteresis stays 1: the halving does not refill it) until a doubling
// refills it (stable % window == 0 on a clean step).
TEST(LossScaler, DelayedShiftWithoutConsecutiveHysteresis) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.loss_scale_window = 3;
  run_table(o, {{C, 16},  // it0: stable 0                       hyst 2
                {O, 16},  // it1: hyst 2 -> 1, no halving; last=1
                {C, 16},  // it2: stable 0 (not refilled: only a doubling refills)
                {C, 16},  // it3: stable 1
                {O, 8},   // it4: hyst 1 -> halve; last=4
                {O, 4},   // it5: hyst still 1 -> halve; last=5
                {C, 4},   // it6: stable 0
                {C, 4},   // it7: stable 1
                {C, 4},   // it8: stable 2
                {C, 8},   // it9: stable 3 % 3 == 0 -> x2, hyst refilled to 2
                {C, 8},   // it10: stable 4
                {O, 8},   // it11: hyst 2 -> 1, no halving; last=11
                {O, 4},   // it12: hyst 1 -> halve
                {C, 4},
                {C, 4},
                {C, 4},     // it13..15: stable 0, 1, 2
                {O, 2},     // it16: hyst still 1 -> halve
                {O, 1},     // it17: -> 1 == min_loss_scale
                {O, -1}});  // it18: overflow at the minimum -> error
}

// Same sequence with consecutive_hysteresis: every clean step refills cur_hysteresis to 2, so an
// isolated overflow never halves; only two overflows in a row do.
TEST(LossScaler, DelayedShiftWithConsecutiveHysteresis) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.loss_scale_window = 3;
  o.consecutive_hysteresis = true;
  run_table(o, {{C, 16},  // it0: hyst 2
                {O, 16},  // it1: 2 -> 1; last=1
                {C, 16},  // it2: refill 2; stable 0
                {C, 16},  // it3: stable 1
                {O, 16},  // it4: 2 -> 1; last=4
                {O, 8},   // it5: 1 -> halve; last=5
                {C, 8},   // it6: refill; stable 0
                {C, 8},   // it7: stable 1
                {C, 8},   // it8: stable 2
                {C, 16},  // it9: stable 3 -> x2
                {C, 16},  // it10: stable 4
                {O, 16},  // it11: 2 -> 1
                {O, 8},   // it12: halve
                {C, 8},
                {C, 8},
                {C, 8},    // it13..15: refill; stable 0, 1, 2
                {O, 8},    // it16: 2 -> 1 (refilled by the clean steps)
                {O, 4},    // it17: halve
                {O, 2}});  // it18: still 1 -> halve
}

// min_loss_scale need not be a power of two: max(scale / 2, min) lands on it exactly, and the next
// overflow there is the error. 16 -> 8 -> 4 -> max(2, 3) = 3 -> error.
TEST(LossScaler, FloorsAtMinLossScaleThenThrowsWithAnActionableMessage) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.hysteresis = 1;
  o.min_loss_scale = 3;
  LossScaler s(o);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 4.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 3.0);
  try {
    s.update(true);
    FAIL() << "expected LossScaleAtMinimumError";
  } catch (const LossScaleAtMinimumError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("4 consecutive"), std::string::npos) << msg;  // what happened
    EXPECT_NE(msg.find("minimum scale 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("min_loss_scale"), std::string::npos) << msg;  // what to change
    EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
    EXPECT_NE(msg.find("inf/nan"), std::string::npos) << msg;
    EXPECT_NE(msg.find("learning rate"), std::string::npos) << msg;
  }
}

TEST(LossScaler, StaticScaleNeverChangesButStillSkipsOverflowingSteps) {
  LossScalerOptions o;
  o.loss_scale = 128;
  LossScaler s(o);
  EXPECT_FALSE(s.dynamic());
  for (bool ov : {false, true, true, true, false, true, false, false, false, false}) {
    EXPECT_EQ(s.update(ov), ov);
    EXPECT_EQ(s.scale(), 128.0);
  }
  EXPECT_EQ(s.state().skipped_steps, 4);
}

TEST(LossScaler, RejectsBadOptions) {
  auto bad = [](auto set) {
    LossScalerOptions o;
    set(o);
    EXPECT_THROW(LossScaler{o}, std::invalid_argument);
  };
  bad([](LossScalerOptions& o) { o.loss_scale = -1; });
  bad([](LossScalerOptions& o) { o.loss_scale = INFINITY; });
  bad([](LossScalerOptions& o) { o.loss_scale_window = 0; });
  bad([](LossScalerOptions& o) { o.hysteresis = 0; });
  bad([](LossScalerOptions& o) { o.min_loss_scale = 0; });
  bad([](LossScalerOptions& o) { o.initial_scale_power = -1; });
}

TEST(LossScaler, StateRoundTrips) {
  LossScalerOptions o;
  o.initial_scale_power = 5;
  o.loss_scale_window = 2;
  LossScaler a(o), b(o);
  const std::string seq = "0100110001";
  for (char c : seq) a.update(c == '1');
  b.load_state(a.state());
  for (char c : std::string("0010001100")) {
    a.update(c == '1');
    b.update(c == '1');
    EXPECT_EQ(a.scale(), b.scale());
  }
}

#ifdef ACCEL_PYTHON
// Runs loss_scaler_reference.py; returns one entry per step: the scale after it, or -1 for "raise".
std::vector<std::pair<double, int>> python_trajectory(const LossScalerOptions& o, const std::string& seq) {
  std::ostringstream cmd;
  cmd << ACCEL_PYTHON << " " << ACCEL_MP_TEST_DIR << "/loss_scaler_reference.py " << o.initial_scale_power << " "
      << o.loss_scale_window << " " << o.hysteresis << " " << (o.consecutive_hysteresis ? 1 : 0) << " "
      << o.min_loss_scale << " " << seq;
  FILE* p = popen(cmd.str().c_str(), "r");
  std::vector<std::pair<double, int>> out;
  if (!p) return out;
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    std::string l(line);
    if (l.rfind("raise", 0) == 0) {
      out.emplace_back(-1.0, 0);
      break;
    }
    std::istringstream is(l);
    double scale;
    int hyst;
    is >> scale >> hyst;
    out.emplace_back(scale, hyst);
  }
  pclose(p);
  return out;
}

// Many random overflow sequences (different densities, so the runs reach the minimum, grow back and
// exercise the hysteresis), over both consecutive_hysteresis settings, several windows, hysteresis
// 1..3 and a non-power-of-two min_loss_scale: the scale and cur_hysteresis after every step, and the
// error at the same step, as DeepSpeed's update_scale.
TEST(LossScaler, FollowsDeepSpeedsUpdateScaleOnRandomSequences) {
  if (test::world()->rank() != 0) GTEST_SKIP() << "single-process table test (rank 0 runs it)";
  std::mt19937 rng(1234);
  int cases = 0;
  for (int hyst : {1, 2, 3})
    for (bool consec : {false, true})
      for (int window : {1, 2, 5})
        for (double density : {0.05, 0.3, 0.7}) {
          LossScalerOptions o;
          o.initial_scale_power = 6;
          o.loss_scale_window = window;
          o.hysteresis = hyst;
          o.consecutive_hysteresis = consec;
          o.min_loss_scale = (cases % 2) ? 1.0 : 0.75;
          std::bernoulli_distribution d(density);
          std::string seq;
          for (int i = 0; i < 60; ++i) seq += d(rng) ? '1' : '0';
          const auto expected = python_trajectory(o, seq);
          ASSERT_FALSE(expected.empty()) << "could not run " << ACCEL_PYTHON;
          SCOPED_TRACE("hysteresis " + std::to_string(hyst) + " consecutive " + std::to_string(consec) + " window " +
                       std::to_string(window) + " seq " + seq);
          LossScaler s(o);
          for (std::size_t i = 0; i < expected.size(); ++i) {
            SCOPED_TRACE("step " + std::to_string(i));
            if (expected[i].first < 0) {
              EXPECT_THROW(s.update(seq[i] == '1'), LossScaleAtMinimumError);
              break;
            }
            s.update(seq[i] == '1');
            ASSERT_EQ(s.scale(), expected[i].first);
            ASSERT_EQ(s.state().cur_hysteresis, expected[i].second);
          }
          ++cases;
        }
  EXPECT_EQ(cases, 54);
}
#endif

// ---- collectives -------------------------------------------------------------------------------

std::vector<at::Tensor> some_grads(int rank, at::ScalarType dtype = at::kFloat) {
  at::manual_seed(100 + rank);
  return {at::randn({7, 5}).to(dtype), at::randn({13}).to(dtype), at::randn({2, 3, 4}).to(dtype)};
}

// An inf (or nan) in ONE rank's gradient: every rank's found_inf is true. For every choice of that
// rank, and with none: false everywhere.
TEST(FoundInfAcrossRanks, OneRanksInfIsSeenByEveryRank) {
  auto world = test::world();
  const int n = world->size(), r = world->rank();
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    auto clean = some_grads(r, dtype);
    EXPECT_FALSE(has_inf_or_nan(clean));
    EXPECT_FALSE(found_inf_across_ranks(clean, *world));
    for (int bad = 0; bad < n; ++bad)
      for (double poison : {double(INFINITY), -double(INFINITY), double(NAN)}) {
        auto g = some_grads(r, dtype);
        if (r == bad) g[1][5] = poison;
        EXPECT_EQ(has_inf_or_nan(g), r == bad);
        EXPECT_TRUE(found_inf_across_ranks(g, *world)) << "bad rank " << bad << " poison " << poison;
      }
  }
}

TEST(FoundInfAcrossRanks, OneAllReducePerCall) {
  auto world = test::world();
  auto g = some_grads(world->rank());
  g.push_back(at::Tensor());  // undefined gradients are skipped
  world->reset_counters();
  found_inf_across_ranks(g, *world);
  EXPECT_EQ(world->counters()[comm::Collective::AllReduce].calls, 1u);
  EXPECT_EQ(world->counters().total().calls, 1u);
  // A rank with no gradients still takes part (flag on the CPU by default).
  EXPECT_FALSE(found_inf_across_ranks({}, *world));
}

// Reference: gather every rank's shard, divide by the scale, then torch::nn::utils::clip_grad_norm_.
// Tolerance: fp32 gradients, one multiply by a double-computed coefficient vs two fp32 multiplies
// (divide, then clip): a few ulps, so rtol 1e-6. The norm: ours is accumulated in fp64, torch's in
// fp32 over <= 100 elements: rtol 1e-6.
TEST(UnscaleAndClip, EqualsUnscaleThenClipGradNormOnTheGatheredGradients) {
  auto world = test::world();
  const int n = world->size(), r = world->rank();
  for (double scale : {1.0, 1024.0, 65536.0})
    for (std::optional<double> max_norm :
         {std::optional<double>(), std::optional<double>(0.5), std::optional<double>(1e6)}) {
      SCOPED_TRACE("scale " + std::to_string(scale) + " max_norm " + (max_norm ? std::to_string(*max_norm) : "none"));
      // The "full" gradients (the same on every rank), scaled as a backward under this scale makes them.
      std::vector<at::Tensor> full;
      for (int i = 0; i < n; ++i)
        for (auto& t : some_grads(i)) full.push_back(t * scale);
      // This rank's shard: the tensors of "rank r" (rank-major, as a reduce-scatter leaves them).
      std::vector<at::Tensor> mine(full.begin() + 3 * r, full.begin() + 3 * r + 3);
      for (auto& t : mine) t = t.clone();
      const double norm = unscale_and_clip(mine, scale, max_norm, world.get());

      std::vector<at::Tensor> ref;
      for (auto& t : full) ref.push_back((t / scale).set_requires_grad(false));
      std::vector<at::Tensor> params;
      for (auto& g : ref) {
        auto p = at::zeros_like(g).set_requires_grad(true);
        p.mutable_grad() = g.clone();
        params.push_back(p);
      }
      const double ref_norm = max_norm ? torch::nn::utils::clip_grad_norm_(params, *max_norm)
                                       : torch::nn::utils::clip_grad_norm_(params, 1e30);  // no clipping: just the norm
      EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm);
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(at::allclose(mine[i], params[3 * r + i].grad(), 1e-6, 1e-9))
            << (mine[i] - params[3 * r + i].grad()).abs().max().item<double>();
      if (max_norm && *max_norm < ref_norm) {  // clipped: the global norm is now max_norm
        at::Tensor sq = at::zeros({1}, at::kDouble);
        for (auto& t : mine) sq += t.to(at::kDouble).pow(2).sum();
        world->all_reduce(sq);
        EXPECT_NEAR(std::sqrt(sq.item<double>()), *max_norm, 1e-5 * *max_norm);
      }
    }
}

// Replicated gradients (DDP): nullptr group, no communication, same result as the reference.
TEST(UnscaleAndClip, ReplicatedGradientsNeedNoCommunication) {
  auto world = test::world();
  auto g = some_grads(0);
  for (auto& t : g) t.mul_(512);
  std::vector<at::Tensor> params;
  for (auto& t : g) {
    auto p = at::zeros_like(t).set_requires_grad(true);
    p.mutable_grad() = t / 512;
    params.push_back(p);
  }
  world->reset_counters();
  const double norm = unscale_and_clip(g, 512, 0.25, nullptr);
  EXPECT_EQ(world->counters().total().calls, 0u);
  const double ref = torch::nn::utils::clip_grad_norm_(params, 0.25);
  EXPECT_NEAR(norm, ref, 1e-6 * ref);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(g[i], params[i].grad(), 1e-6, 1e-9));
}

// fp16 gradients under a large scale: their squares overflow fp16 (and the sum of squares could
// overflow fp32), so the norm is accumulated in fp64. The unscaled, clipped fp16 gradients equal the
// fp32 reference rounded to fp16: within one fp16 ulp for normal values (rtol 2^-10), and within
// one subnormal step (atol 2^-24) for the values the 1/scale multiplier pushes below fp16's normal range.
TEST(UnscaleAndClip, HalfGradientsUnderALargeScale) {
  auto world = test::world();
  const double scale = 32768;
  auto g32 = some_grads(world->rank());
  for (auto& t : g32) t.mul_(scale).clamp_(-60000, 60000);  // scaled values up to fp16's max (65504)
  std::vector<at::Tensor> g16;
  for (auto& t : g32) g16.push_back(t.to(at::kHalf));
  std::vector<at::Tensor> ref32;
  for (auto& t : g16) ref32.push_back(t.to(at::kFloat));
  const double norm16 = unscale_and_clip(g16, scale, 1.0, world.get());
  const double norm32 = unscale_and_clip(ref32, scale, 1.0, world.get());
  EXPECT_TRUE(std::isfinite(norm16));
  EXPECT_NEAR(norm16, norm32, 1e-9 * norm32);  // the same fp16 values, accumulated in fp64 both times
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(at::allclose(g16[i].to(at::kFloat), ref32[i], 1.0 / 1024, std::ldexp(1.0, -24)))
        << g16[i].to(at::kFloat).sub(ref32[i]).abs().max().item<double>() << " " << ref32[i].abs().max().item<double>()
        << " " << norm16;
}

}  // namespace
}  // namespace accel::mixed_precision
