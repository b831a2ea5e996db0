// Greedy generation with the KV cache from a dispatched Llama (layers paged from disk) against the
// same checkpoint fully loaded: the same tokens, the same logits (bound 1e-5; bitwise in practice).
// The tiny random Llama is made and saved here (config.json + sharded safetensors).
#include "base/files.h"
#include "checkpoint/safetensors.h"
#include "dispatch/dispatch.h"
#include "dispatch/stack_model.h"
#include "models/llama.h"

#include <gtest/gtest.h>

namespace accel::test {
namespace {

models::LlamaConfig tiny_llama(bool tied) {
  models::LlamaConfig c;
  c.vocab_size = 97, c.hidden_size = 32, c.intermediate_size = 48, c.num_hidden_layers = 5;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.2;  // large enough that greedy decoding does not settle on one token
  return c;
}

struct Generation {
  std::vector<std::int64_t> tokens;
  std::vector<at::Tensor> logits;  // the last position's, per step
};

Generation greedy(models::LlamaForCausalLM& model, const std::vector<std::int64_t>& prompt, int steps) {
  c10::NoGradGuard ng;
  models::KVCache cache = model.make_cache();
  Generation g;
  at::Tensor out = model.forward(at::tensor(prompt, at::kLong).view({1, -1}), &cache);
  for (int i = 0; i < steps; ++i) {
    at::Tensor last = out.select(1, out.size(1) - 1).select(0, 0).clone();
    g.logits.push_back(last);
    g.tokens.push_back(last.argmax().item<std::int64_t>());
    out = model.forward(at::full({1, 1}, g.tokens.back(), at::kLong), &cache);
  }
  return g;
}

void save_llama(models::LlamaForCausalLM& model, const std::string& dir) {
  write_sharded_checkpoint(dir, named_weights(model), 2);
  const std::string config = model.config.to_json();
  files::write_file_atomic(dir + "/config.json", config.data(), config.size());
}

class DispatchGenerate : public ::testing::TestWithParam<bool> {};

TEST_P(DispatchGenerate, DiskLayersGiveTheFullModelsTokensAndLogits) {
  const bool tied = GetParam();
  const std::string dir = fresh_dir(tied ? "llama_tied" : "llama");
  at::manual_seed(42);
  models::LlamaForCausalLM full(tiny_llama(tied));
  save_llama(full, dir + "/ckpt");
  const std::vector<std::int64_t> prompt{3, 14, 15, 92, 65, 35, 89};
  const Generation want = greedy(full, prompt, 12);
  std::set<std::int64_t> distinct(want.tokens.begin(), want.tokens.end());
  EXPECT_GE(distinct.size(), 3u) << "a degenerate reference would prove little";

  // Built both ways empty: on the meta device, and on the cpu under init_empty_weights; disk layers
  // computed on an aligned copy (bitwise) and straight from the mapping (within the bound).
  for (bool meta : {true, false}) {
    const bool copy = meta;
    const models::LlamaConfig config = models::LlamaConfig::from_file(dir + "/ckpt");
    std::shared_ptr<models::LlamaForCausalLM> model;
    if (meta)
      model = std::make_shared<models::LlamaForCausalLM>(config, at::TensorOptions().device(at::kMeta));
    else
      model = make_empty<models::LlamaForCausalLM>(config);
    const ModelPlan plan = plan_model(*model);
    ASSERT_EQ(plan.groups.size(), 5u);  // the decoder layers
    DispatchOptions o;
    o.max_memory = {{"cpu", plan.rest_bytes + 3 * plan.largest_group_bytes}};
    o.offload_folder = dir + "/offload";
    o.no_split = {"LlamaDecoderLayer"};
    o.copy_disk_weights = copy;
    DispatchResult r = load_checkpoint_and_dispatch(model, dir + "/ckpt", o);
    EXPECT_EQ(r.disk_units, 3) << to_string(r.device_map, model.get());
    EXPECT_EQ(r.device_map.at("model.layers.1"), "cpu");
    EXPECT_EQ(r.device_map.at("model.layers.2"), "disk");
    const auto before = paging_stats();
    const Generation got = greedy(*model, prompt, 12);
    EXPECT_EQ(paging_stats().page_ins - before.page_ins, 3 * 13);  // 3 layers, prefill + 12 steps
    EXPECT_EQ(got.tokens, want.tokens) << (meta ? "meta" : "init_empty_weights");
    double worst = 0;
    for (std::size_t i = 0; i < want.logits.size(); ++i)
      worst = std::max(worst, (got.logits[i] - want.logits[i]).abs().max().item<double>());
    EXPECT_LE(worst, 1e-5) << (meta ? "meta" : "init_empty_weights");
    if (copy) EXPECT_EQ(worst, 0.0) << "an aligned copy computes exactly as the model in memory";
    std::printf("%s, %s head, %s: %zu tokens equal, max |logit difference| %g\n", meta ? "meta" : "init_empty_weights",
                tied ? "tied" : "untied", copy ? "aligned copy" : "from the mapping", got.tokens.size(), worst);
  }
  files::remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(Heads, DispatchGenerate, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("Tied") : std::string("Untied"); });

}  // namespace
}  // namespace accel::test
