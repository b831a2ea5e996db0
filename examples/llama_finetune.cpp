// Example 4: a Llama model (src/models/llama.h, Transformers' LlamaForCausalLM in C++) trained with
// the Accelerator under any shipped config, and saved as a Transformers checkpoint directory that
// transformers.AutoModelForCausalLM.from_pretrained opens.
//   build/bin/llama_finetune --steps 20 --save /tmp/llama_out
//   accel launch -n 2 build/bin/llama_finetune --config_file configs/deepspeed/zero3.yaml --save /tmp/llama_out
//   accel launch -n 2 build/bin/llama_finetune --model /tmp/llama_out --steps 10   # fine-tune it further
// --model: a config.json (fresh weights of that shape), or a directory written by save_pretrained
// (Transformers' or --save's): its config.json, and its weights when the directory holds any.
// Without --model: a small built-in shape (GQA, untied head). The data is generated here: windows of
// arithmetic sequences t[i] = (start + stride * i) mod vocab, the stride (1..4) different per window,
// so the model has to read the stride off the context.
// Layers are sharding units: with FSDP configs set fsdp_transformer_layer_cls_to_wrap to
// LlamaDecoderLayer (the shipped fsdp configs name the GPT example's BlockImpl, which leaves the whole
// model in the root unit).
#include "common/example_args.h"

#include "accelerator/accelerator.h"
#include "base/files.h"
#include "base/progress.h"
#include "models/llama.h"
#include "models/pretrained.h"

#include <torch/data/datasets/base.h>
#include <torch/optim/adamw.h>

#include <cctype>
#include <cstdio>
#include <exception>
#include <random>

using namespace accel;
using namespace accel::examples;

namespace {

class ArithmeticSequences : public torch::data::datasets::Dataset<ArithmeticSequences> {
 public:
  ArithmeticSequences(std::int64_t n, std::int64_t seq, std::int64_t vocab, std::uint64_t seed)
      : tokens_(at::empty({n, seq + 1}, at::kLong)) {
    std::mt19937_64 rng(seed);
    auto t = tokens_.accessor<std::int64_t, 2>();
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t start = static_cast<std::int64_t>(rng() % vocab),
                         stride = 1 + static_cast<std::int64_t>(rng() % 4);
      for (std::int64_t i = 0; i <= seq; ++i) t[r][i] = (start + stride * i) % vocab;
    }
  }
  torch::data::Example<> get(std::size_t i) override {
    at::Tensor row = tokens_[static_cast<std::int64_t>(i)];
    return {row.narrow(0, 0, row.size(0) - 1), row.narrow(0, 1, row.size(0) - 1)};
  }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(tokens_.size(0)); }

 private:
  at::Tensor tokens_;
};

// "10GB", "500MB", "64KB" (decimal, as Transformers' max_shard_size) or plain bytes.
std::int64_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  const double v = std::stod(s, &pos);
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else if (!unit.empty() && unit != "B")
    throw std::invalid_argument("--max_shard_size: unknown unit in '" + s + "'");
  return static_cast<std::int64_t>(v * mult);
}

