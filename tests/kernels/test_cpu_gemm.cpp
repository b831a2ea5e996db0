// accel::cpu_gemm: with Path::onednn, float32 CPU mm/addmm of the sizes a model's linear layers have go
// to oneDNN (its call counter moves) and equal a float64 product to float32 accuracy; everything else
// (small, other dtypes, odd strides, other addmm forms, shape errors) still goes to libtorch's own
// kernel, bit for bit; Path::libtorch gives every product back to libtorch. Also autograd through
// nn::Linear on both paths, ACCEL_CPU_GEMM's parsing, and auto's rule against /proc/cpuinfo.
#include "kernels/cpu_gemm.h"
#include "support/compare.h"
#include "support/scoped_env.h"

#include <ATen/ATen.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using accel::cpu_gemm::Path;
namespace cg = accel::cpu_gemm;

// rel_err (support/compare.h): float32 products of these sizes land near 1e-7-1e-6; a bf16 or tf32
// down-conversion would show as ~1e-3.
using accel::test::rel_err;
using accel::test::ScopedEnv;

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

class CpuGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cg::onednn_available()) GTEST_SKIP() << "oneDNN's matmul is not in this libtorch";
    at::manual_seed(7);
  }
  void TearDown() override { cg::install(Path::libtorch); }
};

TEST_F(CpuGemm, LinearShapesGoToOneDnnAndMatchFloat64) {
  ASSERT_EQ(cg::install(Path::onednn), Path::onednn);
  ASSERT_EQ(cg::installed(), Path::onednn);
  const int64_t M = 256, K = 384, N = 1536;
  at::Tensor x = at::randn({M, K}), w = at::randn({N, K}), g = at::randn({M, N}), bias = at::randn({N});
  struct Case {
    const char* what;
    at::Tensor a, b;
  };
  // The three products of a linear layer: forward x W^T, input gradient g W, weight gradient g^T x.
  for (const Case& c : {Case{"x @ W^T", x, w.t()}, Case{"g @ W", g, w}, Case{"g^T @ x", g.t(), x}}) {
    const auto before = cg::onednn_calls();
    at::Tensor y = at::mm(c.a, c.b);
    EXPECT_EQ(cg::onednn_calls(), before + 1) << c.what;
    const at::Tensor ref = at::mm(c.a.to(at::kDouble), c.b.to(at::kDouble));
    EXPECT_LT(rel_err(y, ref), 1e-5) << c.what;
    EXPECT_TRUE(y.is_contiguous()) << c.what;
    EXPECT_EQ(y.sizes(), ref.sizes()) << c.what;
  }
  const auto before = cg::onednn_calls();
  at::Tensor y = at::addmm(bias, x, w.t());
  EXPECT_EQ(cg::onednn_calls(), before + 1);
  const at::Tensor ref = at::addmm(bias.to(at::kDouble), x.to(at::kDouble), w.t().to(at::kDouble));
  EXPECT_LT(rel_err(y, ref), 1e-5);
}

// Resumed or recomputed work (checkpoints, activation checkpointing) must see the same bits: the
// same product of copies at other addresses (another alignment within a larger buffer) agrees.
TEST_F(CpuGemm, SameProductSameBitsWhereverItLies) {
  cg::install(Path::onednn);
  at::Tensor a = at::randn({256, 384}), b = at::randn({384, 1536});
  const at::Tensor y = at::mm(a, b);
  for (int64_t shift : {1, 3, 16}) {
    at::Tensor a2 = at::empty({256 * 384 + shift}).narrow(0, shift, 256 * 384).view({256, 384}).copy_(a);
    at::Tensor b2 = at::empty({384 * 1536 + shift}).narrow(0, shift, 384 * 1536).view({384, 1536}).copy_(b);
    const auto before = cg::onednn_calls();
    EXPECT_TRUE(same_bits(at::mm(a2, b2), y)) << "shifted by " << shift << " floats";
    EXPECT_EQ(cg::onednn_calls(), before + 1);
  }
}

