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

// rope_parameters (Transformers 5: rope_type, rope_theta and the type's parameters) or rope_scaling
// beside a top-level rope_theta (Transformers 4; "type" in older files).
void read_rope(const json& j, const std::string& source, LlamaConfig& c) {
  c.rope_theta = get_double(j, "rope_theta", source, 10000.0);
  const json* rp = find(j, "rope_parameters");
  const std::string where = rp ? source + " rope_parameters" : source + " rope_scaling";
  if (!rp) rp = find(j, "rope_scaling");
  if (!rp) return;
  if (!rp->is_object()) fail(where, "must be an object, got " + rp->dump());
  if (find(*rp, "rope_theta")) c.rope_theta = get_double(*rp, "rope_theta", where, std::nullopt);
  const json* type = find(*rp, "rope_type");
  if (!type) type = find(*rp, "type");
  if (type && !type->is_string()) fail(where, "rope_type must be a string, got " + type->dump());
  RopeScaling& r = c.rope_scaling;
  r.type = type ? type->get<std::string>() : "default";
  if (r.type != "default" && r.type != "linear" && r.type != "llama3")
    fail(where, "rope_type " + type->dump() + " is not supported (default, linear, llama3)");
  if (r.type == "default") return;
  r.factor = get_double(*rp, "factor", where, std::nullopt);
  if (r.type == "llama3") {
    r.low_freq_factor = get_double(*rp, "low_freq_factor", where, std::nullopt);
    r.high_freq_factor = get_double(*rp, "high_freq_factor", where, std::nullopt);
    r.original_max_position_embeddings = get_int(*rp, "original_max_position_embeddings", where, std::nullopt);
  }
}

// The window: Mistral's sliding_window (absent: 4096, Transformers' default; null: none); Qwen2's when
// use_sliding_window (its sliding_window, 4096 when absent), on the layers layer_types names
// "sliding_attention" (or, without layer_types, from max_window_layers on: see from_json).
void read_sliding(const json& j, const std::string& source, LlamaConfig& c) {
  auto window = [&]() -> std::optional<std::int64_t> {
    if (!j.contains("sliding_window")) return 4096;
    if (j["sliding_window"].is_null()) return std::nullopt;
    return get_int(j, "sliding_window", source, std::nullopt);
  };
  if (c.model_type == "mistral") c.sliding_window = window();
  if (c.model_type == "qwen2" && get_bool(j, "use_sliding_window", source, false)) c.sliding_window = window();
  if (c.model_type == "llama") return;
  if (const json* lt = find(j, "layer_types")) {
    if (!lt->is_array()) fail(source, "'layer_types' must be a list, got " + lt->dump());
    for (const json& v : *lt) {
      if (v != "full_attention" && v != "sliding_attention")
        fail(source, "layer_types: " + v.dump() + " is not supported (full_attention, sliding_attention)");
      c.sliding_layers.push_back(v == "sliding_attention");
    }
  }
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
  if (attn_implementation != "auto" && attn_implementation != "eager" && attn_implementation != "sdpa")
    fail(source, "attn_implementation must be auto, eager or sdpa, got '" + attn_implementation + "'");
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
  if (model_type != "llama" && model_type != "qwen2" && model_type != "mistral")
    fail(source, "model_type \"" + model_type + "\" is not supported (llama, qwen2, mistral)");
  if (model_type == "qwen2" && (!qkv_bias || o_bias || mlp_bias))
    fail(source, "a qwen2 model has biases on q/k/v only");
  if (model_type == "mistral" && (qkv_bias || o_bias || mlp_bias)) fail(source, "a mistral model has no biases");
  if (model_type == "llama" && qkv_bias != o_bias)
    fail(source, "a llama model's attention_bias puts biases on q, k, v and o alike");
  const RopeScaling& r = rope_scaling;
  if (r.type != "default" && r.type != "linear" && r.type != "llama3")
    fail(source, "rope_type \"" + r.type + "\" is not supported (default, linear, llama3)");
  if (r.type != "default" && !(r.factor > 0)) fail(source, "the rope scaling factor must be positive");
  if (r.type == "llama3" && !(r.high_freq_factor > r.low_freq_factor && r.low_freq_factor > 0))
    fail(source, "llama3 rope: high_freq_factor must exceed low_freq_factor > 0");
  if (r.type == "llama3" && r.original_max_position_embeddings <= 0)
    fail(source, "llama3 rope: original_max_position_embeddings must be positive");
  if (!sliding_layers.empty() && static_cast<std::int64_t>(sliding_layers.size()) != num_hidden_layers)
    fail(source, "layer_types lists " + std::to_string(sliding_layers.size()) + " layers, the model has " +
                     std::to_string(num_hidden_layers));
  const bool any_sliding = std::find(sliding_layers.begin(), sliding_layers.end(), true) != sliding_layers.end();
  if (any_sliding && !(sliding_window && *sliding_window > 0))
    fail(source, "a sliding_attention layer needs a positive sliding_window");
}

