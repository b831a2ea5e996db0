// Example 2: a GPT language model on a generated character corpus, its blocks marked as sharding
// units (accel::unit), so FULL_SHARD / ZeRO-3 keeps one block's parameters gathered at a time.
// The loop has no strategy in it: the config file chooses DDP, ZeRO-1/2/3 or FSDP.
//   build/bin/accel launch -n 2 build/bin/gpt_lm --config_file configs/fsdp/full_shard.yaml
//   build/bin/accel launch -n 2 build/bin/gpt_lm --config_file configs/deepspeed/zero3.json
//       --d_model 1024 --layers 12 --heads 16                    (one command, on one line)
// The model is built through sharded construction (Accelerator::sharded_init, in host memory on a
// device too): each block is sharded as soon as it is built, so no rank ever holds the whole model and
// one that fits only sharded can be built.
// --comm_stats FILE: after training, the main process writes each rank's communication counters
// there (common/comm_stats.h), with the model's sizes; the multi-node test checks them.
// --float64: parameters, compute and loss in float64, for comparisons that must not drown in fp32
// rounding (tests/cli/multinode_shrink.sh: a job shrunk from 4 ranks to 2 against 4 uninterrupted).
// Trackers (README, "Trackers"): --log_with tensorboard,jsonl,csv --project_dir DIR writes the step
// metrics (Accelerator::step_metrics: loss, lr, grad norm, step time, samples/s, tokens/s, bytes per
// step per group, peak memory per rank) to DIR/gpt_lm/ every step; --histogram_every N adds histograms
// of the weights every N steps.
// --warmup_steps N: the learning rate rises linearly from 0 over the first N optimizer steps, then stays
// at --lr (a large model's first full-rate AdamW steps can throw its loss far up: at d 4096 the loss
// went from 3.9 to 25 in one step on an H200).
#include "common/comm_stats.h"
#include "common/datasets.h"
#include "common/example_args.h"
#include "models/gpt.h"

#include "accelerator/accelerator.h"
#include "accelerator/lr_schedule.h"
#include "base/check_args.h"
#include "base/memory.h"
#include "base/progress.h"

#include <torch/optim/adamw.h>

#include <cstdio>
#include <exception>
#include <stdexcept>

using namespace accel;
using namespace accel::examples;

namespace {
// The progress bar's text: loss, learning rate, tokens per second (once a step time is known).
std::string progress_text(const tracking::Values& metrics) {
  auto get = [&](const char* name) {
    for (const auto& [k, v] : metrics)
      if (k == name) return v.number();
    return -1.0;
  };
  char post[96];
  const double tok = get("tokens_per_s");
  std::snprintf(post, sizeof post, "loss %.4f lr %.2g%s", get("loss"), get("lr"),
                tok > 0 ? (" " + std::to_string(static_cast<long long>(tok)) + " tok/s").c_str() : "");
  return post;
}
}  // namespace

