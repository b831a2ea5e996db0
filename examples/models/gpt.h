// The GPT the examples train (and the sharding tests and step_bench use): pre-norm blocks, each
// marked as a sharding unit, and an output head tied to the token embedding (a parameter shared
// inside the root unit). Construction is deterministic given libtorch's seed.
// GPTConfig::fp8 picks the blocks' four linear layers at construction: torch::nn::Linear (false, the
// default) or accel::nn::Float8Linear (true: fp8 matmuls, same parameter names, shapes and init).
// The embedding/head and the LayerNorms stay in the parameters' dtype either way.
// GPTConfig::attention: how a block computes attention. Eager writes it out (matmul, masked_fill,
// softmax: the math torch_anchor.py's PyTorch GPT computes, op for op); Sdpa is one fused
// at::scaled_dot_product_attention (FlashAttention's kernels on a GPU, a flash kernel on the CPU);
// Auto (the default) is Sdpa on CUDA and Eager on the CPU. The two agree to rounding.
// GPTConfig::dropout > 0: dropout on each block's two residual branches while training (draws from
// libtorch's generator, which checkpoints save and restore per rank); 0 (the default) draws nothing.
#pragma once

#include "mixed_precision/cross_entropy.h"
#include "mixed_precision/float8_linear.h"
#include "sharding/unit.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::examples {

enum class Attention { Auto, Eager, Sdpa };

// "auto" | "eager" | "sdpa" (throws std::invalid_argument otherwise).
inline Attention attention_from_string(const std::string& s) {
  if (s == "auto") return Attention::Auto;
  if (s == "eager") return Attention::Eager;
  if (s == "sdpa") return Attention::Sdpa;
  throw std::invalid_argument("attention must be auto, eager or sdpa, got '" + s + "'");
}

struct BlockImpl : torch::nn::Module {
  // fp8: the four linear layers are Float8Linear (accel::nn::make_linear); false builds exactly the
  // torch::nn::Linear block (same registration order, names and RNG draws).
  BlockImpl(int64_t d, int64_t heads, bool fp8 = false, double dropout = 0, Attention attention = Attention::Auto)
      : heads(heads), dropout(dropout), attention(attention), fp8(fp8) {
    using accel::nn::make_linear;
    using torch::nn::LinearOptions;
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    // No qkv bias: the key bias would get an analytically zero gradient (softmax ignores a per-row
    // constant), i.e. pure rounding noise, which Adam's normalisation amplifies into lr-sized steps.
    qkv = make_linear(LinearOptions(d, 3 * d).bias(false), fp8);
    register_module("qkv", qkv.ptr());
    proj = make_linear(LinearOptions(d, d), fp8);
    register_module("proj", proj.ptr());
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = make_linear(LinearOptions(d, 4 * d), fp8);
    register_module("fc1", fc1.ptr());
    fc2 = make_linear(LinearOptions(4 * d, d), fp8);
    register_module("fc2", fc2.ptr());
  }
  at::Tensor forward(at::Tensor x) {  // x: [B, T, d]
    const int64_t B = x.size(0), T = x.size(1), d = x.size(2), hd = d / heads;
    // q, k and v [B, H, T, hd]: views of qkv's output [B, T, 3d], split along its last dim. split's
    // backward is one cat of the three gradients into [B, T, 3d]. On CUDA the attention kernels hand
    // them back in [B, T, H, hd] layout, so the cat is the only copy; unbind of the [3, B, H, T, hd]
    // permutation (the same views) stacked them into that layout and then copied them back into qkv's
    // (a second copy, 3 B T d elements read and written a block). Three selects would each zero a buffer,
    // copy into it and add. The values are the same every way.
    const std::vector<at::Tensor> qkv3 = qkv.forward(ln1(x)).split(d, -1);
    auto by_head = [&](const at::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };
    const at::Tensor q = by_head(qkv3[0]), k = by_head(qkv3[1]), v = by_head(qkv3[2]);
    at::Tensor y;
    if (attention == Attention::Sdpa || (attention == Attention::Auto && x.is_cuda())) {
      y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    } else {
      at::Tensor att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
      at::Tensor mask = at::ones({T, T}, x.options().dtype(at::kBool)).triu(1);
      // -1e9 overflows fp16: there the largest negative fp16 (either is exactly 0 after softmax).
      const double masked = att.scalar_type() == at::kHalf ? -65504.0 : -1e9;
      y = at::matmul(at::softmax(att.masked_fill(mask, masked), -1), v);
    }
    y = y.transpose(1, 2).reshape({B, T, d});
    x = x + drop(proj.forward(y));
    const at::Tensor h = fc1.forward(ln2(x));
    // fp8: the GELU goes into fc2's casts (Float8Linear::forward_gelu: the same values and gradients,
    // the GELU's output never written on CUDA).
    return x + drop(fp8 ? fc2.get<accel::nn::Float8LinearImpl>().forward_gelu(h) : fc2.forward(at::gelu(h)));
  }
  at::Tensor drop(const at::Tensor& t) { return dropout > 0 ? at::dropout(t, dropout, is_training()) : t; }
  int64_t heads;
  double dropout;
  Attention attention;
  bool fp8;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  // torch::nn::Linear or accel::nn::Float8Linear (a typed member could hold only one of them).
  torch::nn::AnyModule qkv, proj, fc1, fc2;
};

struct GPTConfig {
  int64_t vocab = 11, d = 8, heads = 2, layers = 2, seq = 5;
  // The blocks' linear layers in fp8 (Float8Linear). Last, so GPTConfig{vocab, d, heads, layers, seq}
  // still means what it did.
  bool fp8 = false;
  double dropout = 0;  // the blocks' residual dropout (last, for the same reason)
  Attention attention = Attention::Auto;
};

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(GPTConfig c) : cfg(c) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab, c.d));
    pos = register_parameter("pos", at::randn({c.seq, c.d}) * 0.1);
    for (int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(accel::unit(register_module(
          "h" + std::to_string(i), std::make_shared<BlockImpl>(c.d, c.heads, c.fp8, c.dropout, c.attention))));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d})));
  }
  // tokens [B, T] -> logits [B, T, vocab]; the head is the token embedding (tied).
  at::Tensor forward(at::Tensor tokens) {
    at::Tensor x = tok(tokens) + pos.narrow(0, 0, tokens.size(1));
    for (auto& b : blocks) x = b(x);
    return at::matmul(ln_f(x), tok->weight.t());
  }
  GPTConfig cfg;
  torch::nn::Embedding tok{nullptr};
  at::Tensor pos;
  std::vector<accel::Unit<BlockImpl>> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};

// Mean next-token cross entropy, in fp32 from logits of any dtype (fp64 logits: fp64): accel's fused
// kernels on CUDA, log_softmax and nll_loss elsewhere (mixed_precision/cross_entropy.h).
inline at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return accel::nn::cross_entropy(logits, targets);
}

}  // namespace accel::examples
