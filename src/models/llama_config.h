// accel::models::LlamaConfig — the shape of a Llama model, read from and written as a Hugging Face
// Transformers `config.json` (model_type "llama").
//
// Read: the keys LlamaConfig writes (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta or
// rope_parameters.rope_theta, max_position_embeddings, tie_word_embeddings, initializer_range,
// bos/eos/pad_token_id). The sizes (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, max_position_embeddings) and rms_norm_eps are required; the others take
// Transformers' LlamaConfig defaults when absent (num_key_value_heads = num_attention_heads,
// head_dim = hidden_size / num_attention_heads, rope_theta 10000, tie_word_embeddings false).
// Variants this model does not implement are refused, never silently approximated: rope_scaling /
// a rope_type other than "default", hidden_act other than "silu", attention_bias / mlp_bias true,
// another model_type.
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

struct LlamaConfig {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  std::int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;  // std of the normal init (Linear and Embedding weights)
  std::optional<std::int64_t> bos_token_id, pad_token_id;
  std::vector<std::int64_t> eos_token_id;  // Llama 3 lists several
  std::string dtype = "float32";           // config.json's "dtype" (torch_dtype before Transformers 5)

  std::int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }

  // Throws LlamaConfigError (naming `source`) for non-positive sizes, heads not divisible by the kv
  // heads, hidden_size not divisible by the heads when head_dim is not given, an odd head size.
  void validate(const std::string& source = "LlamaConfig") const;

  // Parses config.json text; `source` names it in errors.
  static LlamaConfig from_json(const std::string& text, const std::string& source = "<text>");
  // A config.json file, or a directory holding one (a Transformers save_pretrained directory).
  static LlamaConfig from_file(const std::string& path_or_dir);

  // config.json as Transformers 5 writes it for LlamaForCausalLM (model_type, architectures, the
  // keys above, rope_parameters and, for older readers, rope_theta and torch_dtype).
  std::string to_json() const;
  // generation_config.json (bos/eos/pad token ids).
  std::string generation_config_json() const;
};

}  // namespace accel::models
