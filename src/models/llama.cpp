// The Llama layers (models/llama.h), written op for op after Transformers' modeling_llama.py
// (eager attention), so that fp32 logits agree to rounding.
#include "models/llama.h"
#include "mixed_precision/cross_entropy.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <string>

namespace accel::models {
namespace {

// A parameter of `shape` drawn from normal(0, std) (fp32, CPU generator) and cast to `options`;
// on the meta device: empty.
at::Tensor normal_parameter(at::IntArrayRef shape, double std, const at::TensorOptions& options) {
  if (options.device().is_meta()) return at::empty(shape, options);
  at::Tensor w = at::empty(shape, at::kFloat);
  w.normal_(0.0, std);
  return w.to(options);
}

// Transformers' rotate_half: (x1, x2) -> (-x2, x1) over the last dimension's halves.
at::Tensor rotate_half(const at::Tensor& x) {
  const std::int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, x.size(-1) - h), x.narrow(-1, 0, h)}, -1);
}

// [B, kv, S, d] -> [B, kv * n, S, d], each kv head repeated n times in place (repeat_kv).
at::Tensor repeat_kv(const at::Tensor& x, std::int64_t n) {
  if (n == 1) return x;
  const auto B = x.size(0), kv = x.size(1), S = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({B, kv, n, S, d}).reshape({B, kv * n, S, d});
}

}  // namespace

LlamaLinearImpl::LlamaLinearImpl(std::int64_t in, std::int64_t out, double init_std, const at::TensorOptions& options,
                                 bool with_bias) {
  weight = register_parameter("weight", normal_parameter({out, in}, init_std, options));
  if (with_bias)
    bias =
        register_parameter("bias", options.device().is_meta() ? at::empty({out}, options) : at::zeros({out}, options));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(std::int64_t num, std::int64_t dim, double init_std,
                                       std::optional<std::int64_t> padding, const at::TensorOptions& options) {
  at::Tensor w = normal_parameter({num, dim}, init_std, options);
  if (padding && *padding >= 0 && *padding < num) {
    padding_idx = *padding;
    if (!options.device().is_meta()) w[padding_idx].zero_();
  }
  weight = register_parameter("weight", w);
}

at::Tensor LlamaEmbeddingImpl::forward(const at::Tensor& tokens) { return at::embedding(weight, tokens, padding_idx); }

LlamaRMSNorm::LlamaRMSNorm(std::int64_t hidden_size, double eps, const at::TensorOptions& options) : eps(eps) {
  weight = register_parameter("weight", at::ones({hidden_size}, options));
}

at::Tensor LlamaRMSNorm::forward(const at::Tensor& x) {
  at::Tensor h = x.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

LlamaAttention::LlamaAttention(const LlamaConfig& c, const at::TensorOptions& options, std::int64_t layer)
    : heads(c.num_attention_heads),
      kv_heads(c.kv_heads()),
      head_dim(c.head_size()),
      window(c.window_of(layer)),
      impl(c.attn_implementation) {
  scaling = std::pow(static_cast<double>(head_dim), -0.5);
  const double s = c.initializer_range;
  q_proj = register_module("q_proj", LlamaLinear(c.hidden_size, heads * head_dim, s, options, c.qkv_bias));
  k_proj = register_module("k_proj", LlamaLinear(c.hidden_size, kv_heads * head_dim, s, options, c.qkv_bias));
  v_proj = register_module("v_proj", LlamaLinear(c.hidden_size, kv_heads * head_dim, s, options, c.qkv_bias));
  o_proj = register_module("o_proj", LlamaLinear(heads * head_dim, c.hidden_size, s, options, c.o_bias));
}

at::Tensor LlamaAttention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                   LayerKVCache* cache, const KeyPadding& padding) {
  const std::int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = q_proj(x).view({B, T, heads, head_dim}).transpose(1, 2);  // [B, H, T, d]
  at::Tensor k = k_proj(x).view({B, T, kv_heads, head_dim}).transpose(1, 2);
  at::Tensor v = v_proj(x).view({B, T, kv_heads, head_dim}).transpose(1, 2);
  q = q * cos + rotate_half(q) * sin;  // cos/sin [T, d] or [B, 1, T, d] broadcast over heads
  k = k * cos + rotate_half(k) * sin;
  if (cache) {
    if (cache->key.defined()) {
      TORCH_CHECK(cache->key.size(0) == B, "LlamaAttention: the KV cache holds batch ", cache->key.size(0),
                  ", the input has ", B);
      k = at::cat({cache->key, k}, 2);
      v = at::cat({cache->value, v}, 2);
    }
    cache->key = k;
    cache->value = v;
  }
  const std::int64_t S = k.size(2), past = S - T;
  const std::int64_t groups = heads / kv_heads;
  const bool masked = T > 1 || (window && S > *window) || padding.pad.defined();
  // Query i (position past + i) sees keys 0 .. past + i, and with a window only the last `window`
  // of them (keys past + i - window + 1 .. past + i, as Transformers' sliding_window_overlay).
  auto make_mask = [&] {
    at::Tensor mask = at::ones({T, S}, x.options().dtype(at::kBool)).triu(past + 1);
    if (window) mask = mask.logical_or(at::ones({T, S}, x.options().dtype(at::kBool)).tril(past - *window));
    if (padding.pad.defined()) {
      TORCH_CHECK(padding.pad.dim() == 2 && padding.pad.size(0) == B && padding.pad.size(1) == S,
                  "LlamaAttention: the attention mask must be [batch ", B, ", cached + new tokens ", S, "], got ",
                  padding.pad.sizes());
      mask = mask.logical_or(padding.pad.to(x.device()).view({B, 1, 1, S}));  // [B, 1, T, S]
    }
    return mask;
  };
  if (impl == "sdpa" || (impl == "auto" && x.is_cuda())) {
    // Plain causal attention uses the kernels' own mask; a cache, a window or padding an explicit one.
    const bool causal = masked && past == 0 && !window && !padding.pad.defined();
    std::optional<at::Tensor> keep;
    if (masked && !causal) {
      keep = make_mask().logical_not();
      *keep = keep->logical_or(keep->any(-1, /*keepdim=*/true).logical_not());  // all-padding rows: unmasked
    }
    const at::Tensor out =
        at::scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), keep, 0.0, causal, scaling);
    return o_proj(out.transpose(1, 2).contiguous().reshape({B, T, heads * head_dim}));
  }
  at::Tensor scores = at::matmul(q, repeat_kv(k, groups).transpose(2, 3)) * scaling;  // [B, H, T, S]
  if (masked) {
    const at::Tensor mask = make_mask();
    // The dtype's lowest, finite in the fp32 softmax (float64 too: its lowest would become -inf there,
    // and a query whose keys are all padding would give NaN, which its value then carries into the
    // next layer's real positions through 0 * NaN).
    const double lowest = scores.scalar_type() == at::kHalf ? -65504.0
                          : scores.scalar_type() == at::kBFloat16
                              ? -3.3895313892515355e38
                              : static_cast<double>(std::numeric_limits<float>::lowest());
    scores = scores.masked_fill(mask, lowest);
  }
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  at::Tensor out = at::matmul(probs, repeat_kv(v, groups)).transpose(1, 2).contiguous();  // [B, T, H, d]
  return o_proj(out.reshape({B, T, heads * head_dim}));
}

