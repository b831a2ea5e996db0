// The Llama family (src/models/: Llama, Qwen2, Mistral) against Hugging Face Transformers, on every
// rank of an mpirun:
//  - config.json parsing: required keys, Transformers' defaults, the family's switches (biases, rope
//    types, sliding windows), refused variants (named errors);
//  - the KV-cache path gives the full forward's logits, token by token; a sliding window hides what
//    lies before it;
//  - directories Transformers' save_pretrained wrote (random models with weights of std 0.12, sharded
//    files, tied and untied heads, Llama 3.1 and linear ropes, biases, Qwen2 and Mistral windows) load
//    here under plain/DDP, ZeRO-3 and FULL_SHARD and give Transformers' eager fp32 logits (<= 1e-5);
//  - models trained here a few steps under ZeRO-3 and saved with save_pretrained (Llama, Qwen2,
//    Mistral) open in AutoModelForCausalLM.from_pretrained and give accel's logits (<= 1e-5).
// The Python side is tests/models/llama_interop.py (two interpreter runs per binary run).
#include "models/llama.h"
#include "models/pretrained.h"

#include "accelerator/accelerator.h"
#include "base/files.h"
#include "checkpoint/safetensors.h"
#include "support/python.h"
#include "test_world.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/data/datasets/base.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#ifndef ACCEL_PYTHON
#define ACCEL_PYTHON ""
#endif

namespace accel::models {
namespace {

using test::world;

const std::string kScript = std::string(ACCEL_SOURCE_DIR) + "/tests/models/llama_interop.py";

bool have_python() { return test::python_available(ACCEL_PYTHON); }

// Rank 0 runs the script; every rank gets its exit status (and rank 0 prints the output).
int python_on_rank0(const std::string& args) {
  at::Tensor status = at::zeros({1}, at::kInt);
  if (world()->rank() == 0) {
    auto [rc, out] = test::run_python(ACCEL_PYTHON, kScript, args);
    std::printf("%s", out.c_str());
    status.fill_(rc);
  }
  world()->broadcast(status, {.root = 0});
  return status.item<int>();
}

AcceleratorOptions options(const std::string& config) {
  AcceleratorOptions o;
  if (!config.empty()) o.config_file = config[0] == '/' ? config : std::string(ACCEL_SOURCE_DIR) + "/configs/" + config;
  o.report_ignored_keys = false;
  return o;
}

// Windows of rule_tokens as next-token examples: data = tokens [0, T), target = tokens [1, T + 1).
at::Tensor rule_tokens(std::int64_t batch, std::int64_t seq, std::int64_t vocab, std::uint64_t seed);
class TokenWindows : public torch::data::datasets::Dataset<TokenWindows> {
 public:
  TokenWindows(std::int64_t n, std::int64_t seq, std::int64_t vocab) : tokens_(rule_tokens(n, seq + 1, vocab, 21)) {}
  torch::data::Example<> get(size_t i) override {
    at::Tensor row = tokens_[static_cast<std::int64_t>(i)];
    return {row.narrow(0, 0, row.size(0) - 1), row.narrow(0, 1, row.size(0) - 1)};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(tokens_.size(0)); }

 private:
  at::Tensor tokens_;
};

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

LlamaConfig small_config(bool tied) {
  LlamaConfig c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 56;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_id = {2};
  return c;
}

// --- config.json ----------------------------------------------------------------------------------

const char* kConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "vocab_size": 97, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
  "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 5000.0, "rope_type": "default"}, "tie_word_embeddings": false,
  "bos_token_id": 1, "eos_token_id": [2, 5], "pad_token_id": null, "dtype": "bfloat16"})";

std::string without(const std::string& key) {
  auto j = nlohmann::json::parse(kConfig);
  j.erase(key);
  return j.dump();
}

// `text` without Transformers 5's rope_parameters (so that rope_scaling, Transformers 4's, is read).
std::string without_rope(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  j.erase("rope_parameters");
  return j.dump();
}

// kConfig with `key` set to the JSON `value`.
std::string with(const std::string& key, const std::string& value) {
  auto j = nlohmann::json::parse(kConfig);
  j[key] = nlohmann::json::parse(value);
  return j.dump();
}

