// Example 4: a Llama model (src/models/llama.h, Transformers' LlamaForCausalLM in C++) trained with
// the Accelerator under any shipped config, and saved as a Transformers checkpoint directory that
// transformers.AutoModelForCausalLM.from_pretrained opens.
//   build/bin/llama_finetune --steps 20 --save /tmp/llama_out
//   accel launch -n 2 build/bin/llama_finetune --config_file configs/deepspeed/zero3.yaml --save /tmp/llama_out
//   accel launch -n 2 build/bin/llama_finetune --model /tmp/llama_out --steps 10   # fine-tune it further
// --model: a config.json (fresh weights of that shape), or a directory written by save_pretrained
// (Transformers' or --save's): its config.json, and its weights when the directory holds any.
// Without --model: a small built-in shape (GQA, untied head).
// --data DIR: the token files examples/prepare_tokens.py writes from local text (train.bin or .npy,
// val.*, meta.json): training windows of --seq tokens from train (packed, or one document per row with
// --documents), and with --eval_every N the mean loss over every val window each N steps and at the
// end ("eval loss"). Without --data the data is generated here: windows of arithmetic sequences
// t[i] = (start + stride * i) mod vocab, the stride (1..4) different per window, so the model has to
// read the stride off the context.
//   ~/.cache/accel/venv-torch-2.11.0/bin/python examples/prepare_tokens.py --out /tmp/tokens docs/*.md
//   accel launch -n 2 build/bin/llama_finetune --config_file configs/deepspeed/zero3.yaml --data /tmp/tokens
//       --steps 200 --eval_every 50 --save /tmp/llama_text      (one command, on two lines here)
// Layers are sharding units: with FSDP configs set fsdp_transformer_layer_cls_to_wrap to
// LlamaDecoderLayer (the shipped fsdp configs name the GPT example's BlockImpl, which leaves the whole
// model in the root unit).
#include "common/example_args.h"

#include "accelerator/accelerator.h"
#include "base/files.h"
#include "base/progress.h"
#include "data/token_windows.h"
#include "models/llama.h"
#include "models/pretrained.h"

#include <torch/data/datasets/base.h>
#include <torch/optim/adamw.h>

#include <nlohmann/json.hpp>

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

// The token files of prepare_tokens.py's directory.
struct TokenData {
  std::string train, val;
  data::TokenDtype dtype = data::TokenDtype::UInt16;
  std::int64_t vocab_size = 0, eos = -1, pad = 0;
};

TokenData read_token_dir(const std::string& dir) {
  const std::string meta_path = dir + "/meta.json";
  if (!files::is_file(meta_path))
    throw std::invalid_argument("--data " + dir +
                                ": no meta.json (write the directory with examples/prepare_tokens.py)");
  const auto meta = nlohmann::json::parse(files::read_file(meta_path));
  TokenData d;
  const std::string fmt = meta.value("format", "bin");
  d.train = dir + "/train." + fmt;
  d.val = dir + "/val." + fmt;
  d.dtype = data::parse_dtype(meta.at("dtype").get<std::string>());
  d.vocab_size = meta.at("vocab_size").get<std::int64_t>();
  d.eos = meta.at("eos_token_id").get<std::int64_t>();
  if (meta.contains("pad_token_id") && !meta["pad_token_id"].is_null())
    d.pad = meta["pad_token_id"].get<std::int64_t>();
  return d;
}

// The mean next-token loss over every row of `val` (targets of -100 left out). Each rank takes the
// same number of batches (a collective forward under ZeRO-3), rows past the end weighing nothing.
double eval_loss(Accelerator& acc, models::LlamaForCausalLM& model, data::TokenWindows& val, std::int64_t batch) {
  c10::NoGradGuard no_grad;
  const auto rows = static_cast<std::int64_t>(*val.size());
  const std::int64_t world = acc.num_processes(), per_rank = (rows + world - 1) / world;
  double sum = 0, count = 0;
  for (std::int64_t j = 0; j < per_rank; j += batch) {
    std::vector<at::Tensor> in, tg;
    for (std::int64_t k = j; k < std::min(j + batch, per_rank); ++k) {
      const std::int64_t row = acc.process_index() * per_rank + k;
      auto ex = val.get(static_cast<std::size_t>(row < rows ? row : 0));
      in.push_back(ex.data);
      tg.push_back(row < rows ? ex.target : at::full_like(ex.target, -100));
    }
    at::Tensor logits = model.forward(at::stack(in).to(acc.device()));
    at::Tensor target = at::stack(tg).to(acc.device()).reshape({-1});
    sum += at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), target, {}, at::Reduction::Sum,
                                  -100)
               .item<double>();
    count += target.ne(-100).sum().item<double>();
  }
  at::Tensor totals = acc.reduce(at::tensor({sum, count}, at::kDouble).to(acc.device()), "sum").cpu();
  return totals[0].item<double>() / totals[1].item<double>();
}

bool has_weights(const std::string& dir) {
  return files::is_dir(dir) &&
         (files::exists(dir + "/model.safetensors") || files::exists(dir + "/model.safetensors.index.json"));
}

