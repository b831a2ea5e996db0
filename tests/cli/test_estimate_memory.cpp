// `accel estimate-memory`'s arithmetic, held against closed forms written out here independently of
// cli/estimate_memory.cpp: the ZeRO paper's example, other precisions and optimizers, offload, budgets
// and the recommendation, the parsers' accepted and refused inputs.
#include "cli/estimate_gpt.h"
#include "cli/estimate_memory.h"

#include <gtest/gtest.h>

#include <cctype>

#include <cmath>
#include <string>

namespace accel::cli {
namespace {

constexpr double kP = 7.5e9;  // the paper's example: 7.5B parameters on 64 ranks
constexpr int kN = 64;

EstimateRequest em_request(double params, int n) {
  EstimateRequest r;
  r.params = params;
  r.num_processes = n;
  return r;
}

// Device bytes of the four rows, in table order.
void expect_device(const Estimate& e, double ddp, double z1, double z2, double z3) {
  ASSERT_EQ(e.rows.size(), 4u);
  EXPECT_EQ(e.rows[0].strategy, zero::Strategy::NoShard);
  EXPECT_EQ(e.rows[1].strategy, zero::Strategy::Zero1);
  EXPECT_EQ(e.rows[2].strategy, zero::Strategy::Zero2);
  EXPECT_EQ(e.rows[3].strategy, zero::Strategy::Zero3);
  EXPECT_DOUBLE_EQ(e.rows[0].device_bytes, ddp);
  EXPECT_DOUBLE_EQ(e.rows[1].device_bytes, z1);
  EXPECT_DOUBLE_EQ(e.rows[2].device_bytes, z2);
  EXPECT_DOUBLE_EQ(e.rows[3].device_bytes, z3);
}

TEST(EstimateMemory, PaperExampleMixedPrecisionAdam) {
  // ZeRO paper, figure 1: K = 12, 16P, 4P + 12P/N, 2P + 14P/N, 16P/N.
  const Estimate e = estimate_memory(em_request(kP, kN));
  expect_device(e, 16 * kP, 4 * kP + 12 * kP / kN, 2 * kP + 14 * kP / kN, 16 * kP / kN);
  for (const auto& row : e.rows) {
    EXPECT_EQ(row.cpu_bytes, 0);
    EXPECT_FALSE(row.fits.has_value());
    EXPECT_TRUE(row.coef.note.empty());
  }
  EXPECT_FALSE(e.recommended.has_value());
  // The paper's printed figures: 120, 31.4, 16.6 and 1.9 GB.
  EXPECT_EQ(format_gb(e.rows[0].device_bytes), "120.0");
  EXPECT_EQ(format_gb(e.rows[1].device_bytes), "31.4");
  EXPECT_EQ(format_gb(e.rows[2].device_bytes), "16.6");
  EXPECT_EQ(format_gb(e.rows[3].device_bytes), "1.9");
  EXPECT_DOUBLE_EQ(e.bytes.optimizer(), 12);
}

TEST(EstimateMemory, Fp16EqualsBf16) {
  EstimateRequest r = em_request(kP, kN);
  r.dtype = Dtype::Fp16;
  expect_device(estimate_memory(r), 16 * kP, 4 * kP + 12 * kP / kN, 2 * kP + 14 * kP / kN, 16 * kP / kN);
}

TEST(EstimateMemory, Fp32AdamHasNoMasterCopy) {
  // p = g = 4, K' = 8 (exp_avg + exp_avg_sq): 16P, 8P + 8P/N, 4P + 12P/N, 16P/N.
  EstimateRequest r = em_request(1e9, 8);
  r.dtype = Dtype::Fp32;
  const double P = 1e9, N = 8;
  expect_device(estimate_memory(r), 16 * P, 8 * P + 8 * P / N, 4 * P + 12 * P / N, 16 * P / N);
}

TEST(EstimateMemory, SgdWithMomentum) {
  const double P = 3.5e8, N = 4;
  EstimateRequest r = em_request(P, 4);
  r.optimizer = OptimizerKind::Sgd;  // mixed: K = 4 master + 4 momentum = 8
  expect_device(estimate_memory(r), 12 * P, 4 * P + 8 * P / N, 2 * P + 10 * P / N, 12 * P / N);
  r.dtype = Dtype::Fp32;  // K' = 4 momentum
  expect_device(estimate_memory(r), 12 * P, 8 * P + 4 * P / N, 4 * P + 8 * P / N, 12 * P / N);
}

TEST(EstimateMemory, AdamEqualsAdamW) {
  EstimateRequest r = em_request(kP, kN);
  r.optimizer = OptimizerKind::Adam;
  expect_device(estimate_memory(r), 16 * kP, 4 * kP + 12 * kP / kN, 2 * kP + 14 * kP / kN, 16 * kP / kN);
}

TEST(EstimateMemory, Fp8OneByteParamsBf16Grads) {
  // p = 1, g = 2, K = 12: 15P, 3P + 12P/N, P + 14P/N, 15P/N.
  const double P = 1.3e9, N = 16;
  EstimateRequest r = em_request(P, 16);
  r.dtype = Dtype::Fp8;
  expect_device(estimate_memory(r), 15 * P, 3 * P + 12 * P / N, P + 14 * P / N, 15 * P / N);
}

TEST(EstimateMemory, OffloadOptimizer) {
  // CPU per rank: (4 fp32 params + 8 moments + 4 fp32 grads) P / N = 16P/N for ZeRO-1/2/3.
  // Device: ZeRO-1 keeps params and full grads (4P), ZeRO-2 params (2P), ZeRO-3 its param shard (2P/N).
  EstimateRequest r = em_request(kP, kN);
  r.offload = Offload::Optimizer;
  const Estimate e = estimate_memory(r);
  expect_device(e, 16 * kP, 4 * kP, 2 * kP, 2 * kP / kN);
  EXPECT_EQ(e.rows[0].cpu_bytes, 0);
  EXPECT_FALSE(e.rows[0].coef.note.empty());  // DDP: offload needs ZeRO
  for (int i = 1; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(e.rows[i].cpu_bytes, 16 * kP / kN);
    EXPECT_TRUE(e.rows[i].coef.note.empty());
  }
}

TEST(EstimateMemory, OffloadOptimizerAndParams) {
  // ZeRO-3 keeps nothing on the device; the CPU adds the 2-byte working shard: 18P/N. ZeRO-1/2 offload
  // the optimizer only (with a note).
  EstimateRequest r = em_request(kP, kN);
  r.offload = Offload::OptimizerAndParams;
  Estimate e = estimate_memory(r);
  expect_device(e, 16 * kP, 4 * kP, 2 * kP, 0);
  EXPECT_DOUBLE_EQ(e.rows[1].cpu_bytes, 16 * kP / kN);
  EXPECT_DOUBLE_EQ(e.rows[2].cpu_bytes, 16 * kP / kN);
  EXPECT_DOUBLE_EQ(e.rows[3].cpu_bytes, 18 * kP / kN);
  EXPECT_FALSE(e.rows[1].coef.note.empty());
  EXPECT_FALSE(e.rows[2].coef.note.empty());
  EXPECT_TRUE(e.rows[3].coef.note.empty());
  // fp32: the offloaded parameters are the master: 16P/N. sgd mixed: 4 + 4 + 4 + 2 = 14P/N.
  r.dtype = Dtype::Fp32;
  EXPECT_DOUBLE_EQ(estimate_memory(r).rows[3].cpu_bytes, 16 * kP / kN);
  r.dtype = Dtype::Bf16;
  r.optimizer = OptimizerKind::Sgd;
  EXPECT_DOUBLE_EQ(estimate_memory(r).rows[3].cpu_bytes, 14 * kP / kN);
}

// Gradient accumulation, K = 4, mixed-precision AdamW (g = 2 bytes, the window's sum s = 4 in fp32),
// the paper's P and N.
TEST(EstimateMemory, AccumulationAddsWhatTheMicroStepsHold) {
  EstimateRequest r = em_request(kP, kN);
  r.accumulation.steps = 4;
  // NoSync: ZeRO-2/3 hold the whole sum, 4P, beside their shards; DDP and ZeRO-1 hold it in place of
  // the gradient buffer, 2P more.
  Estimate e = estimate_memory(r);
  expect_device(e, 18 * kP, 6 * kP + 12 * kP / kN, 6 * kP + 14 * kP / kN, 4 * kP + 16 * kP / kN);
  EXPECT_NE(e.rows[0].coef.note.find("in fp32 (2P more than the 2P gradient buffer"), std::string::npos);
  EXPECT_EQ(e.rows[1].coef.note, e.rows[0].coef.note);
  EXPECT_NE(e.rows[2].coef.note.find("NoSync"), std::string::npos);
  EXPECT_NE(e.rows[2].coef.note.find("in fp32"), std::string::npos);
  EXPECT_EQ(e.rows[3].coef.note, e.rows[2].coef.note);
  // Each micro-step reducing: the sum so far beside each new gradient, 4P for DDP, 4P/N for ZeRO-1;
  // ZeRO-2/3 add each reduced shard to the sum as its bucket finishes, and hold no more.
  r.accumulation.sync_each_batch = true;
  e = estimate_memory(r);
  expect_device(e, 20 * kP, 4 * kP + 16 * kP / kN, 2 * kP + 14 * kP / kN, 16 * kP / kN);
  for (const auto& row : e.rows) EXPECT_NE(row.coef.note.find("--sync_each_batch"), std::string::npos);
  EXPECT_NE(e.rows[2].coef.note.find("nothing more"), std::string::npos);
  // One micro-step a step: no accumulation, whichever way it would reduce.
  r.accumulation.steps = 1;
  e = estimate_memory(r);
  expect_device(e, 16 * kP, 4 * kP + 12 * kP / kN, 2 * kP + 14 * kP / kN, 16 * kP / kN);
  for (const auto& row : e.rows) EXPECT_TRUE(row.coef.note.empty());
  EXPECT_THROW(
      {
        r.accumulation.steps = 0;
        estimate_memory(r);
      },
      EstimateError);
}

// --grad_accum_dtype bf16 (DeepSpeed's data_types.grad_accum_dtype): the window sums in the gradients'
// own 2 bytes. DDP and ZeRO-1 then hold, under NoSync, what they hold without accumulation (the buffer
// is the sum, as measured: 8.00 bytes a parameter both ways in 2026-11-29-fp32-accumulation.md);
// ZeRO-2/3 hold 2P whole beside their shards, not 4P; reducing each micro-step, DDP holds 2P more.
TEST(EstimateMemory, AccumulationInTheGradientsDtype) {
  EstimateRequest r = em_request(kP, kN);
  r.accumulation.steps = 4;
  r.accumulation.dtype = Dtype::Bf16;
  Estimate e = estimate_memory(r);
  expect_device(e, 16 * kP, 4 * kP + 12 * kP / kN, 4 * kP + 14 * kP / kN, 2 * kP + 16 * kP / kN);
  EXPECT_TRUE(e.rows[0].coef.note.empty());
  EXPECT_EQ(e.rows[2].coef.note.find("in fp32"), std::string::npos);
  r.accumulation.sync_each_batch = true;
  e = estimate_memory(r);
  expect_device(e, 18 * kP, 4 * kP + 14 * kP / kN, 2 * kP + 14 * kP / kN, 16 * kP / kN);
  // fp32 named is the default.
  r.accumulation.dtype = Dtype::Fp32;
  EXPECT_DOUBLE_EQ(estimate_memory(r).rows[0].device_bytes, 20 * kP);
  // fp16 gradients sum in fp16 alike; fp8's gradients are bf16.
  r.dtype = Dtype::Fp16;
  r.accumulation.dtype = Dtype::Fp16;
  EXPECT_DOUBLE_EQ(estimate_memory(r).rows[0].device_bytes, 18 * kP);
  r.dtype = Dtype::Fp8;
  r.accumulation.dtype = Dtype::Bf16;
  EXPECT_DOUBLE_EQ(estimate_memory(r).rows[0].device_bytes, (1 + 2 + 12 + 2) * kP);
  // A sum that cannot hold the gradients is refused, naming the flag and what would do.
  const auto refused = [&](Dtype compute, Dtype sum, const std::string& says) {
    r.dtype = compute;
    r.accumulation.dtype = sum;
    try {
      estimate_memory(r);
      ADD_FAILURE() << to_string(sum) << " under " << to_string(compute) << " was accepted";
    } catch (const EstimateError& err) {
      EXPECT_NE(std::string(err.what()).find(says), std::string::npos) << err.what();
    }
  };
  refused(Dtype::Bf16, Dtype::Fp16, "--grad_accum_dtype: fp16 cannot hold bf16 gradients; fp32 or bf16");
  refused(Dtype::Fp16, Dtype::Bf16, "--grad_accum_dtype: bf16 cannot hold fp16 gradients; fp32 or fp16");
  refused(Dtype::Fp32, Dtype::Bf16, "--grad_accum_dtype: bf16 cannot hold fp32 gradients; fp32");
  refused(Dtype::Fp8, Dtype::Fp8, "--grad_accum_dtype: fp8 cannot hold bf16 gradients; fp32 or bf16");
}

TEST(EstimateMemory, AccumulationUnderOptimizerOffload) {
  // ZeRO-2/3 with the optimizer on the host add each reducing micro-step there, on the way: the device
  // holds no more (ZeRO-2 2P, ZeRO-3 2P/N as without accumulation). ZeRO-1's shard stays on the device.
  // NoSync holds the whole sum on the device all the same: 4P more (fp32) for ZeRO-2/3, 2P more for
  // DDP and ZeRO-1 (in place of their gradient buffer).
  EstimateRequest r = em_request(kP, kN);
  r.offload = Offload::Optimizer;
  r.accumulation.steps = 2;
  r.accumulation.sync_each_batch = true;
  Estimate e = estimate_memory(r);
  expect_device(e, 20 * kP, 4 * kP + 4 * kP / kN, 2 * kP, 2 * kP / kN);
  for (int i = 1; i < 4; ++i) EXPECT_DOUBLE_EQ(e.rows[i].cpu_bytes, 16 * kP / kN);
  r.accumulation.sync_each_batch = false;
  e = estimate_memory(r);
  expect_device(e, 18 * kP, 6 * kP, 6 * kP, 4 * kP + 2 * kP / kN);
  // The GPT estimate's states take the same terms: ZeRO-3 in fp32 at 2 ranks, NoSync: 4P + 16P/2.
  const GptShape s{.d_model = 256, .layers = 2, .heads = 4, .seq = 32};
  const double P = gpt_params(s);
  const GptPeak z3 = gpt_peak(zero::Strategy::Zero3, false, s, 2, Dtype::Fp32, OptimizerKind::AdamW, GptRuntime{},
                              false, Accumulation{.steps = 2});
  EXPECT_DOUBLE_EQ(z3.states, 4 * P + 16 * P / 2);
}

TEST(EstimateMemory, BudgetPaperExample) {
  // 24 GB: DDP (120) and ZeRO-1 (31.4) never fit (their replicated 16P and 4P alone exceed it);
  // ZeRO-2 fits from N >= 14 * 7.5 / (24 - 15) = 11.67 -> 12, ZeRO-3 from 16 * 7.5 / 24 = 5.
  EstimateRequest r = em_request(kP, kN);
  r.device_budget = 24e9;
  const Estimate e = estimate_memory(r);
  ASSERT_TRUE(e.rows[0].fits && e.rows[1].fits && e.rows[2].fits && e.rows[3].fits);
  EXPECT_FALSE(*e.rows[0].fits);
  EXPECT_FALSE(*e.rows[1].fits);
  EXPECT_TRUE(*e.rows[2].fits);
  EXPECT_TRUE(*e.rows[3].fits);
  EXPECT_FALSE(e.rows[0].min_ranks.has_value());
  EXPECT_FALSE(e.rows[1].min_ranks.has_value());
  EXPECT_EQ(e.rows[2].min_ranks, 12);
  EXPECT_EQ(e.rows[3].min_ranks, 5);
  ASSERT_TRUE(e.recommended.has_value());
  EXPECT_EQ(e.recommended->strategy, zero::Strategy::Zero2);
  EXPECT_EQ(e.recommended->offload, Offload::None);
  ASSERT_TRUE(e.passed_over.has_value());
  EXPECT_EQ(e.passed_over->strategy, zero::Strategy::Zero1);
  EXPECT_FALSE(e.without_offload.has_value());
  const std::string text = format_estimate(e);
  EXPECT_NE(text.find("Recommendation: ZeRO-2"), std::string::npos) << text;
  EXPECT_NE(text.find("7.4 GB"), std::string::npos) << text;  // 24 - 16.64 left for activations
}

TEST(EstimateMemory, EverythingFitsRecommendsDdp) {
  EstimateRequest r = em_request(1.3e9, 8);  // DDP: 16 * 1.3 = 20.8 GB
  r.device_budget = 80e9;
  const Estimate e = estimate_memory(r);
  ASSERT_TRUE(e.recommended.has_value());
  EXPECT_EQ(e.recommended->strategy, zero::Strategy::NoShard);
  EXPECT_FALSE(e.passed_over.has_value());
  EXPECT_DOUBLE_EQ(e.recommended->device_bytes, 16 * 1.3e9);
}

TEST(EstimateMemory, TightFitNamesTheNextOption) {
  // ZeRO-2 needs 16.64 GB of 17 GB: under 10% left, so the report names a roomier option.
  EstimateRequest r = em_request(kP, kN);
  r.device_budget = 17e9;
  const Estimate e = estimate_memory(r);
  ASSERT_TRUE(e.recommended && e.next_option);
  EXPECT_EQ(e.recommended->strategy, zero::Strategy::Zero2);
  EXPECT_LT(e.next_option->device_bytes, e.recommended->device_bytes);
  EXPECT_NE(format_estimate(e).find("under 10%"), std::string::npos);
}

TEST(EstimateMemory, OffloadSuggestedWhenNothingFitsOnDevice) {
  // N = 8, 24 GB: ZeRO-2 needs 2P + 14P/8 = 28.1 GB; ZeRO-2 + optimizer offload needs 2P = 15 GB and
  // comes before ZeRO-3 (15 GB too) in the order; ZeRO-3 is named as the no-offload alternative.
  EstimateRequest r = em_request(kP, 8);
  r.device_budget = 24e9;
  const Estimate e = estimate_memory(r);
  ASSERT_TRUE(e.recommended.has_value());
  EXPECT_EQ(e.recommended->strategy, zero::Strategy::Zero2);
  EXPECT_EQ(e.recommended->offload, Offload::Optimizer);
  EXPECT_DOUBLE_EQ(e.recommended->device_bytes, 2 * kP);
  EXPECT_DOUBLE_EQ(e.recommended->cpu_bytes, 16 * kP / 8);
  ASSERT_TRUE(e.without_offload.has_value());
  EXPECT_EQ(e.without_offload->strategy, zero::Strategy::Zero3);
  EXPECT_NE(format_estimate(e).find("--offload optimizer"), std::string::npos);
}

TEST(EstimateMemory, CpuBudgetCanRuleOutEverything) {
  // 70B on 8 ranks, 1 GB per device, 10 GB of CPU per rank: full offload would need 18 * 70 / 8 = 157.5.
  EstimateRequest r = em_request(70e9, 8);
  r.device_budget = 1e9;
  r.cpu_budget = 10e9;
  const Estimate e = estimate_memory(r);
  EXPECT_FALSE(e.recommended.has_value());
  // ZeRO-3 without offload: 16 * 70e9 / N <= 1e9 from N = 1120.
  EXPECT_EQ(e.rows[3].min_ranks, 1120);
  EXPECT_NE(format_estimate(e).find("Recommendation: none"), std::string::npos);
}

TEST(EstimateMemory, MinRanksIsTheSmallestThatFits) {
  for (double budget : {5e9, 9.99e9, 16e9, 16.640625e9, 20e9, 31e9, 1e12}) {
    const auto n = min_ranks_to_fit(2, 14, kP, budget);
    if (budget <= 2 * kP) {
      EXPECT_FALSE(n.has_value()) << budget;
      continue;
    }
    ASSERT_TRUE(n.has_value()) << budget;
    const double x = static_cast<double>(*n);
    EXPECT_LE((2 + 14 / x) * kP, budget);
    if (*n > 1) EXPECT_GT((2 + 14 / (x - 1)) * kP, budget);
  }
  EXPECT_EQ(min_ranks_to_fit(2, 14, kP, 16.640625e9), 64);  // exactly the paper's ZeRO-2 at N = 64
  EXPECT_EQ(min_ranks_to_fit(0, 16, kP, 1e15), 1);
  EXPECT_FALSE(min_ranks_to_fit(16, 0, kP, 24e9).has_value());
}

TEST(EstimateMemory, RefusesBadRequests) {
  EXPECT_THROW(estimate_memory(em_request(kP, 0)), EstimateError);
  EXPECT_THROW(estimate_memory(em_request(kP, -3)), EstimateError);
  EXPECT_THROW(estimate_memory(em_request(0, kN)), EstimateError);
  EXPECT_THROW(estimate_memory(em_request(-1, kN)), EstimateError);
  EstimateRequest r = em_request(kP, kN);
  r.device_budget = 0;
  EXPECT_THROW(estimate_memory(r), EstimateError);
  r.device_budget = -5e9;
  EXPECT_THROW(estimate_memory(r), EstimateError);
}

TEST(EstimateMemory, ParsesParameterCounts) {
  EXPECT_DOUBLE_EQ(parse_param_count("7.5e9"), 7.5e9);
  EXPECT_DOUBLE_EQ(parse_param_count("7.5B"), 7.5e9);
  EXPECT_DOUBLE_EQ(parse_param_count("350M"), 3.5e8);
  EXPECT_DOUBLE_EQ(parse_param_count("1.3b"), 1.3e9);
  EXPECT_DOUBLE_EQ(parse_param_count("125k"), 1.25e5);
  EXPECT_DOUBLE_EQ(parse_param_count("1T"), 1e12);
  EXPECT_DOUBLE_EQ(parse_param_count("70G"), 7e10);
  EXPECT_DOUBLE_EQ(parse_param_count("1000"), 1000);
  for (const char* bad : {"", "abc", "-5", "0", "-7.5B", "7.5X", "7.5BB", "B", "nan", "inf", "0.4", "1e30"})
    EXPECT_THROW(parse_param_count(bad), EstimateError) << bad;
  try {
    parse_param_count("abc");
  } catch (const EstimateError& e) {
    EXPECT_NE(std::string(e.what()).find("--params"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("abc"), std::string::npos);
  }
}

TEST(EstimateMemory, ParsesByteSizes) {
  EXPECT_DOUBLE_EQ(parse_byte_size("24GB"), 24e9);
  EXPECT_DOUBLE_EQ(parse_byte_size("24gb"), 24e9);
  EXPECT_DOUBLE_EQ(parse_byte_size("24G"), 24e9);
  EXPECT_DOUBLE_EQ(parse_byte_size("24"), 24e9);
  EXPECT_DOUBLE_EQ(parse_byte_size("80GiB"), 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_byte_size("512MB"), 512e6);
  EXPECT_DOUBLE_EQ(parse_byte_size("1.5TB"), 1.5e12);
  EXPECT_DOUBLE_EQ(parse_byte_size("1000B"), 1000);
  for (const char* bad : {"", "abc", "24XB", "-1GB", "0", "0GB", "GB", "inf"})
    EXPECT_THROW(parse_byte_size(bad), EstimateError) << bad;
  try {
    parse_byte_size("24XB", "--cpu_budget");
  } catch (const EstimateError& e) {
    EXPECT_NE(std::string(e.what()).find("--cpu_budget"), std::string::npos);
  }
}

TEST(EstimateMemory, ParsesNamesAndCounts) {
  EXPECT_EQ(parse_num_processes("64"), 64);
  EXPECT_EQ(parse_num_processes("1"), 1);
  for (const char* bad : {"", "0", "-1", "abc", "1.5", "8x", "99999999999"})
    EXPECT_THROW(parse_num_processes(bad), EstimateError) << bad;
  EXPECT_EQ(parse_dtype("bf16"), Dtype::Bf16);
  EXPECT_EQ(parse_dtype("FP16"), Dtype::Fp16);
  EXPECT_EQ(parse_dtype("fp32"), Dtype::Fp32);
  EXPECT_EQ(parse_dtype("no"), Dtype::Fp32);
  EXPECT_EQ(parse_dtype("fp8"), Dtype::Fp8);
  EXPECT_THROW(parse_dtype("fp64"), EstimateError);
  EXPECT_THROW(parse_dtype("int8"), EstimateError);
  EXPECT_EQ(parse_optimizer("adamw"), OptimizerKind::AdamW);
  EXPECT_EQ(parse_optimizer("Adam"), OptimizerKind::Adam);
  EXPECT_EQ(parse_optimizer("sgd"), OptimizerKind::Sgd);
  EXPECT_THROW(parse_optimizer("lion"), EstimateError);
  EXPECT_EQ(parse_offload("none"), Offload::None);
  EXPECT_EQ(parse_offload("optimizer"), Offload::Optimizer);
  EXPECT_EQ(parse_offload("optimizer+params"), Offload::OptimizerAndParams);
  EXPECT_THROW(parse_offload("nvme"), EstimateError);
  EXPECT_THROW(parse_offload("params"), EstimateError);
}

TEST(EstimateMemory, Formatting) {
  EXPECT_EQ(formula(16, 0), "16P");
  EXPECT_EQ(formula(4, 12), "4P + 12P/N");
  EXPECT_EQ(formula(0, 16), "16P/N");
  EXPECT_EQ(formula(1, 14), "P + 14P/N");
  EXPECT_EQ(formula(0, 0), "0");
  EXPECT_EQ(format_param_count(7.5e9), "7.5B");
  EXPECT_EQ(format_param_count(3.5e8), "350M");
  EXPECT_EQ(format_param_count(1.25e5), "125k");
  EXPECT_EQ(format_param_count(1e12), "1T");
  EXPECT_EQ(format_param_count(999), "999");
  EXPECT_EQ(format_gb(0), "0");
  EXPECT_EQ(format_gb(2.5e8), "0.25");
  EXPECT_EQ(format_gb(1e3), "<0.001");
  const std::string text = format_estimate(estimate_memory(em_request(kP, kN)));
  EXPECT_NE(text.find("Model states only"), std::string::npos) << text;
  EXPECT_NE(text.find("GB = 1e9 bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("--budget"), std::string::npos) << text;  // the hint when no budget was given
  EXPECT_NE(text.find("4P + 12P/N"), std::string::npos) << text;
}

// Copies of shard groups (--shard_group_size S): each rank stores what it would in a job of S ranks,
// whatever the job's size; DDP stores 16P anyway. The paper's example at 64 ranks in groups of 8.
TEST(EstimateMemory, ShardGroupsStoreWhatAJobOfTheirSizeStores) {
  EstimateRequest r = em_request(kP, kN);
  r.shard_group_size = 8;
  EXPECT_EQ(r.shard_over(), 8);
  const Estimate e = estimate_memory(r);
  expect_device(e, 16 * kP, 4 * kP + 12 * kP / 8, 2 * kP + 14 * kP / 8, 16 * kP / 8);
  // (15.0 GB for ZeRO-3 where the 64-rank group needed 1.9)
  EXPECT_EQ(format_gb(e.rows[3].device_bytes), "15.0");
  // 40 GB: ZeRO-1 over 64 (31.4 GB) would fit, over 8 (4P + 12P/8 = 41.25 GB) it does not; ZeRO-2 over 8
  // (2P + 14P/8 = 28.1 GB) does.
  r.device_budget = 40e9;
  const Estimate b = estimate_memory(r);
  ASSERT_TRUE(b.recommended.has_value());
  EXPECT_EQ(b.recommended->strategy, zero::Strategy::Zero2);
  EXPECT_EQ(b.recommended->offload, Offload::None);
  EXPECT_FALSE(*b.rows[1].fits);
  // ZeRO-1 would fit from groups of 9 (30 + 90/N <= 40 GB), but groups divide the 64 ranks: 16.
  EXPECT_EQ(b.rows[1].min_ranks, 16);
  const std::string text = format_estimate(b);
  EXPECT_NE(text.find("64 ranks in shard groups of 8 (8 copies of each shard"), std::string::npos) << text;
  EXPECT_NE(text.find("N = ranks of a shard group (8)"), std::string::npos) << text;
  EXPECT_NE(text.find("the copies also all-reduce each rank's P/N gradient shard"), std::string::npos) << text;
  EXPECT_NE(text.find("no, fits in shard groups of 16"), std::string::npos) << text;
  EXPECT_NE(text.find("shard group hold"), std::string::npos) << text;  // (node-shared: a group, not the job)
  // One group of every rank is the plain table, to the letter.
  r.shard_group_size = kN;
  expect_device(estimate_memory(r), 16 * kP, 4 * kP + 12 * kP / kN, 2 * kP + 14 * kP / kN, 16 * kP / kN);
  EstimateRequest plain = r;
  plain.shard_group_size = 0;
  EXPECT_EQ(format_estimate(estimate_memory(r)), format_estimate(estimate_memory(plain)));
  // Groups that do not divide the job, or more ranks than it has, are refused naming both flags.
  for (int bad : {7, 128}) {
    r.shard_group_size = bad;
    try {
      estimate_memory(r);
      ADD_FAILURE() << "--shard_group_size " << bad << " accepted";
    } catch (const EstimateError& err) {
      EXPECT_NE(std::string(err.what())
                    .find("--shard_group_size " + std::to_string(bad) +
                          " does not divide "
                          "--num_processes 64"),
                std::string::npos)
          << err.what();
    }
  }
}

TEST(EstimateMemory, RowsAreTheTableLabelsAndHybridShardIsNotARow) {
  EstimateRequest r;
  r.params = 1e9;
  r.num_processes = 4;
  const std::string text = format_estimate(estimate_memory(r));
  for (auto s : {zero::Strategy::NoShard, zero::Strategy::Zero1, zero::Strategy::Zero2, zero::Strategy::Zero3})
    EXPECT_NE(text.find(zero::info(s).label), std::string::npos) << zero::info(s).label << "\n" << text;
  EXPECT_EQ(text.find("HYBRID"), std::string::npos) << text;
  EXPECT_THROW(
      coefficients(zero::Strategy::HybridShard, bytes_per_param(Dtype::Bf16, OptimizerKind::AdamW), Offload::None),
      EstimateError);
}

}  // namespace
}  // namespace accel::cli

// ---------------------------------------------------------------------------------------------------
// A GPT shape (cli/estimate_gpt.h), against closed forms written out here.
namespace accel::cli {
namespace {

GptShape shape(long long d, long long layers, long long heads, long long seq, long long batch) {
  GptShape s;
  s.d_model = d;
  s.layers = layers;
  s.heads = heads;
  s.seq = seq;
  s.micro_batch = batch;
  return s;
}

TEST(EstimateGpt, ParametersOfTheExamplesGpt) {
  // step_bench's default model: vocab 4096, d 384, 10 blocks, seq 64 -> 19.3M (README).
  const GptShape s = shape(384, 10, 6, 64, 4);
  EXPECT_DOUBLE_EQ(gpt_root_params(s), 4096.0 * 384 + 64 * 384 + 2 * 384);
  EXPECT_DOUBLE_EQ(gpt_block_params(s), 12.0 * 384 * 384 + 10 * 384);
  EXPECT_DOUBLE_EQ(gpt_params(s), 19'331'328);
  // The numel step_bench printed for --d-model 128 --layers 2 --seq 32.
  EXPECT_DOUBLE_EQ(gpt_params(shape(128, 2, 4, 32, 1)), 924'416);
}

TEST(EstimateGpt, ActivationsEqualWhatStepBenchMeasured) {
  // memory::Category::Activations' peak, read by step_bench --json (fp32, ZERO_3, 2 ranks).
  EXPECT_DOUBLE_EQ(gpt_activations(shape(128, 2, 4, 32, 1), Dtype::Fp32).without_ckpt, 1'625'352);
  EXPECT_DOUBLE_EQ(gpt_activations(shape(96, 3, 6, 48, 2), Dtype::Fp32).without_ckpt, 5'296'136);
  EXPECT_DOUBLE_EQ(gpt_activations(shape(256, 4, 8, 64, 1), Dtype::Fp32).without_ckpt, 6'902'280);
  EXPECT_DOUBLE_EQ(gpt_activations(shape(64, 2, 2, 16, 3), Dtype::Fp32).without_ckpt, 1'993'096);
  // The same with --attention sdpa (step_bench --attention sdpa: the CPU's flash kernel).
  auto sdpa = [](GptShape s) {
    s.sdpa = true;
    return gpt_activations(s, Dtype::Fp32).without_ckpt;
  };
  EXPECT_DOUBLE_EQ(sdpa(shape(128, 2, 4, 32, 1)), 1'591'560);
  EXPECT_DOUBLE_EQ(sdpa(shape(96, 3, 6, 48, 2)), 4'964'360);
  EXPECT_DOUBLE_EQ(sdpa(shape(256, 4, 8, 64, 1)), 6'369'800);
  EXPECT_DOUBLE_EQ(sdpa(shape(64, 2, 2, 16, 3)), 1'981'064);
}

TEST(EstimateGpt, CheckpointingKeepsBlockInputsAndOneBlock) {
  const GptShape s = shape(512, 8, 8, 128, 2);
  const GptActivations a = gpt_activations(s, Dtype::Fp32);
  const double BTd = 2.0 * 128 * 512;
  EXPECT_DOUBLE_EQ(a.block, 4 * (16 * BTd + 2.0 * 8 * 128 * 128 + 4 * 2.0 * 128) + 128.0 * 128);
  EXPECT_DOUBLE_EQ(a.head, 4 * (BTd + 2 * 2.0 * 128 + 2 * 2.0 * 128 * 4096) + 8);
  EXPECT_DOUBLE_EQ(a.with_ckpt, 4 * 8 * BTd + a.head + a.block);
  EXPECT_LT(a.with_ckpt, a.without_ckpt / 2);
  // bf16 halves the tensors (not the bool mask).
  EXPECT_DOUBLE_EQ(gpt_activations(s, Dtype::Bf16).block,
                   2 * (16 * BTd + 2.0 * 8 * 128 * 128 + 4 * 2.0 * 128) + 128.0 * 128);
}

TEST(EstimateGpt, PeakTermsPerStrategy) {
  // d 2048, 20 blocks, seq 64, batch 1, 2 ranks, fp32 AdamW: the 1.2B-class target.
  const GptShape s = shape(2048, 20, 16, 64, 1);
  const double P = gpt_params(s), R = gpt_root_params(s), U = gpt_block_params(s);
  const GptRuntime rt;
  const GptActivations a = gpt_activations(s, Dtype::Fp32);
  const GptPeak z3 = gpt_peak(zero::Strategy::Zero3, true, s, 2, Dtype::Fp32, OptimizerKind::AdamW, rt);
  EXPECT_DOUBLE_EQ(z3.states, 16 * P / 2);
  EXPECT_DOUBLE_EQ(z3.gathered, 4 * (R + 2 * U));
  EXPECT_DOUBLE_EQ(z3.in_flight, 4 * (R + 2 * U));  // units (200 MB) are bigger than the 25 MiB bucket
  EXPECT_DOUBLE_EQ(z3.activations, a.with_ckpt);
  EXPECT_DOUBLE_EQ(z3.backward, 12 * R + a.block);
  EXPECT_DOUBLE_EQ(z3.optimizer, 8 * U / 2);
  EXPECT_DOUBLE_EQ(z3.total, rt.overhead + z3.states + z3.gathered + z3.in_flight + z3.activations + z3.backward);
  const GptPeak ddp = gpt_peak(zero::Strategy::NoShard, false, s, 2, Dtype::Fp32, OptimizerKind::AdamW, rt);
  EXPECT_DOUBLE_EQ(ddp.states, 16 * P);
  EXPECT_EQ(ddp.gathered, 0);
  EXPECT_EQ(ddp.in_flight, 0);
  EXPECT_DOUBLE_EQ(ddp.optimizer, 8 * U);
  // DDP steps whole units: AdamW's temporaries (8U = 0.4 GB) outgrow backward's peak here.
  EXPECT_GT(8 * U, a.without_ckpt + 12 * R + a.block);
  EXPECT_DOUBLE_EQ(ddp.total, rt.overhead + 16 * P + 8 * U);
  const GptPeak z1 = gpt_peak(zero::Strategy::Zero1, false, s, 2, Dtype::Fp32, OptimizerKind::AdamW, rt);
  EXPECT_DOUBLE_EQ(z1.states, 8 * P + 8 * P / 2);
  EXPECT_DOUBLE_EQ(z1.in_flight, 2 * rt.bucket_bytes);
  // Small units: the in-flight gradients are buckets, never more than the whole gradient.
  const GptShape tiny = shape(64, 2, 2, 16, 1);
  const GptPeak z2 = gpt_peak(zero::Strategy::Zero2, false, tiny, 2, Dtype::Fp32, OptimizerKind::AdamW, rt);
  EXPECT_DOUBLE_EQ(z2.in_flight, 4 * gpt_params(tiny));
}

// A GPT shape with copies of shard groups: ZeRO-3 over groups of 2 in a job of 8 holds 16P/2 of fp32
// AdamW states per rank, and its rows are those of a job of 2.
TEST(EstimateGpt, ShardGroupsAreRowsOfAJobOfTheirSize) {
  const GptShape s = shape(2048, 20, 16, 64, 1);
  EstimateRequest grouped, two;
  grouped.dtype = two.dtype = Dtype::Fp32;
  grouped.num_processes = 8;
  grouped.shard_group_size = 2;
  two.num_processes = 2;
  const GptEstimate g = estimate_gpt(s, grouped, {}), t = estimate_gpt(s, two, {});
  ASSERT_EQ(g.rows.size(), t.rows.size());
  for (std::size_t i = 0; i < g.rows.size(); ++i) {
    EXPECT_EQ(g.rows[i].strategy, t.rows[i].strategy);
    EXPECT_DOUBLE_EQ(g.rows[i].total, t.rows[i].total) << i;
    if (g.rows[i].strategy == zero::Strategy::Zero3) EXPECT_DOUBLE_EQ(g.rows[i].states, 16 * gpt_params(s) / 2);
  }
  const std::string text = format_gpt_estimate(g);
  EXPECT_NE(text.find("8 ranks in shard groups of 2 (4 copies of each shard"), std::string::npos) << text;
  EXPECT_NE(text.find("The 2 ranks of a shard\n  group hold"), std::string::npos) << text;
}

TEST(EstimateGpt, NodeSharedZero3GathersNothing) {
  // Node-shared ZeRO-3 (CPU ranks on one machine): each rank's share of the states as under ZeRO-3,
  // no gathered units, and no root unit gathered beside the optimizer step either.
  const GptShape s = shape(2048, 20, 16, 64, 1);
  const double R = gpt_root_params(s), U = gpt_block_params(s);
  const GptRuntime rt;
  for (bool ckpt : {false, true}) {
    const GptPeak z3 = gpt_peak(zero::Strategy::Zero3, ckpt, s, 2, Dtype::Fp32, OptimizerKind::AdamW, rt);
    const GptPeak ns = gpt_peak(zero::Strategy::Zero3, ckpt, s, 2, Dtype::Fp32, OptimizerKind::AdamW, rt, true);
    EXPECT_TRUE(ns.node_shared);
    EXPECT_EQ(ns.gathered, 0);
    EXPECT_DOUBLE_EQ(ns.states, z3.states);
    EXPECT_DOUBLE_EQ(ns.in_flight, z3.in_flight);
    EXPECT_DOUBLE_EQ(ns.total, z3.total - 4 * (R + 2 * U));  // (backward's term is the larger in both)
  }
  // One rank shares with nobody, and strategies that do not shard parameters have nothing to share.
  EXPECT_FALSE(gpt_peak(zero::Strategy::Zero3, false, s, 1, Dtype::Fp32, OptimizerKind::AdamW, rt, true).node_shared);
  EXPECT_FALSE(gpt_peak(zero::Strategy::Zero2, false, s, 2, Dtype::Fp32, OptimizerKind::AdamW, rt, true).node_shared);
  EstimateRequest r;
  r.num_processes = 2;
  r.dtype = Dtype::Fp32;
  const GptEstimate e = estimate_gpt(s, r, rt);
  const std::string text = format_gpt_estimate(e);
  for (const char* want : {"ZeRO-3 node-shared ", "ZeRO-3 node-shared + checkpointing ",
                           "ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0", "PSS"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " in\n" << text;
  EXPECT_EQ(estimate_gpt(s, EstimateRequest{}, rt).rows.size(), 8u) << "one rank: no node-shared rows";
}

TEST(EstimateMemory, NodeSharedSaysWhatEachRankAndTheMachineHold) {
  EstimateRequest r;
  r.params = 1e9;
  r.num_processes = 4;
  std::string text;  // (the paragraph is wrapped: one space wherever the text has spaces and line breaks)
  for (char c : format_estimate(estimate_memory(r)))
    if (!(std::isspace(static_cast<unsigned char>(c)) && !text.empty() && text.back() == ' '))
      text += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
  // bf16 AdamW: ZeRO-3 16P/N = 4 GB per rank, 16 GB for the machine; the peers' parameters 2P (N-1)/N = 1.5 GB.
  for (const char* want : {"Node-shared", "4.0 GB for ZeRO-3", "16.0 GB in all for the 4 ranks", "1.5 GB of its",
                           "ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " in\n" << text;
  r.num_processes = 1;
  EXPECT_EQ(format_estimate(estimate_memory(r)).find("Node-shared"), std::string::npos);
}

TEST(EstimateGpt, BudgetPicksTheLeastShardedRowThatFits) {
  EstimateRequest r;
  r.num_processes = 2;
  r.dtype = Dtype::Fp32;
  r.device_budget = 11e9;
  const GptEstimate e = estimate_gpt(shape(2048, 20, 16, 64, 1), r, GptRuntime{});
  ASSERT_EQ(e.rows.size(), 10u);  // 4 strategies with and without checkpointing, then ZeRO-3 node-shared
  EXPECT_EQ(e.request.params, gpt_params(shape(2048, 20, 16, 64, 1)));
  for (std::size_t i = 0; i < e.rows.size(); ++i) {
    EXPECT_EQ(e.rows[i].checkpoint, i % 2 == 1);
    EXPECT_EQ(e.rows[i].node_shared, i >= 8);
    EXPECT_EQ(*e.rows[i].fits, e.rows[i].total <= 11e9);
  }
  ASSERT_TRUE(e.recommended.has_value());
  EXPECT_EQ(e.recommended->strategy, zero::Strategy::Zero3);  // 16P = 16 GB under DDP: only ZeRO-3 fits
  EXPECT_FALSE(e.recommended->checkpoint);
  const std::string text = format_gpt_estimate(e);
  EXPECT_NE(text.find("Recommendation: ZeRO-3,"), std::string::npos) << text;
}

TEST(EstimateGpt, BadShapesNameTheFlag) {
  EstimateRequest r;
  EXPECT_THROW(
      {
        try {
          estimate_gpt(shape(100, 2, 3, 16, 1), r, GptRuntime{});
        } catch (const EstimateError& e) {
          EXPECT_NE(std::string(e.what()).find("--heads: 3 does not divide --d_model 100"), std::string::npos);
          throw;
        }
      },
      EstimateError);
  EXPECT_THROW(estimate_gpt(shape(64, 0, 2, 16, 1), r, GptRuntime{}), EstimateError);
  EXPECT_THROW(estimate_gpt(shape(64, 2, 2, 16, 0), r, GptRuntime{}), EstimateError);
  r.cpu_budget = -1;
  EXPECT_THROW(estimate_gpt(shape(64, 2, 2, 16, 1), r, GptRuntime{}), EstimateError);
}

TEST(EstimateGpt, OneRankGathersNothingWithoutParameterOffload) {
  // zero::Plan: parameters are sharded (and gathered) over more than one rank, or when offloaded.
  const GptShape s = shape(2048, 20, 16, 64, 1);
  const double R = gpt_root_params(s), U = gpt_block_params(s);
  const GptRuntime rt;
  EXPECT_EQ(gpt_peak(zero::Strategy::Zero3, false, s, 1, Dtype::Fp32, OptimizerKind::AdamW, rt).gathered, 0);
  EXPECT_DOUBLE_EQ(gpt_peak(zero::Strategy::Zero3, false, s, 2, Dtype::Fp32, OptimizerKind::AdamW, rt).gathered,
                   4 * (R + 2 * U));
  EXPECT_DOUBLE_EQ(gpt_peak(zero::Strategy::Zero3, false, s, 1, Dtype::Fp32, OptimizerKind::AdamW, rt, false, {},
                            Offload::OptimizerAndParams)
                       .gathered,
                   4 * (R + 2 * U) + 2 * 4 * U);
}

TEST(EstimateGpt, OffloadTermsAgainstClosedForms) {
  // d 2048, 20 blocks, seq 512, batch 1, 2 ranks, fp32 AdamW, fused attention (the GPU's shape).
  GptShape s = shape(2048, 20, 16, 512, 1);
  s.sdpa = true;
  const double P = gpt_params(s), R = gpt_root_params(s), U = gpt_block_params(s);
  const GptRuntime rt;
  const GptActivations a = gpt_activations(s, Dtype::Fp32);
  auto peak = [&](zero::Strategy st, bool ckpt, Offload o, Dtype dt = Dtype::Fp32) {
    return gpt_peak(st, ckpt, s, 2, dt, OptimizerKind::AdamW, rt, false, {}, o);
  };
  // ZeRO-Offload: the parameter shards stay (4P/N), the optimizer (master copy, moments, gradient:
  // 16 bytes) goes to the host, and the step's temporaries with it.
  const GptPeak opt = peak(zero::Strategy::Zero3, true, Offload::Optimizer);
  EXPECT_EQ(opt.offload, Offload::Optimizer);
  EXPECT_DOUBLE_EQ(opt.states, 4 * P / 2);
  EXPECT_DOUBLE_EQ(opt.cpu, 16 * P / 2);
  EXPECT_DOUBLE_EQ(opt.gathered, 4 * (R + 2 * U));
  EXPECT_DOUBLE_EQ(opt.in_flight, 4 * (R + 2 * U));
  EXPECT_EQ(opt.optimizer, 0);
  EXPECT_DOUBLE_EQ(opt.total, rt.overhead + 4 * P / 2 + 8 * (R + 2 * U) + a.with_ckpt + 12 * R + a.block);
  // ZeRO-Infinity: only the root unit's shard stays, beside it the two prefetched blocks' shards;
  // under fp32 the host's master is the parameter shard (no more CPU bytes), under bf16 2 bytes more.
  const GptPeak inf = peak(zero::Strategy::Zero3, true, Offload::OptimizerAndParams);
  EXPECT_DOUBLE_EQ(inf.states, 4 * R / 2);
  EXPECT_DOUBLE_EQ(inf.gathered, 4 * (R + 2 * U) + 2 * 4 * U / 2);
  EXPECT_DOUBLE_EQ(inf.cpu, 16 * P / 2);
  EXPECT_DOUBLE_EQ(
      inf.total, rt.overhead + 4 * R / 2 + 4 * (R + 2 * U) + 4 * U + 4 * (R + 2 * U) + a.with_ckpt + 12 * R + a.block);
  EXPECT_DOUBLE_EQ(peak(zero::Strategy::Zero3, true, Offload::OptimizerAndParams, Dtype::Bf16).cpu, 18 * P / 2);
  // ZeRO-2 offloads the optimizer only, and says so.
  const GptPeak z2 = peak(zero::Strategy::Zero2, false, Offload::OptimizerAndParams);
  EXPECT_DOUBLE_EQ(z2.states, 4 * P);
  EXPECT_DOUBLE_EQ(z2.cpu, 16 * P / 2);
  EXPECT_NE(z2.note.find("only the optimizer"), std::string::npos) << z2.note;
  EXPECT_TRUE(peak(zero::Strategy::Zero3, false, Offload::OptimizerAndParams).note.empty());
}

TEST(EstimateGpt, OffloadRowsAndTheirRecommendation) {
  GptShape s = shape(2048, 20, 16, 512, 1);
  s.sdpa = true;
  EstimateRequest r;
  r.num_processes = 2;
  r.dtype = Dtype::Fp32;
  r.offload = Offload::Optimizer;
  r.device_budget = 1e12;  // everything fits the device
  GptEstimate e = estimate_gpt(s, r, GptRuntime{});
  ASSERT_EQ(e.rows.size(), 6u);  // ZeRO-1/2/3 with and without checkpointing: no DDP, no node-shared rows
  EXPECT_EQ(e.rows[0].strategy, zero::Strategy::Zero1);
  for (const auto& p : e.rows) EXPECT_TRUE(p.fits && *p.fits);
  ASSERT_TRUE(e.recommended.has_value());
  EXPECT_EQ(e.recommended->strategy, zero::Strategy::Zero2) << "ZeRO-1 + offload is never the recommendation";
  EXPECT_FALSE(e.recommended->checkpoint);
  // A host that holds less than the optimizer's 16P/N fits nothing.
  r.cpu_budget = 16 * gpt_params(s) / 2 * 0.99;
  e = estimate_gpt(s, r, GptRuntime{});
  for (const auto& p : e.rows) EXPECT_FALSE(p.fits && *p.fits);
  EXPECT_FALSE(e.recommended.has_value());
  const std::string text = format_gpt_estimate(e);
  for (const char* want : {"CPU GB", "no (CPU)", "ZeRO-Offload", "Recommendation: none fits"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " in\n" << text;
  // Under an 8 GB device: ZeRO-Infinity's rows fit where ZeRO-Offload's parameters do not.
  r.cpu_budget.reset();
  r.device_budget = 8e9;
  r.offload = Offload::OptimizerAndParams;
  s.d_model = 3200;
  r.num_processes = 1;
  e = estimate_gpt(s, r, GptRuntime{});
  ASSERT_TRUE(e.recommended.has_value());
  EXPECT_EQ(e.recommended->strategy, zero::Strategy::Zero3);
  EXPECT_LT(e.recommended->total, 8e9);
  EXPECT_NE(format_gpt_estimate(e).find("with the optimizer and parameters offloaded"), std::string::npos);
}

// The device's peak that the caching allocator measured on one GPU (one rank, 8 GB cap, fp32 AdamW, 20
// layers, 16 heads, seq 512, batch 1, vocab 4096, sdpa; benchmarks/results/2026-11-27-h100-check-offload-mfu.md),
// against the estimate less its overhead (the allocator's peak does not count the runtime): +1.2%, +0.6%,
// -0.8% and +10.9%. The last is ZeRO-Infinity's, whose prefetched shards the estimate counts as alive
// together with everything else.
TEST(EstimateGpt, OffloadRowsFollowWhatAGpuMeasured) {
  struct Measured {
    long long d;
    bool ckpt;
    Offload offload;
    double bytes;
  };
  for (const Measured m :
       {Measured{2048, false, Offload::Optimizer, 5.98e9}, Measured{2304, false, Offload::Optimizer, 7.38e9},
        Measured{2048, true, Offload::Optimizer, 4.90e9}, Measured{2048, true, Offload::OptimizerAndParams, 1.51e9}}) {
    GptShape s = shape(m.d, 20, 16, 512, 1);
    s.sdpa = true;
    GptRuntime rt;
    rt.overhead = 0;
    const GptPeak p =
        gpt_peak(zero::Strategy::Zero3, m.ckpt, s, 1, Dtype::Fp32, OptimizerKind::AdamW, rt, false, {}, m.offload);
    EXPECT_NEAR(p.total / m.bytes, 1.0, 0.11)
        << "d " << m.d << (m.ckpt ? " checkpointed" : "") << ", " << to_string(m.offload) << ": " << p.total << " B";
  }
}

}  // namespace
}  // namespace accel::cli