// The error's message, or "" when `f` did not throw LlamaConfigError.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const LlamaConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaConfig, ParsesTransformersKeys) {
  auto c = LlamaConfig::from_json(kConfig, "cfg.json");
  EXPECT_EQ(c.vocab_size, 97);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.eos_token_id, (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(c.dtype, "bfloat16");
  // Transformers 4's spelling: rope_theta at the top, torch_dtype; kv heads default to the heads.
  auto old = LlamaConfig::from_json(
      R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
          "num_attention_heads": 2, "max_position_embeddings": 8, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
          "rope_scaling": null, "torch_dtype": "float16", "head_dim": 6})");
  EXPECT_DOUBLE_EQ(old.rope_theta, 500000.0);
  EXPECT_EQ(old.kv_heads(), 2);
  EXPECT_EQ(old.head_size(), 6);
  EXPECT_EQ(old.dtype, "float16");
  EXPECT_FALSE(old.tie_word_embeddings);
  // to_json reads back the same.
  auto back = LlamaConfig::from_json(c.to_json());
  EXPECT_NO_THROW(check_same_architecture(c, back, "round trip"));
  EXPECT_EQ(back.eos_token_id, c.eos_token_id);
  EXPECT_EQ(back.bos_token_id, c.bos_token_id);
}

TEST(LlamaConfig, ParsesTheFamilysSwitches) {
  auto parse = [](const std::string& changes) {
    auto j = nlohmann::json::parse(kConfig);
    const auto changed = nlohmann::json::parse(changes);  // (items() of a temporary would dangle)
    for (auto& [k, v] : changed.items()) j[k] = v;
    return LlamaConfig::from_json(j.dump(), "cfg.json");
  };
  // Llama 3.1's rope (Transformers 5 and 4 spellings), and linear.
  const char* llama3 = R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})";
  auto l3 = parse(std::string(R"({"rope_parameters": )") + llama3 + "}");
  EXPECT_EQ(l3.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(l3.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(l3.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(l3.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l3.rope_scaling.original_max_position_embeddings, 8192);
  auto l3_old = LlamaConfig::from_json(without_rope(with("rope_scaling", llama3)));
  EXPECT_NO_THROW(check_same_architecture(l3, l3_old, "Transformers 4's rope_scaling"));
  EXPECT_EQ(
      parse(R"({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}})").rope_scaling.type,
      "linear");
  // Biases: Llama's attention_bias and mlp_bias; Qwen2's q/k/v.
  auto lb = parse(R"({"attention_bias": true, "mlp_bias": true})");
  EXPECT_TRUE(lb.qkv_bias && lb.o_bias && lb.mlp_bias);
  auto q = parse(R"({"model_type": "qwen2"})");
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias || q.mlp_bias);
  EXPECT_FALSE(q.window_of(0) || q.window_of(2));  // use_sliding_window is false by default
  // Qwen2's window from max_window_layers on, or where layer_types says.
  auto qs =
      parse(R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 5, "max_window_layers": 1})");
  EXPECT_FALSE(qs.window_of(0));
  EXPECT_EQ(qs.window_of(1), 5);
  EXPECT_EQ(qs.window_of(2), 5);
  auto qt = parse(R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 5,
                      "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})");
  EXPECT_EQ(qt.window_of(0), 5);
  EXPECT_FALSE(qt.window_of(1));
  // Mistral: every layer slides; Transformers' default window when the key is absent; null: none.
  auto m = parse(R"({"model_type": "mistral", "sliding_window": 3})");
  EXPECT_EQ(m.window_of(0), 3);
  EXPECT_EQ(m.window_of(2), 3);
  EXPECT_FALSE(m.qkv_bias || m.o_bias || m.mlp_bias);
  EXPECT_EQ(parse(R"({"model_type": "mistral"})").window_of(1), 4096);
  EXPECT_FALSE(parse(R"({"model_type": "mistral", "sliding_window": null})").window_of(1));
  // Each reads back from its own config.json, and a difference is named.
  for (const LlamaConfig& c : {l3, lb, q, qs, qt, m}) {
    auto back = LlamaConfig::from_json(c.to_json());
    EXPECT_NO_THROW(check_same_architecture(c, back, "round trip")) << c.to_json();
  }
  auto msg = error_of([&] { check_same_architecture(qs, qt, "dir/config.json"); });
  EXPECT_NE(msg.find("layer 0's sliding window is 5, the model's none"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] {
              check_same_architecture(q, m, "dir/config.json");
            }).find("model_type is mistral, the model has qwen2"),
            std::string::npos);
}

