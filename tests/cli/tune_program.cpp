// A small training loop through accel::Accelerator for `accel tune`'s tests: an MLP on random rows,
// --steps optimizer steps of --batch rows (split across the ranks). --oom_above N: a micro batch over N
// rows per rank asks the CPU allocator for more memory than any machine has, which it refuses, so
// the run dies of an out-of-memory error as a micro batch too large for the machine would.
#include "accelerator/accelerator.h"
#include "accelerator/rows.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  CLI::App app{"tune_program: an MLP trained through the Accelerator (accel tune's tests)"};
  int batch = 8, steps = 1000, width = 64, oom_above = 0;
  app.add_option("--batch", batch, "rows per step, all ranks together");
  app.add_option("--steps", steps, "optimizer steps");
  app.add_option("--width", width, "hidden width");
  app.add_option("--oom_above", oom_above, "a micro batch over this many rows per rank runs out of memory (0: never)");
  CLI11_PARSE(app, argc, argv);
  try {
    accel::Accelerator acc;
    at::manual_seed(0);
    auto model = std::make_shared<torch::nn::SequentialImpl>(
        torch::nn::Linear(16, width), torch::nn::Linear(width, width), torch::nn::Linear(width, 1));
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
    accel::DataLoader<accel::test::Rows> loader(accel::test::Rows(at::randn({4096, 16}), at::randn({4096, 1})),
                                                {.batch_size = batch, .shuffle = true, .split_batches = true});
    auto opt = acc.prepare(model, adamw, loader);
    for (int step = 0; step < steps;)
      for (const auto& b : loader) {
        if (oom_above > 0 && b.data.size(0) > oom_above) at::empty({1LL << 50}, at::kFloat);  // 4 PB: refused
        auto scope = acc.accumulate(model);
        acc.backward(at::mse_loss(model->forward(b.data), b.target));
        opt->step();
        opt->zero_grad();
        if (acc.sync_gradients() && ++step == steps) break;
      }
    acc.print("tune_program: done");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tune_program: %s\n", e.what());
    return 1;
  }
  return 0;
}