LlamaMLP::LlamaMLP(const LlamaConfig& c, const at::TensorOptions& options) {
  const double s = c.initializer_range;
  gate_proj = register_module("gate_proj", LlamaLinear(c.hidden_size, c.intermediate_size, s, options, c.mlp_bias));
  up_proj = register_module("up_proj", LlamaLinear(c.hidden_size, c.intermediate_size, s, options, c.mlp_bias));
  down_proj = register_module("down_proj", LlamaLinear(c.intermediate_size, c.hidden_size, s, options, c.mlp_bias));
}

at::Tensor LlamaMLP::forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, const at::TensorOptions& options, std::int64_t layer) {
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c, options, layer));
  mlp = register_module("mlp", std::make_shared<LlamaMLP>(c, options));
  input_layernorm =
      register_module("input_layernorm", std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps, options));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps, options));
}

at::Tensor LlamaDecoderLayer::forward(at::Tensor x, at::Tensor cos, at::Tensor sin, LayerKVCache* cache,
                                      KeyPadding padding) {
  x = x + self_attn->forward(input_layernorm->forward(x), cos, sin, cache, padding);
  return x + mlp->forward(post_attention_layernorm->forward(x));
}

LlamaModel::LlamaModel(const LlamaConfig& c, const at::TensorOptions& options) : config(c) {
  embed_tokens = register_module(
      "embed_tokens", LlamaEmbedding(c.vocab_size, c.hidden_size, c.initializer_range, c.pad_token_id, options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto layer = std::make_shared<LlamaDecoderLayer>(c, options, i);
    layers->push_back(layer);             // registered as layers.<i>
    units.push_back(accel::unit(layer));  // sharded now under sharded_init
  }
  norm = register_module("norm", std::make_shared<LlamaRMSNorm>(c.hidden_size, c.rms_norm_eps, options));
}

std::pair<at::Tensor, at::Tensor> LlamaModel::rotary(const at::Tensor& positions, at::ScalarType dtype) const {
  const std::int64_t dim = config.head_size();
  auto f32 = at::TensorOptions().dtype(at::kFloat).device(positions.device());
  // inv_freq = 1 / theta^(arange(0, dim, 2) / dim), as LlamaRotaryEmbedding computes it, then rescaled
  // as Transformers' ROPE_INIT_FUNCTIONS do for the rope_type (modeling_rope_utils.py).
  at::Tensor inv_freq = at::pow(config.rope_theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim)).reciprocal();
  const RopeScaling& r = config.rope_scaling;
  if (r.type == "linear") inv_freq = inv_freq / r.factor;
  if (r.type == "llama3") {
    // Wavelengths above original_max / low_freq_factor: divided by factor; below original_max /
    // high_freq_factor: kept; between: interpolated.
    const double old_len = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
    // (number / tensor written as Python evaluates it: the tensor's reciprocal times the number)
    at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
    at::Tensor smooth = (wavelen.reciprocal() * old_len - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
    at::Tensor medium = (wavelen < high_wavelen).logical_not().logical_and((wavelen > low_wavelen).logical_not());
    inv_freq = at::where(medium, smoothed, scaled);
  }
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [T, dim / 2] or [B, T, dim / 2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  if (emb.dim() == 3) emb = emb.unsqueeze(1);  // [B, 1, T, dim]: broadcast over the heads
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor LlamaModel::forward(const at::Tensor& tokens, KVCache* cache, const at::Tensor& attention_mask,
                               const at::Tensor& position_ids) {
  TORCH_CHECK(tokens.dim() == 2, "LlamaModel: tokens must be [batch, seq], got ", tokens.sizes());
  const std::int64_t B = tokens.size(0), T = tokens.size(1);
  const std::int64_t start = cache ? cache->position : 0;
  if (cache)
    TORCH_CHECK(static_cast<std::int64_t>(cache->layers.size()) == config.num_hidden_layers,
                "LlamaModel: the KV cache has ", cache->layers.size(), " layers, the model ", config.num_hidden_layers);
  at::Tensor x = embed_tokens(tokens);
  at::Tensor positions = at::arange(start, start + T, tokens.options().dtype(at::kLong));
  if (position_ids.defined()) {
    TORCH_CHECK(position_ids.dim() == 2 && position_ids.size(0) == B && position_ids.size(1) == T,
                "LlamaModel: position_ids must be [batch ", B, ", seq ", T, "], got ", position_ids.sizes());
    positions = position_ids.to(tokens.device(), at::kLong);
  }
  KeyPadding padding;
  if (attention_mask.defined()) {
    TORCH_CHECK(attention_mask.dim() == 2 && attention_mask.size(0) == B && attention_mask.size(1) == start + T,
                "LlamaModel: attention_mask must be [batch ", B, ", cached + new tokens ", start + T, "], got ",
                attention_mask.sizes());
    padding.pad = attention_mask.to(tokens.device()).eq(0);
  }
  auto [cos, sin] = rotary(positions, x.scalar_type());
  for (std::size_t i = 0; i < units.size(); ++i)
    x = units[i](x, cos, sin, cache ? &cache->layers[i] : nullptr, padding);
  if (cache) cache->position += T;
  return norm->forward(x);
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& c, const at::TensorOptions& options) : config(c) {
  config.validate();
  model = register_module("model", std::make_shared<LlamaModel>(config, options));
  if (!config.tie_word_embeddings)
    lm_head = register_module("lm_head",
                              LlamaLinear(config.hidden_size, config.vocab_size, config.initializer_range, options));
}

at::Tensor LlamaForCausalLM::head(const at::Tensor& hidden) {
  if (lm_head) return lm_head(hidden);
  return at::linear(hidden, model->embed_tokens->weight);
}

at::Tensor LlamaForCausalLM::forward(const at::Tensor& tokens, KVCache* cache, const at::Tensor& attention_mask,
                                     const at::Tensor& position_ids) {
  return head(model->forward(tokens, cache, attention_mask, position_ids));
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  // (fp32 math from the logits' own dtype, fp64 logits too: Transformers' logits.float())
  const at::Tensor l = logits.scalar_type() == at::kDouble ? logits.to(at::kFloat) : logits;
  return nn::cross_entropy(l, targets, /*ignore_index=*/-100);
}

}  // namespace accel::models