TEST(LlamaConfig, BadInputIsANamedError) {
  for (const char* key : {"hidden_size", "vocab_size", "num_hidden_layers", "rms_norm_eps"}) {
    auto msg = error_of([&] { LlamaConfig::from_json(without(key), "cfg.json"); });
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("missing required key '") + key + "'"), std::string::npos) << msg;
  }
  // A llama3 rope without its parameters; a rope_type this model does not implement.
  auto rs = error_of([&] {
    LlamaConfig::from_json(without_rope(with("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})")), "cfg.json");
  });
  EXPECT_NE(rs.find("cfg.json rope_scaling: missing required key 'low_freq_factor'"), std::string::npos) << rs;
  for (const char* type : {"yarn", "dynamic", "longrope"}) {
    auto ry = error_of([&] {
      LlamaConfig::from_json(
          with("rope_parameters", std::string(R"({"rope_theta": 1e4, "factor": 2.0, "rope_type": ")") + type + "\"}"),
          "cfg.json");
    });
    EXPECT_NE(ry.find(std::string("rope_type \"") + type + "\" is not supported (default, linear, llama3)"),
              std::string::npos)
        << ry;
  }
  EXPECT_NE(error_of([&] { LlamaConfig::from_json(with("hidden_act", R"("gelu")")); }).find("hidden_act"),
            std::string::npos);
  EXPECT_NE(error_of([&] { LlamaConfig::from_json(with("attention_bias", R"("yes")")); }).find("attention_bias"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              LlamaConfig::from_json(with("model_type", R"("gemma")"));
            }).find("model_type \"gemma\" is not supported (llama, qwen2, mistral)"),
            std::string::npos);
  // A Qwen2 sliding layer with the window off; a layer type this model does not implement.
  auto qwen = [](const std::string& extra) {
    auto j = nlohmann::json::parse(kConfig);
    j["model_type"] = "qwen2";
    const auto changed = nlohmann::json::parse(extra);
    for (auto& [k, v] : changed.items()) j[k] = v;
    return j.dump();
  };
  EXPECT_NE(
      error_of([&] {
        LlamaConfig::from_json(qwen(R"({"layer_types": ["full_attention", "sliding_attention", "full_attention"]})"));
      }).find("a sliding_attention layer needs a positive sliding_window"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        LlamaConfig::from_json(qwen(R"({"layer_types": ["full_attention", "chunked_attention", "full_attention"]})"));
      }).find("layer_types: \"chunked_attention\" is not supported"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              LlamaConfig::from_json(qwen(R"({"use_sliding_window": true, "layer_types": ["sliding_attention"]})"));
            }).find("layer_types lists 1 layers, the model has 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { LlamaConfig::from_json(with("hidden_size", R"("48")")); }).find("must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              LlamaConfig::from_json(with("num_key_value_heads", "4"));
            }).find("not a multiple of num_key_value_heads 4"),
            std::string::npos);
  auto missing = error_of([] { LlamaConfig::from_file("/nonexistent/llama"); });
  EXPECT_NE(missing.find("/nonexistent/llama: cannot be opened"), std::string::npos) << missing;
}

// --- the model ------------------------------------------------------------------------------------

