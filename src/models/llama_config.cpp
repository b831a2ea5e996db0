// LlamaConfig from and to Transformers' config.json (models/llama_config.h).
#include "models/llama_config.h"

#include "base/files.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace accel::models {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw LlamaConfigError("Llama config " + source + ": " + what);
}

const json* find(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::int64_t get_int(const json& j, const char* key, const std::string& source, std::optional<std::int64_t> dflt) {
  const json* v = find(j, key);
  if (!v) {
    if (dflt) return *dflt;
    fail(source, std::string("missing required key '") + key + "'");
  }
  if (!v->is_number_integer()) fail(source, std::string("key '") + key + "' must be an integer, got " + v->dump());
  return v->get<std::int64_t>();
}

double get_double(const json& j, const char* key, const std::string& source, std::optional<double> dflt) {
  const json* v = find(j, key);
  if (!v) {
    if (dflt) return *dflt;
    fail(source, std::string("missing required key '") + key + "'");
  }
  if (!v->is_number()) fail(source, std::string("key '") + key + "' must be a number, got " + v->dump());
  return v->get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& source, bool dflt) {
  const json* v = find(j, key);
  if (!v) return dflt;
  if (!v->is_boolean()) fail(source, std::string("key '") + key + "' must be true or false, got " + v->dump());
  return v->get<bool>();
}

std::optional<std::int64_t> get_token(const json& j, const char* key, const std::string& source) {
  const json* v = find(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    fail(source, std::string("key '") + key + "' must be an integer or null, got " + v->dump());
  return v->get<std::int64_t>();
}

}  // namespace

void LlamaConfig::validate(const std::string& source) const {
  auto positive = [&](std::int64_t v, const char* key) {
    if (v <= 0) fail(source, std::string("'") + key + "' must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(max_position_embeddings, "max_position_embeddings");
  if (num_key_value_heads < 0) fail(source, "'num_key_value_heads' must be positive");
  if (num_attention_heads % kv_heads() != 0)
    fail(source, "num_attention_heads " + std::to_string(num_attention_heads) +
                     " is not a multiple of num_key_value_heads " + std::to_string(kv_heads()));
  if (head_dim < 0) fail(source, "'head_dim' must be positive");
  if (head_dim == 0 && hidden_size % num_attention_heads != 0)
    fail(source, "hidden_size " + std::to_string(hidden_size) + " is not a multiple of num_attention_heads " +
                     std::to_string(num_attention_heads) + " (and no head_dim is given)");
  if (head_size() % 2 != 0) fail(source, "the head size " + std::to_string(head_size()) + " must be even (rotary)");
  if (!(rms_norm_eps > 0)) fail(source, "'rms_norm_eps' must be positive");
  if (!(rope_theta > 0)) fail(source, "'rope_theta' must be positive");
}

LlamaConfig LlamaConfig::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(source, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(source, "not a JSON object");
  if (const json* t = find(j, "model_type"); t && *t != "llama")
    fail(source, "model_type " + t->dump() + " is not supported (only \"llama\")");
  if (const json* a = find(j, "hidden_act"); a && *a != "silu")
    fail(source, "hidden_act " + a->dump() + " is not supported (only \"silu\")");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (get_bool(j, key, source, false)) fail(source, std::string("'") + key + "': true is not supported (no biases)");
  // Rotary variants (linear, dynamic, yarn, llama3, ...) change the frequencies: refuse them.
  if (const json* s = find(j, "rope_scaling"))
    fail(source, "rope_scaling " + s->dump() + " is not supported (only the default rotary embedding)");
  LlamaConfig c;
  c.rope_theta = get_double(j, "rope_theta", source, 10000.0);
  if (const json* rp = find(j, "rope_parameters")) {  // Transformers 5
    if (!rp->is_object()) fail(source, "'rope_parameters' must be an object, got " + rp->dump());
    const json* type = find(*rp, "rope_type");
    if (!type) type = find(*rp, "type");
    if (type && *type != "default")
      fail(source, "rope_parameters.rope_type " + type->dump() + " is not supported (only \"default\")");
    c.rope_theta = get_double(*rp, "rope_theta", source + " rope_parameters", c.rope_theta);
  }
  c.vocab_size = get_int(j, "vocab_size", source, std::nullopt);
  c.hidden_size = get_int(j, "hidden_size", source, std::nullopt);
  c.intermediate_size = get_int(j, "intermediate_size", source, std::nullopt);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", source, std::nullopt);
  c.num_attention_heads = get_int(j, "num_attention_heads", source, std::nullopt);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", source, c.num_attention_heads);
  c.head_dim = get_int(j, "head_dim", source, 0);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", source, std::nullopt);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", source, std::nullopt);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", source, false);
  c.initializer_range = get_double(j, "initializer_range", source, 0.02);
  c.bos_token_id = get_token(j, "bos_token_id", source);
  c.pad_token_id = get_token(j, "pad_token_id", source);
  if (const json* e = find(j, "eos_token_id")) {
    if (e->is_number_integer())
      c.eos_token_id = {e->get<std::int64_t>()};
    else if (e->is_array() && std::all_of(e->begin(), e->end(), [](const json& x) { return x.is_number_integer(); }))
      c.eos_token_id = e->get<std::vector<std::int64_t>>();
    else
      fail(source, "'eos_token_id' must be an integer or a list of integers, got " + e->dump());
  }
  const json* dt = find(j, "dtype");
  if (!dt) dt = find(j, "torch_dtype");
  if (dt) {
    if (!dt->is_string()) fail(source, "'dtype' must be a string, got " + dt->dump());
    c.dtype = dt->get<std::string>();
  }
  c.validate(source);
  return c;
}

LlamaConfig LlamaConfig::from_file(const std::string& path_or_dir) {
  const std::string path = files::is_dir(path_or_dir) ? path_or_dir + "/config.json" : path_or_dir;
  if (!files::is_file(path))
    throw LlamaConfigError("Llama config " + path +
                           ": cannot be opened (give a config.json, or a directory holding one)");
  std::string text;
  try {
    text = files::read_file(path);
  } catch (const std::exception& e) {
    throw LlamaConfigError("Llama config " + path + ": cannot be read: " + e.what());
  }
  return from_json(text, path);
}

std::string LlamaConfig::to_json() const {
  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  j["mlp_bias"] = false;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = kv_heads();
  j["head_dim"] = head_size();
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_parameters"] = {{"rope_theta", rope_theta}, {"rope_type", "default"}};
  j["rope_theta"] = rope_theta;  // where Transformers 4 reads it (5 accepts both)
  j["max_position_embeddings"] = max_position_embeddings;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["initializer_range"] = initializer_range;
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  j["pad_token_id"] = pad_token_id ? json(*pad_token_id) : json(nullptr);
  j["eos_token_id"] = eos_token_id.empty()       ? json(nullptr)
                      : eos_token_id.size() == 1 ? json(eos_token_id[0])
                                                 : json(eos_token_id);
  j["dtype"] = dtype;
  j["torch_dtype"] = dtype;  // Transformers 4's name
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

std::string LlamaConfig::generation_config_json() const {
  json j;
  j["_from_model_config"] = true;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  if (!eos_token_id.empty()) j["eos_token_id"] = eos_token_id.size() == 1 ? json(eos_token_id[0]) : json(eos_token_id);
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

}  // namespace accel::models
