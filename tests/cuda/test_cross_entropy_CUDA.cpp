// The fused cross entropy on CUDA (kernels/cross_entropy.cu through accel::nn::cross_entropy) against
// ATen's composite path on the same device (the logits in fp32, log_softmax, nll_loss) and an fp64
// reference on the host: the loss and the gradient at least as accurate as the composite's (within a
// factor of 2 of its error, since only the order of each row's sum differs), for fp32, fp16 and bf16
// logits, vocabularies whose rows all start on a 16-byte boundary and not (50257, an odd one, one of 1,
// logits one element into their buffer), ignored targets; the same
// bits from run to run; ignored rows' gradients exactly zero; every target ignored a nan loss as nll_loss
// gives; a target outside the vocabulary a nan loss (the documented difference: the kernels do not read
// the targets on the host); no double backward, and targets changed before backward an error. Without a
// device (or in a build without the kernels) every case skips.
#include "comm/cuda_comm.h"
#include "mixed_precision/cross_entropy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace accel::nn {
namespace {

#define SKIP_WITHOUT_FUSED_LOSS()                                                                                 \
  do {                                                                                                            \
    if (comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";                                         \
    if (!fused_cross_entropy(at::ones({1}, at::TensorOptions().device(at::kCUDA)))) GTEST_SKIP() << "no kernels"; \
  } while (0)

struct LossAndGrad {
  at::Tensor loss, grad;  // (on the host, fp64)
};

// offset > 0: the logits that many elements into a buffer of their own (still contiguous).
template <typename Fn>
LossAndGrad run(const at::Tensor& logits, const at::Tensor& targets, Fn&& loss_fn, std::int64_t offset = 0) {
  at::Tensor x = logits.detach().clone();
  if (offset > 0) {
    x = at::empty({logits.numel() + offset}, logits.options()).narrow(0, offset, logits.numel()).view(logits.sizes());
    x.copy_(logits);
  }
  x.requires_grad_(true);
  const at::Tensor loss = loss_fn(x, targets);
  loss.backward();
  return {loss.detach().cpu().to(at::kDouble), x.grad().cpu().to(at::kDouble)};
}

// One ulp of fp32 at |v|.
double ulp32(double v) {
  const float f = std::fabs(static_cast<float>(v));
  return std::nextafter(f, std::numeric_limits<float>::infinity()) - f;
}

TEST(CrossEntropy_CUDA, AsAccurateAsTheCompositeForEveryDtypeAndVocab) {
  SKIP_WITHOUT_FUSED_LOSS();
  int cases = 0;
  // (vocab, offset): the logits `offset` elements into their buffer, so that no row starts on a 16-byte
  // boundary (and the gradient, which autograd allocates aligned, lies elsewhere than the logits).
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{32000, 0}, {50257, 0}, {1000, 0},
                                                                     {1000, 1},  {999, 0},   {1, 0}};
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
    for (const auto& [vocab, offset] : shapes) {
      const std::string what =
          std::string(c10::toString(dtype)) + " vocab " + std::to_string(vocab) + " offset " + std::to_string(offset);
      at::manual_seed(static_cast<std::uint64_t>(vocab) + 7);
      const std::int64_t rows = 37;
      const auto on = at::TensorOptions().device(at::kCUDA);
      const at::Tensor logits = (at::randn({rows, vocab}) * 3).to(on.dtype(dtype));
      at::Tensor targets = at::randint(vocab, {rows}, at::kLong);
      targets[5] = -100;
      targets[20] = -100;
      targets = targets.to(on);
      // The fp64 reference from the same (rounded) logits.
      const LossAndGrad ref =
          run(logits.cpu().to(at::kDouble), targets.cpu(), [](const at::Tensor& x, const at::Tensor& t) {
            return at::nll_loss(at::log_softmax(x, -1), t, {}, at::Reduction::Mean, -100);
          });
      const LossAndGrad fused = run(
          logits, targets, [](const at::Tensor& x, const at::Tensor& t) { return cross_entropy(x, t); }, offset);
      const LossAndGrad composite =
          run(logits, targets, [](const at::Tensor& x, const at::Tensor& t) { return cross_entropy_composite(x, t); });
      const double r = ref.loss.item<double>();
      const double loss_err_f = std::fabs(fused.loss.item<double>() - r);
      const double loss_err_c = std::fabs(composite.loss.item<double>() - r);
      EXPECT_LE(loss_err_f, 2 * loss_err_c + 2 * ulp32(r))
          << what << ": loss " << fused.loss.item<double>() << ", composite " << composite.loss.item<double>()
          << ", fp64 " << r;
      const double grad_err_f = (fused.grad - ref.grad).abs().max().item<double>();
      const double grad_err_c = (composite.grad - ref.grad).abs().max().item<double>();
      EXPECT_LE(grad_err_f, 2 * grad_err_c + 1e-12)
          << what << ": the gradient's largest error " << grad_err_f << ", composite's " << grad_err_c;
      // Ignored rows: exactly zero.
      EXPECT_EQ(fused.grad[5].abs().max().item<double>(), 0.0) << what;
      EXPECT_EQ(fused.grad[20].abs().max().item<double>(), 0.0) << what;
      ++cases;
    }
  EXPECT_EQ(cases, 18);
}

TEST(CrossEntropy_CUDA, TheSameBitsEveryRunAndForAStridedCopy) {
  SKIP_WITHOUT_FUSED_LOSS();
  at::manual_seed(11);
  const auto on = at::TensorOptions().device(at::kCUDA);
  const at::Tensor logits = (at::randn({64, 4096}) * 2).to(on.dtype(at::kBFloat16));
  const at::Tensor targets = at::randint(4096, {64}, at::kLong).to(on);
  auto once = [&](const at::Tensor& l) {
    const at::Tensor x = l.detach().clone().requires_grad_(true);
    const at::Tensor loss = cross_entropy(x, targets);
    loss.backward();
    return std::make_pair(loss.detach(), x.grad());
  };
  const auto a = once(logits), b = once(logits);
  EXPECT_TRUE(at::equal(a.first, b.first));
  EXPECT_TRUE(at::equal(a.second.view(at::kShort), b.second.view(at::kShort)));
  // The logits as a transposed view (not contiguous): the same loss.
  const at::Tensor strided = logits.t().contiguous().t();
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_TRUE(at::equal(cross_entropy(strided, targets), a.first));
  // [B, T, V] logits with [B, T] targets: the rows in order.
  EXPECT_TRUE(at::equal(cross_entropy(logits.reshape({8, 8, 4096}), targets.reshape({8, 8})), a.first));
}

TEST(CrossEntropy_CUDA, EveryTargetIgnoredOrOutOfRangeIsANan) {
  SKIP_WITHOUT_FUSED_LOSS();
  const auto on = at::TensorOptions().device(at::kCUDA);
  const at::Tensor logits = at::randn({4, 64}, on);
  const at::Tensor ignored = at::full({4}, -100, on.dtype(at::kLong));
  EXPECT_TRUE(std::isnan(cross_entropy(logits, ignored).item<float>()));
  EXPECT_TRUE(std::isnan(cross_entropy_composite(logits, ignored).item<float>()));  // (nll_loss's 0 / 0)
  const at::Tensor out_of_range = at::tensor({1, 64, 2, 3}, at::kLong).to(on);
  EXPECT_TRUE(std::isnan(cross_entropy(logits, out_of_range).item<float>()));
}

TEST(CrossEntropy_CUDA, ADoubleBackwardIsRefusedAndTargetsChangedBeforeBackwardAreAnError) {
  SKIP_WITHOUT_FUSED_LOSS();
  const auto on = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({4, 64}, on).requires_grad_(true);
  at::Tensor targets = at::tensor({1, 2, 3, 4}, at::kLong).to(on);
  const at::Tensor loss = cross_entropy(x, targets);
  // (create_graph: the fused backward has no graph of its own)
  EXPECT_THROW(torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true), std::exception);
  // A first-order gradient still works, and the next batch's targets written into the same buffer
  // before backward are an error, not a gradient of the wrong targets.
  EXPECT_NO_THROW(torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true));
  targets.fill_(5);
  EXPECT_THROW(loss.backward(), std::exception);
}

}  // namespace
}  // namespace accel::nn