TEST(Llama, ParameterNamesAreTransformers) {
  at::manual_seed(0);
  LlamaForCausalLM untied(small_config(false)), tied(small_config(true));
  auto names = [](torch::nn::Module& m) {
    std::vector<std::string> out;
    for (const auto& kv : m.named_parameters()) out.push_back(kv.key());
    return out;
  };
  auto u = names(untied);
  ASSERT_EQ(u.size(), 1 + 2 * 9 + 1 + 1u);
  EXPECT_EQ(u.front(), "model.embed_tokens.weight");
  EXPECT_EQ(u[1], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(u[5], "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(u[8], "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(u[9], "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(u[u.size() - 2], "model.norm.weight");
  EXPECT_EQ(u.back(), "lm_head.weight");
  EXPECT_EQ(untied.model->layers[0]->named_parameters()["self_attn.k_proj.weight"].sizes(), at::IntArrayRef({16, 32}));
  EXPECT_EQ(names(tied).size(), u.size() - 1);  // no lm_head: the head is embed_tokens
  EXPECT_TRUE(untied.named_buffers().is_empty());
}

TEST(Llama, ConstructionOptions) {
  // Meta: nothing allocated, the same names and shapes.
  at::manual_seed(4);
  LlamaForCausalLM fp32(small_config(false));
  at::manual_seed(4);
  LlamaForCausalLM bf16(small_config(false), at::TensorOptions().dtype(at::kBFloat16));
  LlamaForCausalLM meta(small_config(false), at::TensorOptions().device(at::kMeta));
  auto ref = fp32.named_parameters();
  for (const auto& kv : meta.named_parameters()) {
    EXPECT_TRUE(kv.value().is_meta()) << kv.key();
    EXPECT_EQ(kv.value().sizes(), ref[kv.key()].sizes()) << kv.key();
  }
  EXPECT_EQ(meta.named_parameters().size(), ref.size());
  // bf16: the fp32 draws, rounded.
  for (const auto& kv : bf16.named_parameters()) {
    EXPECT_EQ(kv.value().scalar_type(), at::kBFloat16);
    EXPECT_TRUE(kv.value().equal(ref[kv.key()].to(at::kBFloat16))) << kv.key();
  }
  c10::NoGradGuard no_grad;
  at::Tensor tokens = at::randint(0, 61, {2, 7}, at::kLong);
  at::Tensor a = fp32.forward(tokens), b = bf16.forward(tokens);
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  EXPECT_LE(max_abs_diff(a, b.to(at::kFloat)), 0.05 * a.abs().max().item<double>());
}

TEST(Llama, KVCacheGivesTheFullForwardsLogits) {
  at::manual_seed(3);
  for (bool tied : {false, true}) {
    LlamaForCausalLM m(small_config(tied));
    c10::NoGradGuard no_grad;
    at::Tensor tokens = at::randint(0, 61, {3, 9}, at::kLong);
    at::Tensor full = m.forward(tokens);
    ASSERT_EQ(full.sizes(), at::IntArrayRef({3, 9, 61}));
    KVCache cache = m.make_cache();
    std::vector<at::Tensor> parts{m.forward(tokens.narrow(1, 0, 4), &cache)};  // a prompt, then one at a time
    EXPECT_EQ(cache.position, 4);
    for (int t = 4; t < 9; ++t) parts.push_back(m.forward(tokens.narrow(1, t, 1), &cache));
    EXPECT_EQ(cache.position, 9);
    EXPECT_EQ(cache.layers[1].key.sizes(), at::IntArrayRef({3, 2, 9, 8}));
    EXPECT_LE(max_abs_diff(at::cat(parts, 1), full), 1e-5) << "tied " << tied;
    // A causal model: a prefix's logits do not depend on what follows it.
    EXPECT_LE(max_abs_diff(m.forward(tokens.narrow(1, 0, 5)), full.narrow(1, 0, 5)), 1e-5);
  }
}

// A sliding window of 3 (Mistral) on a one-layer model: position t sees tokens t-2 .. t only, so a
// change to token 0 moves the logits of positions 0-2 and leaves those from 3 on exactly as they were;
// the KV-cache path (a prompt longer than the window, then one token at a time) gives the full
// forward's logits. Qwen2's biases ride along in the second model.
TEST(Llama, SlidingWindowSeesOnlyTheLastKeys) {
  at::manual_seed(4);
  for (const char* family : {"mistral", "qwen2"}) {
    LlamaConfig c = small_config(false);
    c.model_type = family;
    c.num_hidden_layers = 1;
    c.sliding_window = 3;
    c.sliding_layers = {true};
    c.qkv_bias = std::string(family) == "qwen2";
    c.initializer_range = 0.1;
    LlamaForCausalLM m(c);
    c10::NoGradGuard no_grad;
    if (c.qkv_bias) m.model->layers[0]->as<LlamaDecoderLayer>()->self_attn->q_proj->bias.normal_(0, 0.1);
    at::Tensor tokens = at::randint(0, 61, {2, 8}, at::kLong);
    at::Tensor changed = tokens.clone();
    changed.select(1, 0).add_(1).remainder_(61);
    at::Tensor a = m.forward(tokens), b = m.forward(changed);
    for (int t = 0; t < 3; ++t) EXPECT_GT(max_abs_diff(a.select(1, t), b.select(1, t)), 1e-4) << family << " " << t;
    EXPECT_EQ(max_abs_diff(a.narrow(1, 3, 5), b.narrow(1, 3, 5)), 0.0) << family;
    KVCache cache = m.make_cache();
    std::vector<at::Tensor> parts{m.forward(tokens.narrow(1, 0, 5), &cache)};
    for (int t = 5; t < 8; ++t) parts.push_back(m.forward(tokens.narrow(1, t, 1), &cache));
    EXPECT_LE(max_abs_diff(at::cat(parts, 1), a), 1e-5) << family;
  }
}

// attn_implementation sdpa computes what eager computes, in float64 to 1e-6 (eager's softmax runs in
// fp32, as Transformers' does: measured 2.4e-8; a wrong mask moves logits by 1e-2 and more): the full forward with
// grouped kv heads, the KV-cache path, a sliding window, and left padding (on the real positions; a
// padded query attends to every key under sdpa, as Transformers unmasks it, and nothing reads it);
// and the gradients of a training step.
TEST(Llama, FusedAttentionGivesTheWrittenOutLogits) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  for (const char* family : {"llama", "mistral"}) {
    LlamaConfig c = small_config(false);
    c.model_type = family;
    if (std::string(family) == "mistral") {
      c.sliding_window = 3;
      c.sliding_layers = std::vector<bool>(static_cast<std::size_t>(c.num_hidden_layers), true);
    }
    auto build = [&](const char* impl) {
      LlamaConfig ci = c;
      ci.attn_implementation = impl;
      at::manual_seed(8);
      return LlamaForCausalLM(ci, f64);
    };
    LlamaForCausalLM eager = build("eager"), fused = build("sdpa");
    at::manual_seed(9);
    const at::Tensor tokens = at::randint(0, 61, {3, 9}, at::kLong);
    {
      c10::NoGradGuard no_grad;
      EXPECT_LE(max_abs_diff(fused.forward(tokens), eager.forward(tokens)), 1e-6) << family;
      KVCache cache = fused.make_cache();
      std::vector<at::Tensor> parts{fused.forward(tokens.narrow(1, 0, 5), &cache)};
      for (int t = 5; t < 9; ++t) parts.push_back(fused.forward(tokens.narrow(1, t, 1), &cache));
      EXPECT_LE(max_abs_diff(at::cat(parts, 1), eager.forward(tokens)), 1e-6) << family << " (KV cache)";
      // Left padding: row 1 starts with 3 pads, row 2 with 1.
      at::Tensor mask = at::ones({3, 9}, at::kLong);
      mask[1].narrow(0, 0, 3).zero_();
      mask[2].narrow(0, 0, 1).zero_();
      const at::Tensor a = fused.forward(tokens, nullptr, mask), b = eager.forward(tokens, nullptr, mask);
      const at::Tensor real = mask.to(at::kBool).unsqueeze(-1).expand_as(a);
      EXPECT_LE((a - b).abs().masked_select(real).max().item<double>(), 1e-6) << family << " (padding)";
    }
    const at::Tensor loss_e = causal_lm_loss(eager.forward(tokens), tokens);
    const at::Tensor loss_f = causal_lm_loss(fused.forward(tokens), tokens);
    loss_e.backward();
    loss_f.backward();
    auto ge = eager.named_parameters();
    for (const auto& kv : fused.named_parameters())
      EXPECT_LE(max_abs_diff(kv.value().grad(), ge[kv.key()].grad()), 1e-6) << family << " " << kv.key();
  }
  LlamaConfig bad = small_config(false);
  bad.attn_implementation = "flash";
  EXPECT_NE(error_of([&] { LlamaForCausalLM m(bad); }).find("attn_implementation"), std::string::npos);
}

// Targets of -100 are out of the loss and of its mean: the mean of -log p(target) over the others.
TEST(Llama, CausalLmLossLeavesOutMinus100) {
  at::manual_seed(6);
  const at::Tensor logits = at::randn({2, 3, 5});
  const at::Tensor targets = at::tensor({4, -100, 0, 2, 1, -100}, at::kLong).view({2, 3});
  const at::Tensor logp = at::log_softmax(logits, -1);
  const double want = -(logp[0][0][4] + logp[0][2][0] + logp[1][0][2] + logp[1][1][1]).item<double>() / 4;
  EXPECT_NEAR(causal_lm_loss(logits, targets).item<double>(), want, 1e-6);
}

// --- Transformers -> accel ------------------------------------------------------------------------

class LlamaInterop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // configs/fsdp/full_shard.yaml wrapping Llama's layers instead of the GPT's BlockImpl.
    const std::string dir = test::scratch_dir("configs");
    llama_full_shard_ = dir + "/full_shard_llama.yaml";
    if (world()->rank() == 0) {
      std::string yaml = files::read_file(std::string(ACCEL_SOURCE_DIR) + "/configs/fsdp/full_shard.yaml");
      const std::string from = "fsdp_transformer_layer_cls_to_wrap: BlockImpl";
      ASSERT_NE(yaml.find(from), std::string::npos);
      yaml.replace(yaml.find(from), from.size(), "fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer");
      files::write_file_atomic(llama_full_shard_, yaml.data(), yaml.size());
    }
    world()->barrier();
    if (!have_python()) return;
    made_ = test::scratch_dir("transformers_saved");
    made_ok_ = python_on_rank0("make '" + made_ + "'") == 0;
  }
  static inline std::string made_, llama_full_shard_;
  static inline bool made_ok_ = false;
};

