// accel::models::LlamaForCausalLM — the Llama family (Transformers' LlamaForCausalLM,
// Qwen2ForCausalLM and MistralForCausalLM; LlamaConfig's model_type says which) in libtorch C++:
// RMSNorm, rotary position embeddings (rotate_half convention, rope_theta, default / linear / llama3
// frequencies), SwiGLU MLP, grouped-query attention (num_key_value_heads <= num_attention_heads) with
// an optional sliding window per layer, biases where the model_type has them, tied or untied head.
//
// Parameter names are LlamaForCausalLM's state-dict names, so save_model / load_model exchange
// weights with Transformers directly (see models/pretrained.h):
//   model.embed_tokens.weight
//   model.layers.<i>.self_attn.{q,k,v,o}_proj.weight   (and .bias where the config has biases)
//   model.layers.<i>.mlp.{gate,up,down}_proj.weight
//   model.layers.<i>.{input,post_attention}_layernorm.weight
//   model.norm.weight
//   lm_head.weight                      (absent when tie_word_embeddings: the head is embed_tokens)
// No buffers: the rotary frequencies are computed in forward (Transformers' inv_freq is a
// non-persistent buffer, not in its state dict either).
//
// Each decoder layer is a sharding unit (accel::unit): under ZeRO-3 / FULL_SHARD one layer's
// parameters are gathered at a time; embed_tokens, norm and lm_head form the root unit (a tied head
// shares embed_tokens.weight inside the root unit, as examples/models/gpt.h does).
//
// The math is Transformers' eager attention path: scores q k^T * head_dim^-0.5, causal mask,
// softmax in fp32 then cast back to the query's dtype; RMSNorm in fp32. attn_implementation sdpa
// (auto on CUDA) computes the same attention in one at::scaled_dot_product_attention instead (a
// query whose keys are all padding then attends to every key, as Transformers' sdpa path unmasks it:
// its output is never read by a real token). Construction draws weights
// from libtorch's generator (normal(0, initializer_range) for Linear and Embedding weights, ones
// for the norms), deterministically given the seed, and marks each layer as a unit right after it
// is built (so Accelerator::sharded_init shards layers as they are made).
//
// Generation: forward(tokens, &cache) runs the new tokens at positions cache.position ..
// cache.position + T - 1 against the cached keys/values of the earlier ones, appends theirs to the
// cache and advances cache.position by T. The cache is for inference (under at::NoGradGuard); a
// checkpointed unit (activation checkpointing) must not be given one while grad mode is on.
#pragma once

#include "models/llama_config.h"
#include "sharding/unit.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace accel::models {

// One layer's cached keys and values, after the rotary embedding, before the GQA repeat:
// [B, num_key_value_heads, S, head_dim] each (undefined until the layer first runs).
struct LayerKVCache {
  at::Tensor key, value;
};

// Every layer's cache and the position of the next token. One per sequence batch being generated.
struct KVCache {
  KVCache() = default;
  explicit KVCache(std::int64_t num_layers) : layers(static_cast<std::size_t>(num_layers)) {}
  std::vector<LayerKVCache> layers;
  std::int64_t position = 0;  // tokens already cached
  void reset() {
    for (auto& l : layers) l = LayerKVCache{};
    position = 0;
  }
};

// The keys a batch row must not attend to besides the causal (and window) rule: `pad` [B, S] is true
// where the key is padding (Transformers' attention_mask == 0 over the cached and the new tokens).
// Undefined: no padding. (A struct, not a tensor argument, so that an activation-checkpointed unit
// passes it to its recompute as it is.)
struct KeyPadding {
  at::Tensor pad;
};

// Construction options: the parameters' device and dtype (TensorOptions; default CPU, fp32). On the
// meta device nothing is allocated and nothing initialized: names, shapes and units are all there
// for a loader to put real tensors in place (empty construction, as Accelerate's init_empty_weights).
// On a real device the weights are drawn in fp32 from the CPU generator, then cast and moved, so one
// seed gives the same model on every device and dtype.

// y = x W^T (+ b), W [out, in] (nn.Linear; the bias, where asked for, starts at zero as in
// Transformers), built with the given options.
class LlamaLinearImpl : public torch::nn::Module {
 public:
  LlamaLinearImpl(std::int64_t in, std::int64_t out, double init_std, const at::TensorOptions& options = {},
                  bool with_bias = false);
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight, bias); }
  at::Tensor weight, bias;  // bias undefined without one
};
TORCH_MODULE(LlamaLinear);

// nn.Embedding (padding_idx: its row starts at zero and gets no gradient), built with the given options.
class LlamaEmbeddingImpl : public torch::nn::Module {
 public:
  LlamaEmbeddingImpl(std::int64_t num, std::int64_t dim, double init_std, std::optional<std::int64_t> padding_idx,
                     const at::TensorOptions& options = {});
  at::Tensor forward(const at::Tensor& tokens);
  at::Tensor weight;
  std::int64_t padding_idx = -1;
};
TORCH_MODULE(LlamaEmbedding);

