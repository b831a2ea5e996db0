// accel::models::LlamaConfig — the shape of a model of the Llama family, read from and written as a
// Hugging Face Transformers `config.json`: model_type "llama" (Llama 2 and 3.x), "qwen2" (Qwen2 and
// Qwen2.5) and "mistral". One decoder serves the three (models/llama.h); what differs is a switch here:
//   - biases: Qwen2 has them on q/k/v (not o); Llama's attention_bias puts them on q/k/v/o and its
//     mlp_bias on gate/up/down; Mistral has none;
//   - the rotary embedding's frequencies (rope_scaling): "default", "linear" (positions / factor) or
//     "llama3" (Llama 3.1's rescaling of the low frequencies), from rope_parameters (Transformers 5) or
//     rope_scaling (Transformers 4);
//   - a sliding attention window: Mistral's sliding_window on every layer (null: none), Qwen2's on the
//     layers that layer_types (or use_sliding_window and max_window_layers) name.
//
// Read: the sizes (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// max_position_embeddings) and rms_norm_eps are required; the others take Transformers' defaults for
// the model_type when absent (num_key_value_heads = num_attention_heads, head_dim = hidden_size /
// num_attention_heads, rope_theta 10000, tie_word_embeddings false, Mistral's sliding_window 4096).
// Variants this model does not implement are refused by name, never silently approximated: another
// model_type, a rope_type other than those three, hidden_act other than "silu", a sliding layer
// without a window.
//
// Errors: LlamaConfigError naming the file (or "<text>") and the key.
#pragma once

#include "base/error.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::models {

class LlamaConfigError : public accel::RuntimeError {
 public:
  using accel::RuntimeError::RuntimeError;
};

// The rotary embedding's frequencies (Transformers' rope_type and its parameters).
struct RopeScaling {
  std::string type = "default";                          // "default" | "linear" | "llama3"
  double factor = 1.0;                                   // linear, llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  std::int64_t original_max_position_embeddings = 0;     // llama3
};

struct LlamaConfig {
  std::string model_type = "llama";  // "llama" | "qwen2" | "mistral"
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  std::int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  // q/k/v projections with biases (Qwen2; Llama's attention_bias)
  bool o_bias = false;    // o_proj with a bias (Llama's attention_bias)
  bool mlp_bias = false;  // gate/up/down with biases (Llama's mlp_bias)
  // The sliding attention window (a query sees its last sliding_window keys) and the layers it applies
  // to (empty: none; Mistral: all).
  std::optional<std::int64_t> sliding_window;
  std::vector<bool> sliding_layers;
  std::int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;  // std of the normal init (Linear and Embedding weights)
  std::optional<std::int64_t> bos_token_id, pad_token_id;
  std::vector<std::int64_t> eos_token_id;  // Llama 3 lists several
  std::string dtype = "float32";           // config.json's "dtype" (torch_dtype before Transformers 5)
  // How attention is computed (Transformers' attn_implementation; a runtime choice, not in
  // config.json): "eager" writes it out as Transformers' eager path does (bitwise parity with it),
  // "sdpa" is one fused at::scaled_dot_product_attention (FlashAttention's kernels on a GPU), "auto"
  // is sdpa on CUDA and eager on the CPU.
  std::string attn_implementation = "auto";

  std::int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  // The window of layer `i`'s attention, or nullopt (full causal attention).
  std::optional<std::int64_t> window_of(std::int64_t i) const {
    const auto u = static_cast<std::size_t>(i);
    return u < sliding_layers.size() && sliding_layers[u] ? sliding_window : std::nullopt;
  }

  // Throws LlamaConfigError (naming `source`) for non-positive sizes, heads not divisible by the kv
  // heads, hidden_size not divisible by the heads when head_dim is not given, an odd head size, biases,
  // windows or rope parameters the model_type does not have.
  void validate(const std::string& source = "LlamaConfig") const;

  // Parses config.json text; `source` names it in errors.
  static LlamaConfig from_json(const std::string& text, const std::string& source = "<text>");
  // A config.json file, or a directory holding one (a Transformers save_pretrained directory).
  static LlamaConfig from_file(const std::string& path_or_dir);

  // config.json as Transformers 5 writes it for the model_type's *ForCausalLM (model_type,
  // architectures, the keys above, rope_parameters and, for older readers, rope_theta, rope_scaling
  // and torch_dtype).
  std::string to_json() const;
  // generation_config.json (bos/eos/pad token ids).
  std::string generation_config_json() const;
};

}  // namespace accel::models