// max |a - b| over the positions where mask [B, T] is 1 (a, b [B, T, V]).
double max_diff_where(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  return ((a - b).abs().amax(-1) * mask.to(at::kFloat)).max().item<double>();
}

// A padded batch (row 0 padded on the left, row 1 on the right) against Transformers: the logits with
// attention_mask and position_ids, and with the mask alone, on every non-pad position; the loss with
// -100 labels at the pads; and the KV-cache path with a padded prompt, then token by token with the
// mask growing as generate() grows it.
void check_padded(LlamaForCausalLM& model, checkpoint::SafetensorsFile& ref) {
  const at::Tensor tokens = ref.read("tokens"), mask = ref.read("mask"), pos = ref.read("position_ids");
  const at::Tensor want = ref.read("logits_padded");
  const at::Tensor got = model.forward(tokens, nullptr, mask, pos);
  EXPECT_LE(max_diff_where(got, want, mask), 1e-5);
  EXPECT_GT(max_diff_where(model.forward(tokens), want, mask), 1e-2);  // padding changes the logits
  EXPECT_LE(max_diff_where(model.forward(tokens, nullptr, mask), ref.read("logits_mask_only"), mask), 1e-5);
  const std::int64_t T = tokens.size(1);
  const double loss = causal_lm_loss(got.narrow(1, 0, T - 1), ref.read("labels").narrow(1, 1, T - 1)).item<double>();
  const double want_loss = ref.read("loss").item<double>();
  EXPECT_NEAR(loss, want_loss, 1e-6 * std::abs(want_loss));
  KVCache cache = model.make_cache();
  std::vector<at::Tensor> steps{
      model.forward(tokens.narrow(1, 0, 6), &cache, mask.narrow(1, 0, 6), pos.narrow(1, 0, 6))};
  for (std::int64_t t = 6; t < T; ++t)
    steps.push_back(model.forward(tokens.narrow(1, t, 1), &cache, mask.narrow(1, 0, t + 1), pos.narrow(1, t, 1)));
  const double cached = max_diff_where(at::cat(steps, 1), want, mask);
  EXPECT_LE(cached, 1e-5);
  if (world()->rank() == 0)
    std::printf(
        "  padded batch: max |logits - Transformers'| on non-pad positions %.3e (KV cache %.3e), loss %.7f vs "
        "%.7f\n",
        max_diff_where(got, want, mask), cached, loss, want_loss);
}

