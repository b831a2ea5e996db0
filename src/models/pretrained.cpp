// save_pretrained / load_pretrained (models/pretrained.h): save_model / load_model plus the
// Transformers config files.
#include "models/pretrained.h"
#include "base/error.h"

#include "base/files.h"
#include "checkpoint/safetensors.h"
#include "zero/engine.h"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

namespace accel::models {
namespace {

// Every rank says whether it failed; true if any did (collective over the engine's world).
bool any_failed(zero::Engine& engine, bool failed) {
  at::Tensor flag = at::full({1}, failed ? 1 : 0, at::kInt);
  engine.world().all_reduce(flag, {comm::ReduceOp::Max});
  return flag.item<int>() != 0;
}

// Transformers' dtype name of a saved tensor's dtype.
std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    default: return "float32";
  }
}

}  // namespace

void check_same_architecture(const LlamaConfig& expected, const LlamaConfig& found, const std::string& source) {
  auto same_int = [&](const char* key, std::int64_t a, std::int64_t b) {
    if (a != b)
      throw LlamaConfigError("Llama config " + source + ": " + key + " is " + std::to_string(b) + ", the model has " +
                             std::to_string(a));
  };
  auto same_real = [&](const char* key, double a, double b) {
    if (std::abs(a - b) > 1e-12 * std::max(std::abs(a), std::abs(b))) {
      std::ostringstream os;
      os << "Llama config " << source << ": " << key << " is " << b << ", the model has " << a;
      throw LlamaConfigError(os.str());
    }
  };
  same_int("vocab_size", expected.vocab_size, found.vocab_size);
  same_int("hidden_size", expected.hidden_size, found.hidden_size);
  same_int("intermediate_size", expected.intermediate_size, found.intermediate_size);
  same_int("num_hidden_layers", expected.num_hidden_layers, found.num_hidden_layers);
  same_int("num_attention_heads", expected.num_attention_heads, found.num_attention_heads);
  same_int("num_key_value_heads", expected.kv_heads(), found.kv_heads());
  same_int("head_dim", expected.head_size(), found.head_size());
  same_int("tie_word_embeddings", expected.tie_word_embeddings, found.tie_word_embeddings);
  same_real("rms_norm_eps", expected.rms_norm_eps, found.rms_norm_eps);
  same_real("rope_theta", expected.rope_theta, found.rope_theta);
  auto same_text = [&](const char* key, const std::string& a, const std::string& b) {
    if (a != b) throw LlamaConfigError("Llama config " + source + ": " + key + " is " + b + ", the model has " + a);
  };
  same_text("model_type", expected.model_type, found.model_type);
  same_int("attention biases (q/k/v)", expected.qkv_bias, found.qkv_bias);
  same_int("attention bias (o)", expected.o_bias, found.o_bias);
  same_int("mlp_bias", expected.mlp_bias, found.mlp_bias);
  same_text("rope_type", expected.rope_scaling.type, found.rope_scaling.type);
  same_real("rope factor", expected.rope_scaling.factor, found.rope_scaling.factor);
  same_real("rope low_freq_factor", expected.rope_scaling.low_freq_factor, found.rope_scaling.low_freq_factor);
  same_real("rope high_freq_factor", expected.rope_scaling.high_freq_factor, found.rope_scaling.high_freq_factor);
  same_int("rope original_max_position_embeddings", expected.rope_scaling.original_max_position_embeddings,
           found.rope_scaling.original_max_position_embeddings);
  for (std::int64_t i = 0; i < expected.num_hidden_layers; ++i)
    if (expected.window_of(i) != found.window_of(i))
      throw LlamaConfigError("Llama config " + source + ": layer " + std::to_string(i) + "'s sliding window is " +
                             (found.window_of(i) ? std::to_string(*found.window_of(i)) : "none") + ", the model's " +
                             (expected.window_of(i) ? std::to_string(*expected.window_of(i)) : "none"));
}

checkpoint::SaveModelResult save_pretrained(zero::Engine& engine, LlamaForCausalLM& model, const std::string& dir,
                                            std::int64_t max_shard_size, const checkpoint::SaveModelOptions& options) {
  auto result = checkpoint::save_model(engine, model, dir, max_shard_size, options);
  std::string error;
  if (engine.world().rank() == 0) {
    try {
      LlamaConfig c = model.config;
      // The dtype the weights were written in (the fp32 masters, or the compute dtype).
      auto first = checkpoint::SafetensorsFile::open(dir + "/" + result.files.at(0));
      auto names = first.names();
      if (!names.empty()) c.dtype = dtype_name(first.dtype(names.front()));
      const std::string cfg = c.to_json(), gen = c.generation_config_json();
      files::write_file_atomic(dir + "/config.json", cfg.data(), cfg.size());
      files::write_file_atomic(dir + "/generation_config.json", gen.data(), gen.size());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (any_failed(engine, !error.empty()))
    throw accel::RuntimeError(!error.empty() ? "save_pretrained(" + dir + "): " + error
                                             : "save_pretrained(" + dir + "): rank 0 could not write the config files");
  return result;
}

checkpoint::LoadModelResult load_pretrained(zero::Engine& engine, LlamaForCausalLM& model, const std::string& dir) {
  // Every rank reads the config (a small file) and fails the same way: no agreement needed.
  const LlamaConfig found = LlamaConfig::from_file(dir);
  check_same_architecture(model.config, found, dir + "/config.json");
  return checkpoint::load_model(engine, model, dir);
}

}  // namespace accel::models
