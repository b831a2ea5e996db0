// accel::nn::cross_entropy on the CPU (its composite path; the fused CUDA kernels are checked against it
// in tests/cuda/test_cross_entropy_CUDA.cpp): fp32 math from low-precision logits, fp64 kept, the mean
// over the targets that are not ignore_index (closed forms), and errors for bad input.
#include "base/error.h"
#include "mixed_precision/cross_entropy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace accel::nn {
namespace {

TEST(CrossEntropy, UniformLogitsGiveLogVocabOverTheTargetsNotIgnored) {
  // Equal logits: every log-probability is -log V, so the mean is log V whichever targets count.
  const std::int64_t V = 7;
  const at::Tensor logits = at::full({2, 3, V}, 0.25);
  const at::Tensor targets = at::tensor({1, -100, 2, 6, -100, 0}, at::kLong).reshape({2, 3});
  const at::Tensor loss = cross_entropy(logits, targets);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_NEAR(loss.item<double>(), std::log(7.0), 1e-6);
  // The target's logit 3 above the others in one row, 3 below them in the next, the third ignored:
  // -log(e^3 / (e^3 + V - 1)) and -log(1 / (1 + (V - 1) e^3)), averaged over the 2 that count.
  at::Tensor two = at::zeros({3, V});
  two[0][4] = 3.0;
  two[1].fill_(3.0);
  two[1][5] = 0.0;
  const double e3 = std::exp(3.0);
  const double want = (-std::log(e3 / (e3 + V - 1)) - std::log(1.0 / (1.0 + (V - 1) * e3))) / 2;
  EXPECT_NEAR(cross_entropy(two, at::tensor({4, 5, -100}, at::kLong)).item<double>(), want, 1e-6);
  // Its gradient: (softmax - onehot) / count on the rows that count, zero on the ignored one.
  const at::Tensor x = two.clone().requires_grad_(true);
  cross_entropy(x, at::tensor({4, 5, -100}, at::kLong)).backward();
  const at::Tensor p = at::softmax(two.to(at::kDouble), -1);
  at::Tensor want_grad = p.clone();
  want_grad[0][4] -= 1.0;
  want_grad[1][5] -= 1.0;
  want_grad[2].zero_();
  want_grad /= 2.0;
  EXPECT_TRUE(at::allclose(x.grad().to(at::kDouble), want_grad, 0, 1e-7)) << x.grad();
}

TEST(CrossEntropy, LowPrecisionLogitsAreComputedInFp32AndFp64StaysFp64) {
  at::manual_seed(3);
  const at::Tensor logits = (at::randn({16, 300}) * 4).to(at::kBFloat16);
  const at::Tensor targets = at::randint(300, {16});
  // The fp32 computation over the same (bf16) values, and the bf16 one it replaces, are not the same.
  const at::Tensor fp32 = at::nll_loss(at::log_softmax(logits.to(at::kFloat), -1), targets);
  const at::Tensor bf16 = at::nll_loss(at::log_softmax(logits, -1), targets);
  ASSERT_NE(fp32.item<float>(), bf16.to(at::kFloat).item<float>());
  const at::Tensor got = cross_entropy(logits, targets);
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_EQ(got.item<float>(), fp32.item<float>());
  // Its gradient arrives in the logits' dtype.
  const at::Tensor x = logits.clone().requires_grad_(true);
  cross_entropy(x, targets).backward();
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  // fp64 logits: the loss in fp64 (the GPT example's --float64 runs).
  const at::Tensor d = logits.to(at::kDouble);
  EXPECT_EQ(cross_entropy(d, targets).scalar_type(), at::kDouble);
  EXPECT_EQ(cross_entropy(d, targets).item<double>(), at::nll_loss(at::log_softmax(d, -1), targets).item<double>());
  // On the CPU the fused kernels are not used, and the composite is the same path.
  EXPECT_FALSE(fused_cross_entropy(logits));
  EXPECT_EQ(cross_entropy_composite(logits, targets).item<float>(), got.item<float>());
}

TEST(CrossEntropy, BadInputIsAnErrorThatSaysWhat) {
  const at::Tensor logits = at::zeros({4, 5});
  auto message = [&](const at::Tensor& l, const at::Tensor& t) -> std::string {
    try {
      (void)cross_entropy(l, t);
    } catch (const accel::InvalidArgumentError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message(logits, at::zeros({3}, at::kLong)).find("3 targets for 4 rows"), std::string::npos);
  EXPECT_NE(message(logits, at::zeros({4})).find("integer targets"), std::string::npos);
  EXPECT_NE(message(at::zeros({4, 5}, at::kLong), at::zeros({4}, at::kLong)).find("floating logits"),
            std::string::npos);
  EXPECT_NE(message(at::zeros({4, 0}), at::zeros({4}, at::kLong)).find("vocab"), std::string::npos);
}

}  // namespace
}  // namespace accel::nn