int main(int argc, char** argv) {
  check_args::started(argc, argv);
  CLI::App app{"GPT language model on a generated corpus"};
  ExampleArgs args;
  args.steps = 40;
  add_common_options(app, args);
  std::int64_t layers = 2, d_model = 32, seq = 32, heads = 4, corpus_chars = 40000;
  std::string comm_stats, log_with;
  std::int64_t histogram_every = 0;
  bool float64 = false;
  double dropout = 0, lr = 3e-3, max_grad_norm = 1.0;
  std::int64_t warmup_steps = 0;
  app.add_option("--layers", layers, "transformer blocks");
  app.add_option("--d_model", d_model, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "attention heads (must divide --d_model)")->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "sequence length (characters per window)")->check(CLI::PositiveNumber);
  app.add_option("--corpus_chars", corpus_chars,
                 "characters of generated text (windows of --seq; steps past them start another epoch)")
      ->check(CLI::PositiveNumber);
  app.add_option("--comm_stats", comm_stats, "write every rank's communication counters here (main process)");
  app.add_option("--log_with", log_with,
                 "trackers, e.g. tensorboard,jsonl,csv or all (files under PROJECT_DIR/gpt_lm)");
  app.add_option("--histogram_every", histogram_every, "with --log_with: weight histograms every N steps (0: none)")
      ->check(CLI::NonNegativeNumber);
  std::string attention = "auto";
  app.add_option(
         "--attention", attention,
         "eager (written out), sdpa (at::scaled_dot_product_attention) or auto (sdpa on CUDA, eager on the CPU)")
      ->check(CLI::IsMember({"auto", "eager", "sdpa"}));
  app.add_option("--dropout", dropout, "residual dropout in each block while training (0: none)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--lr", lr, "AdamW's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--warmup_steps", warmup_steps,
                 "raise the learning rate linearly from 0 over this many optimizer steps, then keep --lr (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_grad_norm", max_grad_norm,
                 "clip the gradients to this global norm before each step (0: none; a DeepSpeed config's "
                 "gradient_clipping, where set, clips instead, as in Accelerate)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--float64", float64,
               "parameters, compute and loss in float64 (for exact comparisons; not with mixed precision)");
  CLI11_PARSE(app, argc, argv);
  if (d_model % heads != 0) {
    std::fprintf(stderr, "gpt_lm: error: --heads %lld does not divide --d_model %lld\n", static_cast<long long>(heads),
                 static_cast<long long>(d_model));
    return 2;
  }
  try {
    AcceleratorOptions options = accelerator_options(args);
    for (const auto& name : tracking::split_names(log_with)) options.log_with.emplace_back(name);
    if (check_args::active()) {  // (the config file and trackers, read as the Accelerator will, before any rank exists)
      const AcceleratorConfig cfg = resolve_config(options);
      resolve_log_with(options, cfg);
      check_project_dir(args, resolve_project_dir(options, cfg));
      if (float64 && cfg.mixed_precision != MixedPrecision::No)
        throw std::invalid_argument("--float64 trains without mixed precision (mixed_precision: no)");
      check_args::stop_here("gpt_lm");
    }
    // Peak memory by category per rank (step_metrics) needs the counting allocator from the start.
    if (!log_with.empty()) memory::install_counting_allocator();
    Accelerator acc(options);
    check_project_dir(args, acc.project_dir());
    const bool trackers_on = !acc.config().log_with.empty() || !options.log_with.empty();
    CharCorpus corpus(corpus_chars, seq, args.seed);
    at::manual_seed(static_cast<std::int64_t>(args.seed));
    // mixed_precision fp8: the blocks' linear layers are Float8Linear (fp8 matmuls); the rest runs in bf16.
    const bool fp8 = acc.mixed_precision() == MixedPrecision::Fp8;
    const GPTConfig shape{
        corpus.vocab_size(), d_model, heads, layers, seq, fp8, dropout, attention_from_string(attention)};
    if (float64) {
      if (acc.mixed_precision() != MixedPrecision::No)
        throw std::invalid_argument("--float64 trains without mixed precision (mixed_precision: no)");
      at::set_default_dtype(caffe2::TypeMeta::Make<double>());  // the model's parameters are built in float64
    }
    std::shared_ptr<GPTImpl> model;
    {
      auto scope = acc.sharded_init();  // each block sharded as built (in host memory, on a device too)
      model = std::make_shared<GPTImpl>(shape);
    }
    {
      c10::NoGradGuard no_grad;  // small embeddings (GPT-2's 0.02): the tied head starts near uniform
      model->tok->weight.normal_(0.0, 0.02);
    }
    // AdamW (lr, weight decay 0.01), unless a DeepSpeed config's optimizer block names another.
    auto adamw = acc.create_optimizer(model->parameters(), {.lr = lr, .weight_decay = 0.01});
    DataLoader<CharCorpus> loader(
        corpus, {.batch_size = args.batch, .shuffle = true, .split_batches = true, .seed = args.seed});
    std::shared_ptr<AcceleratedOptimizer> opt;
    std::shared_ptr<AcceleratedScheduler> scheduler;
    if (acc.config().scheduler) {  // the config's schedule, "auto" from --steps and --warmup_steps
      opt = acc.prepare(model, *adamw, loader);
      scheduler = acc.create_scheduler({.total_num_steps = args.steps, .warmup_num_steps = warmup_steps});
    } else if (warmup_steps > 0) {
      // (CosineSchedule with min_lr_ratio 1: the warmup, then no decay)
      const std::int64_t total = std::max<std::int64_t>(args.steps, warmup_steps);
      auto prepared = acc.prepare(model, *adamw, loader, [&](torch::optim::Optimizer& o) {
        return std::make_shared<CosineSchedule>(o, total, warmup_steps, /*min_lr_ratio=*/1.0);
      });
      opt = prepared.optimizer;
      scheduler = prepared.scheduler;
    } else {
      opt = acc.prepare(model, *adamw, loader);
    }
    acc.print("gpt_lm: ", acc.num_processes(), " process(es) on ", acc.device().type() == c10::kCUDA ? "cuda" : "cpu",
              ", ", strategy_name(acc.config()), ", ", corpus.vocab_size(), " tokens, ", loader.dataset_size(),
              " windows, ", acc.engine()->units().size(), " units");

    maybe_resume(acc, args);
    if (trackers_on)
      acc.init_trackers("gpt_lm", {{"layers", layers},
                                   {"d_model", d_model},
                                   {"heads", heads},
                                   {"seq", seq},
                                   {"steps", args.steps},
                                   {"batch", args.batch},
                                   {"seed", static_cast<std::int64_t>(args.seed)},
                                   {"processes", acc.num_processes()},
                                   {"strategy", to_string(acc.config().spec.strategy)},
                                   {"mixed_precision", to_string(acc.mixed_precision())}});

    LossLog log(acc, args.log_file);
    ProgressBar bar(args.steps - acc.step(), "train", acc.is_local_main_process());
    std::int64_t step = acc.step();
    double window_loss = 0;
    std::int64_t skipped = 0;  // fp16: steps skipped on a gradient overflow
    while (step < args.steps) {
      for (const Batch& b : loader) {
        auto scope = acc.accumulate(model);
        at::Tensor loss;
        {
          auto autocast = acc.autocast();                    // bf16/fp16 compute under mixed precision; a no-op in fp32
          loss = lm_loss(model->forward(b.data), b.target);  // (in fp32 from the logits' dtype; fp64 in fp64)
        }
        acc.backward(loss);
        window_loss += acc.reduce(loss.detach(), "mean").item<double>() / acc.gradient_accumulation_steps();
        if (acc.sync_gradients() && max_grad_norm > 0) acc.clip_grad_norm_(max_grad_norm);
        opt->step();
        if (scheduler) scheduler->step();
        opt->zero_grad();
        if (!acc.sync_gradients()) continue;
        skipped += acc.optimizer_step_was_skipped() ? 1 : 0;
        log.write(++step, window_loss);
        Accelerator::StepMetricsOptions mo;
        mo.loss = window_loss;
        mo.tokens_per_sample = seq;
        mo.per_rank_memory = trackers_on;  // a small all-gather per step: only when it is written
        const tracking::Values metrics = acc.step_metrics(mo);
        if (trackers_on) acc.log(metrics, step);
        if (trackers_on && histogram_every > 0 && step % histogram_every == 0)
          for (const auto& [name, weight] : acc.get_state_dict())  // collective; main process only gets them
            acc.log_histogram("weights/" + name, weight, step);
        bar.update(1, progress_text(metrics));
        window_loss = 0;
        maybe_checkpoint(acc, args);
        if (step == args.steps) break;
      }
    }
    bar.close();
    if (auto scale = acc.loss_scale())
      acc.print("fp16: loss scale ", *scale, ", ", skipped, " of ", step, " steps skipped (overflow)");
    if (fp8 && acc.device().is_cuda())  // (0: the device or the shapes had every fp8 product emulated)
      acc.print("fp8: ", accel::mixed_precision::float8_scaled_mm_products(),
                " products through at::_scaled_mm on the main process");
    maybe_save_final(acc, model, args);
    if (!comm_stats.empty()) {
      std::int64_t params = 0;
      for (const auto& p : model->parameters()) params += p.numel();
      write_comm_stats(acc, comm_stats,
                       {{"vocab", corpus.vocab_size()},
                        {"d_model", d_model},
                        {"heads", heads},
                        {"layers", layers},
                        {"seq", seq},
                        {"params", params},
                        {"steps", args.steps},
                        {"accumulation", acc.gradient_accumulation_steps()}});
    }
    acc.end_training();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_lm: error: %s\n", e.what());
    return 1;
  }
}