TEST_F(LlamaInterop, TransformersSavedModelGivesTransformersLogits) {
  if (!have_python()) GTEST_SKIP() << "ACCEL_PYTHON not configured";
  ASSERT_TRUE(made_ok_) << "llama_interop.py make failed (its output is above)";
  for (const char* name : {"untied", "tied", "head_dim", "bf16", "llama3_rope", "linear_rope", "llama_biases", "qwen2",
                           "qwen2_sliding", "mistral", "mistral_no_window"}) {
    const std::string dir = made_ + "/" + name;
    auto ref = checkpoint::SafetensorsFile::open(made_ + "/" + name + ".reference.safetensors");
    const at::Tensor tokens = ref.read("tokens"), expected = ref.read("logits");
    ASSERT_TRUE(files::exists(dir + "/model.safetensors.index.json")) << "not sharded";
    // "": no config file (a single process, or DDP across the ranks); ZeRO-3 shards every layer;
    // full_shard.yaml wraps BlockImpl (the GPT's), so there the whole model is one sharded root unit;
    // full_shard_llama.yaml wraps LlamaDecoderLayer: a unit per layer again.
    for (const std::string cfg : {std::string(), std::string("ddp.yaml"), std::string("deepspeed/zero3.yaml"),
                                  std::string("fsdp/full_shard.yaml"), llama_full_shard_}) {
      SCOPED_TRACE(std::string(name) + " under " + (cfg.empty() ? "no config" : cfg));
      Accelerator acc(options(cfg));
      at::manual_seed(99);  // weights unlike the file's, until loaded
      const auto config = LlamaConfig::from_file(dir);
      EXPECT_EQ(config.dtype, std::string(name) == "bf16" ? "bfloat16" : "float32");
      auto model = std::make_shared<LlamaForCausalLM>(config);  // fp32 (a bf16 file is converted on load)
      torch::optim::SGD sgd(model->parameters(), 0.1);
      DataLoader<TokenWindows> loader(TokenWindows(8, 6, 97), {.batch_size = 2});  // ZeRO-3 wants a batch size
      acc.prepare(model, sgd, loader);
      const bool per_layer = cfg == llama_full_shard_ || cfg == "deepspeed/zero3.yaml";
      if (per_layer) EXPECT_EQ(acc.engine()->units().size(), 4u);  // three layers and the root
      c10::NoGradGuard no_grad;
      EXPECT_GT(max_abs_diff(model->forward(tokens), expected), 1e-2);  // fresh weights are not the file's
      auto loaded = load_pretrained(*acc.engine(), *model, dir);
      EXPECT_GT(loaded.files.size(), 1u);
      const double diff = max_abs_diff(model->forward(tokens), expected);
      EXPECT_LE(diff, 1e-5);
      // The KV-cache path through the prepared (possibly sharded) layers: a prompt, then token by token.
      KVCache cache = model->make_cache();
      std::vector<at::Tensor> steps{model->forward(tokens.narrow(1, 0, 6), &cache)};
      for (std::int64_t t = 6; t < tokens.size(1); ++t) steps.push_back(model->forward(tokens.narrow(1, t, 1), &cache));
      EXPECT_LE(max_abs_diff(at::cat(steps, 1), expected), 1e-5);
      if (ref.contains("mask")) check_padded(*model, ref);
      if (world()->rank() == 0)
        std::printf("%s, %s, %d rank(s), %zu units: max |logits - Transformers'| = %.3e\n", name,
                    cfg.empty() ? "no config" : cfg.substr(cfg.rfind('/') + 1).c_str(), world()->size(),
                    acc.engine()->units().size(), diff);
      acc.end_training();
    }
  }
}

