// Example 3: a small CNN on generated 16x16 images of four shapes; its two conv blocks are sharding
// units. Accuracy on a held-out split through gather_for_metrics.
//   build/bin/accel launch -n 2 build/bin/image_classifier --config_file configs/deepspeed/zero3.yaml
#include "common/datasets.h"
#include "common/evaluate.h"
#include "common/example_args.h"

#include "accelerator/accelerator.h"
#include "base/progress.h"
#include "sharding/unit.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <exception>

using namespace accel;
using namespace accel::examples;

struct ConvBlockImpl : torch::nn::Module {
  ConvBlockImpl(std::int64_t in, std::int64_t out)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)))) {}
  at::Tensor forward(const at::Tensor& x) { return at::max_pool2d(at::relu(conv(x)), {2, 2}); }
  torch::nn::Conv2d conv;
};

struct CNNImpl : torch::nn::Module {
  explicit CNNImpl(std::int64_t side) {
    blocks.push_back(accel::unit(register_module("block0", std::make_shared<ConvBlockImpl>(1, 8))));
    blocks.push_back(accel::unit(register_module("block1", std::make_shared<ConvBlockImpl>(8, 16))));
    head = register_module("head", torch::nn::Linear(16 * (side / 4) * (side / 4), ShapesData::kClasses));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return head(x.flatten(1));
  }
  std::vector<accel::Unit<ConvBlockImpl>> blocks;
  torch::nn::Linear head{nullptr};
};

int main(int argc, char** argv) {
  CLI::App app{"CNN image classifier on generated shapes"};
  ExampleArgs args;
  args.steps = 40;
  args.batch = 32;
  add_common_options(app, args);
  std::int64_t eval_size = 300;
  app.add_option("--eval_size", eval_size, "held-out images");
  CLI11_PARSE(app, argc, argv);
  try {
    Accelerator acc(accelerator_options(args));
    check_project_dir(args, acc.project_dir());
    const std::int64_t side = 16;
    ShapesData train(2048, side, args.seed), eval(eval_size, side, args.seed + 1);
    at::manual_seed(static_cast<std::int64_t>(args.seed));
    std::shared_ptr<CNNImpl> model;
    {
      auto scope = acc.sharded_init();  // sharded construction: each conv block sharded as built
      model = std::make_shared<CNNImpl>(side);
    }
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(3e-3));
    DataLoader<ShapesData> loader(
        train, {.batch_size = args.batch, .shuffle = true, .split_batches = true, .seed = args.seed});
    DataLoader<ShapesData> eval_loader(eval, {.batch_size = 50});
    auto opt = acc.prepare(model, adam, loader);
    acc.prepare_data_loader(eval_loader);
    maybe_resume(acc, args);  // (--resume_from_checkpoint: the loaders go on from there)

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
        opt->step();
        opt->zero_grad();
        if (!acc.sync_gradients()) continue;
        log.write(++step, window_loss);
        char post[32];
        std::snprintf(post, sizeof post, "loss %.4f", window_loss);
        bar.update(1, post);
        window_loss = 0;
        maybe_checkpoint(acc, args);
        if (step == args.steps) break;
      }
    }
    bar.close();
    maybe_save_final(acc, model, args);

    const double acc_eval = accuracy(acc, model, eval_loader);
    acc.print("image_classifier: accuracy ", acc_eval, " on ", eval_size, " held-out images");
    acc.end_training();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "image_classifier: error: %s\n", e.what());
    return 1;
  }
}
