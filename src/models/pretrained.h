// Transformers checkpoint directories for LlamaForCausalLM (models/llama.h), both ways:
//
//   dir/config.json                 LlamaConfig::to_json (model_type "llama")
//   dir/generation_config.json      bos/eos/pad token ids
//   dir/model.safetensors           or model-0000k-of-0000n.safetensors + model.safetensors.index.json
//
// save_pretrained writes what transformers.AutoModelForCausalLM.from_pretrained(dir) opens;
// load_pretrained reads what Transformers' save_pretrained writes (sharded or not) into a prepared
// model under any strategy, each rank reading only its own shards. Both are collective over the
// engine's world (checkpoint/model_export.h: save_model / load_model do the weights).
//
// Tied heads: Transformers 5 omits lm_head.weight from a tied model's files, and this model has no
// lm_head parameter when tied, so the names agree both ways. A tied checkpoint that does carry an
// lm_head.weight is refused by load_model (the tensor is not one of the model's).
#pragma once

#include "checkpoint/model_export.h"
#include "models/llama.h"

#include <cstdint>
#include <string>

namespace accel::zero {
class Engine;
}

namespace accel::models {

// Collective. save_model(engine, model, dir, max_shard_size, options), then rank 0 writes
// config.json (dtype: the saved weights' dtype) and generation_config.json.
checkpoint::SaveModelResult save_pretrained(zero::Engine& engine, LlamaForCausalLM& model, const std::string& dir,
                                            std::int64_t max_shard_size = checkpoint::kDefaultMaxShardSize,
                                            const checkpoint::SaveModelOptions& options = {});

// Collective. Reads dir/config.json, checks that it describes `model` (the same sizes and flags:
// LlamaConfigError naming the key and both values otherwise), then load_model(engine, model, dir).
checkpoint::LoadModelResult load_pretrained(zero::Engine& engine, LlamaForCausalLM& model, const std::string& dir);

// Throws LlamaConfigError naming the first key where `found` (from `source`) differs from `expected`
// in a way that changes the weights or the math (sizes, heads, eps, rope_theta, tie).
void check_same_architecture(const LlamaConfig& expected, const LlamaConfig& found, const std::string& source);

}  // namespace accel::models