// Training, evaluation and saving over either loader.
struct Run {
  Accelerator& acc;
  std::shared_ptr<models::LlamaForCausalLM>& model;
  torch::optim::Optimizer& adamw;  // (AdamW unless a DeepSpeed config's optimizer block names another)
  const ExampleArgs& args;
  const models::LlamaConfig& cfg;
  std::optional<data::TokenWindows>& val;
  std::int64_t eval_every, shard_bytes;
  const std::string &save_dir, &model_path;
  std::string tokenizer;  // --data's tokenizer.json, copied beside a --save

  template <class Dataset>
  int operator()(DataLoader<Dataset> loader) {
    auto opt = acc.prepare(model, adamw, loader);
    // A DeepSpeed config's scheduler block, "auto" total_num_steps from --steps (none: a constant rate).
    std::shared_ptr<AcceleratedScheduler> scheduler;
    if (acc.config().scheduler) scheduler = acc.create_scheduler({.total_num_steps = args.steps});
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
    if (eval_every > 0 && step == 0) evaluate(0);
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
        if (scheduler) scheduler->step();
        opt->zero_grad();
        if (!acc.sync_gradients()) continue;
        log.write(++step, window_loss);
        if (first_loss < 0) first_loss = window_loss;
        char post[32];
        std::snprintf(post, sizeof post, "loss %.4f", window_loss);
        bar.update(1, post);
        if (step < args.steps) window_loss = 0;
        maybe_checkpoint(acc, args);
        if (eval_every > 0 && (step % eval_every == 0 || step == args.steps)) evaluate(step);
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
      if (!tokenizer.empty() && files::is_file(tokenizer) && acc.is_main_process()) {
        const std::string text = files::read_file(tokenizer);  // so that Transformers can read the text too
        files::write_file_atomic(save_dir + "/tokenizer.json", text.data(), text.size());
        acc.print("llama_finetune: and the data's tokenizer.json");
      }
    }
    acc.end_training();
    return 0;
  }

  void evaluate(std::int64_t step) {
    if (!val) return;
    acc.print("llama_finetune: step ", step, " eval loss ", eval_loss(acc, *model, *val, args.batch), " over ",
              *val->size(), " held-out windows");
  }
};

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
  std::string data_dir;
  std::int64_t eval_every = 0;
  bool documents = false;
  app.add_option("--data", data_dir, "token files from examples/prepare_tokens.py (train/val, meta.json)");
  app.add_option("--eval_every", eval_every, "with --data: the val loss every N steps and at the end (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--documents", documents, "with --data: one document per row (padded), not packed windows");
  std::string attn_implementation = "auto";
  app.add_option("--attn_implementation", attn_implementation,
                 "eager (Transformers' written-out attention), sdpa (at::scaled_dot_product_attention) or auto "
                 "(sdpa on CUDA, eager on the CPU)")
      ->check(CLI::IsMember({"auto", "eager", "sdpa"}));
  CLI11_PARSE(app, argc, argv);
  try {
    models::LlamaConfig cfg;
    std::optional<TokenData> tokens;
    if (!data_dir.empty()) tokens = read_token_dir(data_dir);
    if (model_path.empty()) {
      cfg.vocab_size = tokens ? tokens->vocab_size : 128;
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
    cfg.attn_implementation = attn_implementation;
    if (tokens && tokens->vocab_size > cfg.vocab_size)
      throw std::invalid_argument("--data " + data_dir + ": a vocabulary of " + std::to_string(tokens->vocab_size) +
                                  " tokens, the model has " + std::to_string(cfg.vocab_size));
    if (seq > cfg.max_position_embeddings)
      throw std::invalid_argument("--seq " + std::to_string(seq) + " is past max_position_embeddings " +
                                  std::to_string(cfg.max_position_embeddings));
    const std::int64_t shard_bytes = parse_size(max_shard);

    Accelerator acc(accelerator_options(args));
    check_project_dir(args, acc.project_dir());
    at::manual_seed(static_cast<std::int64_t>(args.seed));
    std::shared_ptr<models::LlamaForCausalLM> model;
    {
      auto scope = acc.sharded_init();  // each decoder layer sharded as it is built (in host memory)
      model = std::make_shared<models::LlamaForCausalLM>(cfg);
    }
    auto adamw = acc.create_optimizer(model->parameters(), {.lr = lr, .weight_decay = 0.01});
    const DataLoaderOptions loader_options{
        .batch_size = args.batch, .shuffle = true, .split_batches = true, .seed = args.seed};
    std::optional<data::TokenWindows> val;
    auto windows = [&](const std::string& file) {
      data::TokenWindowsOptions o;
      o.seq_len = seq;
      o.pad_token_id = tokens->pad;
      if (documents) o.eos_token_id = tokens->eos;
      return data::TokenWindows(data::TokenFile::open(file, tokens->dtype), o);
    };
    if (tokens) {
      acc.print("llama_finetune: token files ", tokens->train, " and ", tokens->val, ", vocabulary ",
                tokens->vocab_size);
      if (files::is_file(tokens->val)) val = windows(tokens->val);
    }
    Run run{acc,
            model,
            *adamw,
            args,
            cfg,
            val,
            eval_every,
            shard_bytes,
            save_dir,
            model_path,
            tokens ? data_dir + "/tokenizer.json" : std::string()};
    if (tokens) return run(DataLoader<data::TokenWindows>(windows(tokens->train), loader_options));
    return run(
        DataLoader<ArithmeticSequences>(ArithmeticSequences(4096, seq, cfg.vocab_size, args.seed + 1), loader_options));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_finetune: error: %s\n", e.what());
    return 1;
  }
}
