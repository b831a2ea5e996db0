#include "accelerator/data_loader.h"

#include "base/error.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>

namespace accel {

std::uint64_t next_loader_stamp() {
  static std::atomic<std::uint64_t> stamp{0};
  return ++stamp;
}

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw accel::InvalidArgumentError(fmt::format("accel::ShardPlan: {}", what));
}

// SplitMix64 finalizer: spreads (seed, epoch) over all 64 bits so nearby pairs seed unrelated streams.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound] by rejection (unlike std::uniform_int_distribution, the same on every
// standard library, so the order does not depend on how a rank was built).
std::uint64_t uniform_upto(std::mt19937_64& gen, std::uint64_t bound) {
  if (bound == ~0ull) return gen();
  const std::uint64_t range = bound + 1;
  const std::uint64_t reject_below = (0 - range) % range;  // 2^64 mod range: the biased low values
  std::uint64_t x;
  do x = gen();
  while (x < reject_below);
  return x % range;
}

}  // namespace

ShardPlan::ShardPlan(std::int64_t dataset_size, const DataLoaderOptions& opts, int rank, int world, int group)
    : size_(dataset_size), opts_(opts), rank_(rank), world_(world), group_(group) {
  if (group < 1) bad(fmt::format("group must be >= 1, got {}", group));
  if (dataset_size < 0) bad(fmt::format("dataset_size must be >= 0, got {}", dataset_size));
  if (opts.batch_size < 1) bad(fmt::format("batch_size must be >= 1, got {}", opts.batch_size));
  if (world < 1) bad(fmt::format("world must be >= 1, got {}", world));
  if (rank < 0 || rank >= world) bad(fmt::format("rank must be in [0, {}), got {}", world, rank));
  if (opts.split_batches && opts.batch_size % world != 0)
    bad(
        fmt::format("split_batches needs a batch_size divisible by the number of processes: batch_size {}, "
                    "processes {}",
                    opts.batch_size, world));
  // One process has nobody to keep in step with: a plain loader's short last batch, no duplicates.
  if (world == 1 && group == 1) opts_.even_batches = false;
}

std::int64_t ShardPlan::per_process_batch() const {
  return opts_.split_batches ? opts_.batch_size / world_ : opts_.batch_size;
}

std::int64_t ShardPlan::global_batch() const { return per_process_batch() * world_; }

std::int64_t ShardPlan::real_samples(std::int64_t batch) const {
  const std::int64_t G = global_batch(), first = batch * G;
  if (!opts_.even_batches || opts_.drop_last || first + G <= size_) return -1;
  return std::max<std::int64_t>(0, size_ - first);
}

std::int64_t ShardPlan::remainder() const { return num_batches() > 0 ? real_samples(num_batches() - 1) : -1; }

std::int64_t ShardPlan::num_batches() const {
  const std::int64_t span = global_batch() * group_;  // the epoch ends on a whole group of batches
  const std::int64_t full_groups = size_ / span;
  if (size_ % span == 0 || opts_.drop_last) return full_groups * group_;
  if (opts_.even_batches) return (full_groups + 1) * group_;
  const std::int64_t full = size_ / global_batch();
  const std::int64_t rem = size_ % global_batch();
  if (rem == 0) return full;
  // Uneven: the real samples of the last global batch go to the first ranks, b at a time.
  return full + (rank_ * per_process_batch() < rem ? 1 : 0);
}

std::int64_t ShardPlan::epoch_batches() const {
  ShardPlan first = *this;
  first.rank_ = 0;  // the first ranks get the uneven last batch's samples
  return first.num_batches();
}

std::vector<std::int64_t> ShardPlan::order(std::int64_t epoch) const {
  std::vector<std::int64_t> o(static_cast<std::size_t>(size_));
  std::iota(o.begin(), o.end(), std::int64_t{0});
  if (!opts_.shuffle) return o;
  std::mt19937_64 gen(mix64(mix64(opts_.seed) ^ static_cast<std::uint64_t>(epoch)));
  for (std::size_t i = o.size(); i > 1; --i) {  // Fisher-Yates: o[i-1] swaps with a uniform o[0..i-1]
    const auto j = static_cast<std::size_t>(uniform_upto(gen, i - 1));
    std::swap(o[i - 1], o[j]);
  }
  return o;
}

std::vector<std::vector<std::int64_t>> ShardPlan::batches(std::int64_t epoch) const {
  const std::vector<std::int64_t> o = order(epoch);
  const std::int64_t b = per_process_batch(), G = global_batch();
  // Positions past the end wrap to the start of the order (padding); only reached with even_batches.
  const std::int64_t end = opts_.even_batches ? std::numeric_limits<std::int64_t>::max() : size_;
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(num_batches()));
  for (std::size_t g = 0; g < out.size(); ++g) {
    const std::int64_t first = static_cast<std::int64_t>(g) * G + rank_ * b;
    const std::int64_t last = std::min(first + b, end);
    out[g].reserve(static_cast<std::size_t>(last - first));
    for (std::int64_t p = first; p < last; ++p) out[g].push_back(o[static_cast<std::size_t>(p % size_)]);
  }
  return out;
}

namespace {

std::string tensor_shape(const at::Tensor& t) {
  if (!t.defined()) return "(undefined)";
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// Stacks one field (data or target) of every example; all undefined gives an undefined tensor.
at::Tensor stack_field(const std::vector<at::Tensor>& ts, const char* field, c10::Device device) {
  const at::Tensor& first = ts.front();
  for (std::size_t i = 1; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    const bool same = first.defined() == t.defined() && (!t.defined() || first.sizes() == t.sizes());
    if (!same)
      throw accel::InvalidArgumentError(fmt::format("accel::collate: example {} has {} of shape {}, example 0 has {}",
                                                    i, field, tensor_shape(t), tensor_shape(first)));
  }
  if (!first.defined()) return {};
  return at::stack(ts, 0).to(device, /*non_blocking=*/device.is_cuda());
}

}  // namespace

Batch collate(const std::vector<torch::data::Example<>>& examples, c10::Device device) {
  if (examples.empty()) throw accel::InvalidArgumentError("accel::collate: no examples");
  std::vector<at::Tensor> data, target;
  data.reserve(examples.size());
  target.reserve(examples.size());
  for (const auto& e : examples) {
    data.push_back(e.data);
    target.push_back(e.target);
  }
  return Batch{stack_field(data, "data", device), stack_field(target, "target", device)};
}

}  // namespace accel