bool has_weights(const std::string& dir) {
  return files::is_dir(dir) &&
         (files::exists(dir + "/model.safetensors") || files::exists(dir + "/model.safetensors.index.json"));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Llama (Transformers' LlamaForCausalLM) trained on generated sequences, saved for Transformers"};
  ExampleArgs args;
  args.steps = 30;
  args.batch = 8;
  add_common_options(app, args);
  std::string model_path, save_dir, max_shard = "10GB";
  std::int64_t seq = 32;
  double lr = 3e-3;
  app.add_option("--model", model_path, "config.json, or a save_pretrained directory (weights loaded if present)");
  app.add_option("--seq", seq, "tokens per training window")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--save", save_dir, "write a Transformers checkpoint directory here once training ends");
  app.add_option("--max_shard_size", max_shard, "with --save: largest safetensors file (\"10GB\", \"64KB\", bytes)");
  CLI11_PARSE(app, argc, argv);
  try {
    models::LlamaConfig cfg;
    if (model_path.empty()) {
      cfg.vocab_size = 128;
      cfg.hidden_size = 64;
      cfg.intermediate_size = 176;
      cfg.num_hidden_layers = 2;
      cfg.num_attention_heads = 4;
      cfg.num_key_value_heads = 2;
      cfg.max_position_embeddings = 256;
      cfg.rms_norm_eps = 1e-5;
      cfg.bos_token_id = 1;
      cfg.eos_token_id = {2};
    } else {
      cfg = models::LlamaConfig::from_file(model_path);
    }
    if (seq > cfg.max_position_embeddings)
      throw std::invalid_argument("--seq " + std::to_string(seq) + " is past max_position_embeddings " +
                                  std::to_string(cfg.max_position_embeddings));
    const std::int64_t shard_bytes = parse_size(max_shard);

    Accelerator acc(accelerator_options(args));
    at::manual_seed(static_cast<std::int64_t>(args.seed));
    std::shared_ptr<models::LlamaForCausalLM> model;
    if (acc.device().is_cpu()) {
      auto scope = acc.sharded_init();  // each decoder layer sharded as it is built
      model = std::make_shared<models::LlamaForCausalLM>(cfg);
    } else {
      model = std::make_shared<models::LlamaForCausalLM>(cfg);
    }
    ArithmeticSequences data(4096, seq, cfg.vocab_size, args.seed + 1);
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
    DataLoader<ArithmeticSequences> loader(
        data, {.batch_size = args.batch, .shuffle = true, .split_batches = true, .seed = args.seed});
    auto opt = acc.prepare(model, adamw, loader);
    if (has_weights(model_path)) {
      auto loaded = models::load_pretrained(*acc.engine(), *model, model_path);
      acc.print("llama_finetune: loaded ", loaded.tensors, " tensors from ", model_path);
    }
    std::int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    acc.print("llama_finetune: ", acc.num_processes(), " process(es), ", strategy_name(acc.config()), ", ", params,
              " parameters, ", cfg.num_hidden_layers, " layers, ", cfg.num_attention_heads, "/", cfg.kv_heads(),
              " heads (q/kv), ", cfg.tie_word_embeddings ? "tied" : "untied", " head, ", acc.engine()->units().size(),
              " units");
    maybe_resume(acc, args);

    LossLog log(acc, args.log_file);
    ProgressBar bar(args.steps - acc.step(), "train", acc.is_local_main_process());
    std::int64_t step = acc.step();
    double window_loss = 0, first_loss = -1;
    while (step < args.steps) {
      for (const Batch& b : loader) {
        auto scope = acc.accumulate(model);
        at::Tensor loss;
        {
          auto autocast = acc.autocast();
          loss = models::causal_lm_loss(model->forward(b.data), b.target);
        }
        acc.backward(loss);
        window_loss += acc.reduce(loss.detach(), "mean").item<double>() / acc.gradient_accumulation_steps();
        if (acc.sync_gradients()) acc.clip_grad_norm_(1.0);
        opt->step();
        opt->zero_grad();
        if (!acc.sync_gradients()) continue;
        log.write(++step, window_loss);
        if (first_loss < 0) first_loss = window_loss;
        char post[32];
        std::snprintf(post, sizeof post, "loss %.4f", window_loss);
        bar.update(1, post);
        if (step < args.steps) window_loss = 0;
        maybe_checkpoint(acc, args);
        if (step == args.steps) break;
      }
    }
    bar.close();
    if (first_loss >= 0) acc.print("llama_finetune: loss ", first_loss, " -> ", window_loss, " over ", step, " steps");
    maybe_save_final(acc, model, args);
    if (!save_dir.empty()) {
      auto saved = models::save_pretrained(*acc.engine(), *model, save_dir, shard_bytes);
      acc.print("llama_finetune: saved ", saved.files.size(), " safetensors file(s), ", saved.total_bytes,
                " bytes, config.json and generation_config.json to ", save_dir);
    }
    acc.end_training();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_finetune: error: %s\n", e.what());
    return 1;
  }
}