LlamaConfig LlamaConfig::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(source, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(source, "not a JSON object");
  LlamaConfig c;
  if (const json* t = find(j, "model_type")) {
    if (!t->is_string()) fail(source, "'model_type' must be a string, got " + t->dump());
    c.model_type = t->get<std::string>();
    if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral")
      fail(source, "model_type " + t->dump() + " is not supported (llama, qwen2, mistral)");
  }
  if (const json* a = find(j, "hidden_act"); a && *a != "silu")
    fail(source, "hidden_act " + a->dump() + " is not supported (only \"silu\")");
  if (c.model_type == "llama") {
    c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", source, false);
    c.mlp_bias = get_bool(j, "mlp_bias", source, false);
  } else if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v with biases, o without
  }
  read_rope(j, source, c);
  read_sliding(j, source, c);
  c.vocab_size = get_int(j, "vocab_size", source, std::nullopt);
  c.hidden_size = get_int(j, "hidden_size", source, std::nullopt);
  c.intermediate_size = get_int(j, "intermediate_size", source, std::nullopt);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", source, std::nullopt);
  if (c.sliding_layers.empty() && c.model_type == "mistral" && c.sliding_window)
    c.sliding_layers.assign(static_cast<std::size_t>(c.num_hidden_layers), true);
  if (c.sliding_layers.empty() && c.model_type == "qwen2" && c.sliding_window) {  // use_sliding_window
    const std::int64_t from = get_int(j, "max_window_layers", source, 28);
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers.push_back(i >= from);
  }
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
  j["architectures"] = {model_type == "qwen2"     ? "Qwen2ForCausalLM"
                        : model_type == "mistral" ? "MistralForCausalLM"
                                                  : "LlamaForCausalLM"};
  j["model_type"] = model_type;
  if (model_type == "llama") {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = mlp_bias;
  }
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = kv_heads();
  j["head_dim"] = head_size();
  j["rms_norm_eps"] = rms_norm_eps;
  json rope = {{"rope_theta", rope_theta}, {"rope_type", rope_scaling.type}};
  if (rope_scaling.type != "default") rope["factor"] = rope_scaling.factor;
  if (rope_scaling.type == "llama3") {
    rope["low_freq_factor"] = rope_scaling.low_freq_factor;
    rope["high_freq_factor"] = rope_scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
  }
  j["rope_parameters"] = rope;
  j["rope_theta"] = rope_theta;  // where Transformers 4 reads it (5 accepts both)
  if (rope_scaling.type != "default") {
    json old = rope;  // Transformers 4's rope_scaling
    old.erase("rope_theta");
    j["rope_scaling"] = old;
  }
  if (model_type != "llama") {
    j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
    if (model_type == "qwen2") {
      const bool any = std::find(sliding_layers.begin(), sliding_layers.end(), true) != sliding_layers.end();
      j["use_sliding_window"] = any;
      json types = json::array();
      for (std::int64_t i = 0; i < num_hidden_layers; ++i)
        types.push_back(window_of(i) ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      j["max_window_layers"] = num_hidden_layers;  // layer_types decides
    }
  }
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