TEST_F(LlamaInterop, ConfigThatDoesNotMatchTheModelIsRefused) {
  if (!have_python()) GTEST_SKIP() << "ACCEL_PYTHON not configured";
  ASSERT_TRUE(made_ok_);
  Accelerator acc(options(""));
  auto c = LlamaConfig::from_file(made_ + "/untied");
  c.tie_word_embeddings = true;
  auto model = std::make_shared<LlamaForCausalLM>(c);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  acc.prepare(model, sgd);
  auto msg = error_of([&] { load_pretrained(*acc.engine(), *model, made_ + "/untied"); });
  EXPECT_NE(msg.find("tie_word_embeddings is 0, the model has 1"), std::string::npos) << msg;
  acc.end_training();
}

// --- accel -> Transformers ------------------------------------------------------------------------

// Tokens that follow a rule (t[i+1] = (t[i] * 3 + 1) mod vocab from a random start), so training has
// something to learn.
at::Tensor rule_tokens(std::int64_t batch, std::int64_t seq, std::int64_t vocab, std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor t = at::empty({batch, seq}, at::kLong);
  at::Tensor start = at::randint(0, vocab, {batch}, gen, at::kLong);
  auto a = t.accessor<std::int64_t, 2>();
  for (std::int64_t b = 0; b < batch; ++b) {
    a[b][0] = start[b].item<std::int64_t>();
    for (std::int64_t i = 1; i < seq; ++i) a[b][i] = (a[b][i - 1] * 3 + 1) % vocab;
  }
  return t;
}

