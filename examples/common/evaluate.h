// Accuracy of a classifier over a prepared eval loader, each sample counted once on every rank
// (gather_for_metrics drops the padding of the last batch). Throws if the count is not the
// dataset's size: the examples check their own metric plumbing.
#pragma once

#include "accelerator/accelerator.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace accel::examples {

template <class Model, class Dataset>
double accuracy(Accelerator& acc, Model& model, DataLoader<Dataset>& loader) {
  c10::NoGradGuard no_grad;
  auto autocast = acc.autocast();  // the parameters are in the compute dtype under mixed precision
  std::int64_t seen = 0, correct = 0;
  for (const Batch& b : loader) {
    at::Tensor hit = (at::argmax(model->forward(b.data), 1) == b.target).to(at::kLong);
    at::Tensor all = acc.gather_for_metrics(hit);
    seen += all.numel();
    correct += all.sum().item<std::int64_t>();
  }
  if (seen != loader.dataset_size())
    throw std::runtime_error("gather_for_metrics counted " + std::to_string(seen) + " eval samples, expected " +
                             std::to_string(loader.dataset_size()));
  return static_cast<double>(correct) / static_cast<double>(seen);
}

}  // namespace accel::examples