// Transformers' LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, cast back, times weight.
class LlamaRMSNorm : public torch::nn::Module {
 public:
  LlamaRMSNorm(std::int64_t hidden_size, double eps, const at::TensorOptions& options = {});
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};

// q/k/v/o projections, rotary embedding, grouped-query attention, layer `layer`'s sliding window.
class LlamaAttention : public torch::nn::Module {
 public:
  explicit LlamaAttention(const LlamaConfig& c, const at::TensorOptions& options = {}, std::int64_t layer = 0);
  // x [B, T, hidden]; cos/sin [T, head_dim], or [B, 1, T, head_dim] for positions per row (the
  // positions of x's tokens); cache: see KVCache; padding: see KeyPadding.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, LayerKVCache* cache,
                     const KeyPadding& padding = {});
  std::int64_t heads, kv_heads, head_dim;
  double scaling;
  std::optional<std::int64_t> window;  // a query sees its last `window` keys (nullopt: all earlier ones)
  std::string impl;                    // LlamaConfig::attn_implementation
  LlamaLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};

// down_proj(silu(gate_proj(x)) * up_proj(x)) (biases where config.mlp_bias).
class LlamaMLP : public torch::nn::Module {
 public:
  explicit LlamaMLP(const LlamaConfig& c, const at::TensorOptions& options = {});
  at::Tensor forward(const at::Tensor& x);
  LlamaLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};

// Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)). The sharding unit. `layer`: its index
// (which decides its attention window).
class LlamaDecoderLayer : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayer(const LlamaConfig& c, const at::TensorOptions& options = {}, std::int64_t layer = 0);
  at::Tensor forward(at::Tensor x, at::Tensor cos, at::Tensor sin, LayerKVCache* cache = nullptr,
                     KeyPadding padding = {});
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;
  std::shared_ptr<LlamaRMSNorm> input_layernorm, post_attention_layernorm;
};

// Transformers' LlamaModel: embeddings, layers, final norm (registered as `model`).
class LlamaModel : public torch::nn::Module {
 public:
  explicit LlamaModel(const LlamaConfig& c, const at::TensorOptions& options = {});
  // tokens [B, T] (int64) -> final hidden states [B, T, hidden]. attention_mask [B, S] (S: the cached
  // and the new tokens; 1 attend, 0 padding) and position_ids [B, T] as Transformers takes them: without
  // position_ids the positions are the cache's, start .. start + T - 1, padding or not.
  at::Tensor forward(const at::Tensor& tokens, KVCache* cache = nullptr, const at::Tensor& attention_mask = {},
                     const at::Tensor& position_ids = {});
  // cos, sin for `positions` (int64 [T], or [B, T] per row): [T, head_dim] or [B, 1, T, head_dim]
  // (Transformers' LlamaRotaryEmbedding with the config's rope_scaling, fp32, then cast to dtype).
  std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, at::ScalarType dtype) const;
  LlamaConfig config;
  LlamaEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};  // children "0", "1", ... (LlamaDecoderLayer)
  std::shared_ptr<LlamaRMSNorm> norm;
  std::vector<accel::Unit<LlamaDecoderLayer>> units;  // call sites of layers[i]
};

class LlamaForCausalLM : public torch::nn::Module {
 public:
  // Validates the config (LlamaConfigError) and builds the model with fresh weights (see the
  // construction options above: a meta device builds it empty).
  explicit LlamaForCausalLM(const LlamaConfig& c, const at::TensorOptions& options = {});
  // tokens [B, T] (int64) -> logits [B, T, vocab_size] in the parameters' dtype.
  // With a cache: see KVCache (positions continue from cache->position, which advances by T).
  // attention_mask, position_ids: see LlamaModel::forward (padded batches, left or right).
  at::Tensor forward(const at::Tensor& tokens, KVCache* cache = nullptr, const at::Tensor& attention_mask = {},
                     const at::Tensor& position_ids = {});
  // A cache sized for this model.
  KVCache make_cache() const { return KVCache(config.num_hidden_layers); }
  // The head: hidden [.., hidden] -> logits [.., vocab] (lm_head, or embed_tokens when tied).
  at::Tensor head(const at::Tensor& hidden);
  LlamaConfig config;
  std::shared_ptr<LlamaModel> model;
  LlamaLinear lm_head{nullptr};  // null when config.tie_word_embeddings
};

// Mean next-token cross entropy over logits [B, T, V] and targets [B, T] (fp32 math); targets of
// -100 (padding, a prompt) are left out of the loss and of the mean, as in Transformers.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace accel::models