TEST_F(LlamaInterop, TrainedUnderZero3OpensInTransformersWithTheSameLogits) {
  if (!have_python()) GTEST_SKIP() << "ACCEL_PYTHON not configured";
  const std::string out = test::scratch_dir("trained");
  std::string check_args;
  // Llama untied and tied, Qwen2 (q/k/v biases, tied), Mistral (a window of 5 on 16-token windows).
  for (const std::string name : {"untied", "tied", "qwen2", "mistral"}) {
    LlamaConfig config = small_config(name == "tied" || name == "qwen2");
    if (name == "qwen2") {
      config.model_type = "qwen2";
      config.qkv_bias = true;
    }
    if (name == "mistral") {
      config.model_type = "mistral";
      config.sliding_window = 5;
      config.sliding_layers.assign(2, true);
    }
    Accelerator acc(options("deepspeed/zero3.yaml"));
    at::manual_seed(5);
    std::shared_ptr<LlamaForCausalLM> model;
    {
      auto scope = acc.sharded_init();  // each layer sharded as it is built
      model = std::make_shared<LlamaForCausalLM>(config);
    }
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
    DataLoader<TokenWindows> loader(TokenWindows(16, 16, 61), {.batch_size = 4, .split_batches = true});
    auto opt = acc.prepare(model, adamw, loader);
    EXPECT_EQ(acc.engine()->units().size(), 3u);  // two layers and the root
    std::vector<double> losses;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (const Batch& b : loader) {  // 4 steps an epoch
        at::Tensor loss = causal_lm_loss(model->forward(b.data), b.target);
        acc.backward(loss);
        opt->step();
        opt->zero_grad();
        losses.push_back(acc.reduce(loss.detach(), "mean").item<double>());
      }
    EXPECT_LT(losses.back(), losses.front()) << name;
    const std::string dir = out + "/" + name;
    auto saved = save_pretrained(*acc.engine(), *model, dir, /*max_shard_size=*/20'000);
    EXPECT_GT(saved.files.size(), 1u);  // sharded, with an index
    at::Tensor tokens = rule_tokens(2, 12, 61, 12);
    tokens[1][5] = 0;  // and one that breaks the rule
    at::Tensor logits;
    {
      c10::NoGradGuard no_grad;
      logits = model->forward(tokens);
    }
    const std::string logits_file = out + "/" + name + ".accel.safetensors";
    if (acc.is_main_process()) checkpoint::write_safetensors(logits_file, {{"tokens", tokens}, {"logits", logits}});
    check_args += " '" + dir + "' '" + logits_file + "'";
    acc.end_training();
  }
  EXPECT_EQ(python_on_rank0("check" + check_args), 0) << "llama_interop.py check failed (its output is above)";
}

}  // namespace
}  // namespace accel::models