TEST_F(CpuGemm, EverythingElseStaysOnLibtorchBitForBit) {
  cg::install(Path::onednn);
  at::Tensor big_a = at::randn({256, 384}), big_b = at::randn({384, 512}), bias = at::randn({512});
  at::Tensor wide = at::randn({256, 768});
  at::Tensor padded = at::randn({384, 520}), padded_t = at::randn({512, 400});
  at::Tensor hidden = at::randn({32, 16, 768}), pooled_g = at::randn({32, 768});
  struct Case {
    const char* what;
    std::function<at::Tensor()> ours, libtorch;
  };
  const Case cases[] = {
      {"small", [] { return at::mm(at::ones({64, 64}), at::ones({64, 64})); },
       [] { return at::cpu::mm(at::ones({64, 64}), at::ones({64, 64})); }},
      {"double", [&] { return at::mm(big_a.to(at::kDouble), big_b.to(at::kDouble)); },
       [&] { return at::cpu::mm(big_a.to(at::kDouble), big_b.to(at::kDouble)); }},
      {"every other column", [&] { return at::mm(wide.slice(1, 0, 768, 2), big_b); },
       [&] { return at::cpu::mm(wide.slice(1, 0, 768, 2), big_b); }},
      {"beta 0.5", [&] { return at::addmm(bias, big_a, big_b, 0.5); },
       [&] { return at::cpu::addmm(bias, big_a, big_b, 0.5); }},
      {"alpha 2", [&] { return at::addmm(bias, big_a, big_b, 1, 2); },
       [&] { return at::cpu::addmm(bias, big_a, big_b, 1, 2); }},
      {"full matrix added", [&] { return at::addmm(at::ones({256, 512}), big_a, big_b); },
       [&] { return at::cpu::addmm(at::ones({256, 512}), big_a, big_b); }},
      // A right operand with a padded leading dimension, row- or column-major (oneDNN would take its
      // reference kernel, ~1000x slower), and a strided column.
      {"padded rows", [&] { return at::mm(big_a, padded.narrow(1, 0, 512)); },
       [&] { return at::cpu::mm(big_a, padded.narrow(1, 0, 512)); }},
      {"padded columns", [&] { return at::mm(big_a, padded_t.narrow(1, 0, 384).t()); },
       [&] { return at::cpu::mm(big_a, padded_t.narrow(1, 0, 384).t()); }},
      // A pooler's weight gradient: its saved input is the first token's row of each sequence.
      {"rows of a larger tensor", [&] { return at::mm(pooled_g.t(), hidden.select(1, 0)); },
       [&] { return at::cpu::mm(pooled_g.t(), hidden.select(1, 0)); }},
      // Skinny: a dimension under 16.
      {"N = 8", [&] { return at::mm(at::ones({4096, 4096}), at::ones({4096, 8})); },
       [&] { return at::cpu::mm(at::ones({4096, 4096}), at::ones({4096, 8})); }},
      {"K = 1", [&] { return at::mm(at::ones({2048, 1}), at::ones({1, 2048})); },
       [&] { return at::cpu::mm(at::ones({2048, 1}), at::ones({1, 2048})); }},
  };
  for (const Case& c : cases) {
    const auto before = cg::onednn_calls();
    at::Tensor y = c.ours();
    EXPECT_EQ(cg::onednn_calls(), before) << c.what;
    EXPECT_TRUE(same_bits(y, c.libtorch())) << c.what;
  }
  // Shape errors are libtorch's own.
  EXPECT_THROW(at::mm(at::randn({256, 384}), at::randn({385, 512})), c10::Error);
  EXPECT_THROW(at::addmm(at::randn({7}), big_a, big_b), c10::Error);
}

// libtorch's own oneDNN switches hold: oneDNN turned off, or float32 matmuls allowed to round down
// to bf16/tf32 there, keep every product on libtorch's kernel.
TEST_F(CpuGemm, LibtorchsOneDnnSwitchesAreHonoured) {
  cg::install(Path::onednn);
  at::Tensor a = at::randn({256, 384}), b = at::randn({384, 1536});
  auto& ctx = at::globalContext();
  const bool enabled = ctx.userEnabledMkldnn();
  ctx.setUserEnabledMkldnn(false);
  auto before = cg::onednn_calls();
  EXPECT_TRUE(same_bits(at::mm(a, b), at::cpu::mm(a, b)));
  EXPECT_EQ(cg::onednn_calls(), before);
  ctx.setUserEnabledMkldnn(enabled);
  const auto prec = ctx.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::BF16);
  before = cg::onednn_calls();
  EXPECT_TRUE(same_bits(at::mm(a, b), at::cpu::mm(a, b)));
  EXPECT_EQ(cg::onednn_calls(), before);
  ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, prec);
  before = cg::onednn_calls();
  at::mm(a, b);
  EXPECT_EQ(cg::onednn_calls(), before + 1);
}

