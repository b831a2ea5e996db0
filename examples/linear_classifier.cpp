// Example 1: a linear classifier (10 features, 5 classes) with AdamW, a cosine LR schedule with
// warmup, gradient clipping, and accuracy on a held-out split counted through gather_for_metrics
// (every eval sample exactly once, whatever the world size). Progress bar on the main process only.
//   build/bin/accel launch -n 2 build/bin/linear_classifier --config_file configs/ddp.yaml
#include "common/datasets.h"
#include "common/evaluate.h"
#include "common/example_args.h"

#include "accelerator/accelerator.h"
#include "accelerator/lr_schedule.h"
#include "base/progress.h"

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <exception>

using namespace accel;
using namespace accel::examples;

int main(int argc, char** argv) {
  CLI::App app{"Linear classifier on generated data"};
  ExampleArgs args;
  args.steps = 60;
  args.batch = 32;
  add_common_options(app, args);
  std::int64_t eval_size = 500;
  app.add_option("--eval_size", eval_size, "held-out samples");
  CLI11_PARSE(app, argc, argv);
  try {
    Accelerator acc(accelerator_options(args));
    check_project_dir(args, acc.project_dir());
    ClassificationData train(4096, 10, 5, args.seed, 0), eval(eval_size, 10, 5, args.seed, 1);
    at::manual_seed(static_cast<std::int64_t>(args.seed));
    torch::nn::Linear model(10, 5);
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(5e-2).weight_decay(0.01));
    DataLoader<ClassificationData> loader(
        train, {.batch_size = args.batch, .shuffle = true, .split_batches = true, .seed = args.seed});
    DataLoader<ClassificationData> eval_loader(eval, {.batch_size = 64});
    auto [opt, scheduler] = acc.prepare(model, adamw, loader, [&](torch::optim::Optimizer& o) {
      return std::make_shared<CosineSchedule>(o, args.steps, args.steps / 10);
    });
    acc.prepare_data_loader(eval_loader);
    maybe_resume(acc, args);  // (--resume_from_checkpoint: the loaders and the schedule go on from there)

    LossLog log(acc, args.log_file);
    ProgressBar bar(args.steps - acc.step(), "train", acc.is_local_main_process());
    std::int64_t step = acc.step();
    double window_loss = 0;
    while (step < args.steps) {
      for (const Batch& b : loader) {
        auto scope = acc.accumulate(model);
        at::Tensor loss;
        {
          auto autocast = acc.autocast();  // bf16/fp16 compute under mixed precision; a no-op in fp32
          loss = at::cross_entropy_loss(model->forward(b.data).to(at::kFloat), b.target);
        }
        acc.backward(loss);
        window_loss += acc.reduce(loss.detach(), "mean").item<double>() / acc.gradient_accumulation_steps();
        if (acc.sync_gradients()) acc.clip_grad_norm_(1.0);
        opt->step();
        scheduler->step();
        opt->zero_grad();
        if (!acc.sync_gradients()) continue;
        log.write(++step, window_loss);
        char post[48];
        std::snprintf(post, sizeof post, "loss %.4f lr %.2e", window_loss, opt->param_groups()[0].options().get_lr());
        bar.update(1, post);
        window_loss = 0;
        maybe_checkpoint(acc, args);
        if (step == args.steps) break;
      }
    }
    bar.close();
    maybe_save_final(acc, model, args);

    const double acc_eval = accuracy(acc, model, eval_loader);
    acc.print("linear_classifier: accuracy ", acc_eval, " on ", eval_size, " held-out samples");
    acc.end_training();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "linear_classifier: error: %s\n", e.what());
    return 1;
  }
}