TEST_F(CpuGemm, LibtorchPathGivesEveryProductBack) {
  at::Tensor a = at::randn({256, 384}), b = at::randn({384, 1536});
  cg::install(Path::onednn);
  const at::Tensor via_onednn = at::mm(a, b);
  ASSERT_EQ(cg::install(Path::libtorch), Path::libtorch);
  EXPECT_EQ(cg::installed(), Path::libtorch);
  const auto before = cg::onednn_calls();
  const at::Tensor y = at::mm(a, b);
  EXPECT_EQ(cg::onednn_calls(), before);
  EXPECT_TRUE(same_bits(y, at::cpu::mm(a, b)));
  // Both to float32 accuracy (their bits may differ: another summation order).
  EXPECT_LT(rel_err(via_onednn, y.to(at::kDouble)), 1e-5);
  // Installing twice, or onednn again after libtorch, is harmless.
  cg::install(Path::onednn);
  cg::install(Path::onednn);
  EXPECT_TRUE(same_bits(at::mm(a, b), via_onednn));
}

TEST_F(CpuGemm, LinearForwardAndBackwardAgreeAcrossPaths) {
  torch::nn::Linear lin(torch::nn::LinearOptions(384, 1536));
  at::Tensor x = at::randn({4, 64, 384});
  auto run = [&] {
    lin->zero_grad();
    at::Tensor xi = x.clone().requires_grad_(true);
    at::Tensor y = lin->forward(xi);
    (y * y).sum().backward();
    return std::vector<at::Tensor>{y.detach(), xi.grad(), lin->weight.grad().clone(), lin->bias.grad().clone()};
  };
  cg::install(Path::libtorch);
  const auto ref = run();
  cg::install(Path::onednn);
  const auto before = cg::onednn_calls();
  const auto got = run();
  // forward (addmm), input gradient and weight gradient (mm each)
  EXPECT_EQ(cg::onednn_calls(), before + 3);
  const char* names[] = {"output", "input grad", "weight grad", "bias grad"};
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_LT(rel_err(got[i], ref[i].to(at::kDouble)), 1e-5) << names[i];
}

TEST(CpuGemmEnv, ParsesAndRefuses) {
  auto with = [](const char* v) {
    ScopedEnv env("ACCEL_CPU_GEMM", v);
    return cg::from_env();
  };
  EXPECT_EQ(with("libtorch"), Path::libtorch);
  EXPECT_EQ(with("onednn"), cg::onednn_available() ? Path::onednn : Path::libtorch);
  ScopedEnv env("ACCEL_CPU_GEMM", "mkl");
  try {
    cg::from_env();
    ADD_FAILURE() << "ACCEL_CPU_GEMM=mkl accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ACCEL_CPU_GEMM=mkl"), std::string::npos) << e.what();
  }
}

// auto's rule, read independently from /proc/cpuinfo: oneDNN on a CPU with AVX-512F whose vendor is not Intel.
TEST(CpuGemmEnv, AutoFollowsTheCpu) {
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, vendor;
  bool avx512f = false;
  while (std::getline(in, line)) {
    if (vendor.empty() && line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) {
      std::istringstream fl(line.substr(line.find(':') + 1));
      for (std::string f; fl >> f;) avx512f = avx512f || f == "avx512f";
      break;
    }
  }
  const bool expect = cg::onednn_available() && avx512f && vendor != "GenuineIntel";
  EXPECT_EQ(cg::onednn_beneficial(), expect) << "vendor " << vendor << ", avx512f " << avx512f;
  ScopedEnv env("ACCEL_CPU_GEMM", std::nullopt);
  EXPECT_EQ(cg::from_env(), expect ? Path::onednn : Path::libtorch);
  const std::string said = cg::describe(cg::from_env());
  EXPECT_EQ(said.rfind(expect ? "onednn (ACCEL_CPU_GEMM=auto; " : "libtorch (ACCEL_CPU_GEMM=auto; ", 0), 0u) << said;
}

}  // namespace
