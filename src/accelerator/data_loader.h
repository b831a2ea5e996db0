// accel::DataLoader — a sharding loader over a torch::data dataset (one whose get(i) returns
// torch::data::Example<>): each rank reads a disjoint part of every global batch, the ranks together
// cover the dataset once per epoch, and shuffling is the same permutation on every rank (seeded by
// seed + epoch, independent of libtorch's global RNG).
//
// Unprepared (rank 0 of 1) it is a plain loader. Accelerator::prepare(loader) shards it over the
// ranks, moves batches to the accelerator's device and shares a LoaderState with the Accelerator (so
// accumulate() knows the last batch and gather_for_metrics() drops the padding).
//
// Global batch g covers positions [g*G, (g+1)*G) of the epoch's order, G = batch_size * world
// (split_batches: G = batch_size, each rank reads batch_size / world). Rank r reads the r-th
// contiguous chunk of each global batch, so gathering the ranks' batches in rank order gives the
// global batch in order, padding (if any) at the end.
// Last, incomplete global batch: drop_last drops it; otherwise with even_batches every rank gets a
// full batch, the missing positions filled by wrapping around to the start of the order (the
// duplicates gather_for_metrics drops; at world 1 even_batches is moot: a short last batch); without even_batches the
// real samples are split in rank order (later ranks may get a smaller batch or none at all).
#pragma once

#include "base/error.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/data/example.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace accel {

struct DataLoaderOptions {
  std::int64_t batch_size = 1;  // per process; with split_batches the global batch
  bool shuffle = false;
  bool drop_last = false;
  bool even_batches = true;
  bool split_batches = false;
  std::uint64_t seed = 0;
};

// Shared between a prepared loader and its Accelerator.
struct LoaderState {
  bool in_epoch = false;           // an iteration is under way
  std::uint64_t started = 0;       // when it began (a process-wide count): the newest one is active
  bool end_of_dataloader = false;  // the batch last yielded is the epoch's last
  // Real samples in the batch last yielded when it holds padding (even_batches; a shrunk job's
  // epoch may end in several such batches, see ShardPlan's group); -1: no padding.
  std::int64_t remainder = -1;
  // The loader's position, kept current by the loader (what save_state records).
  std::int64_t epoch = 0, batches_consumed = 0;
  std::int64_t global_batch = 0;  // samples per batch over all ranks (a position in samples: batches * this)
  std::int64_t dataset_size = 0;  // samples in the dataset (a position past them is the epoch's end)
  // Set by load_state: the next iteration starts at batch resume_skip of epoch resume_epoch.
  std::int64_t resume_epoch = -1, resume_skip = 0;
};

// The next value of one process-wide count (LoaderState::started): which of several loaders of any
// dataset types began its iteration last.
std::uint64_t next_loader_stamp();

// Pure arithmetic: which dataset indices rank `rank` of `world` reads in each batch of an epoch.
// Throws std::invalid_argument for dataset_size < 0, batch_size < 1, world < 1, rank outside [0, world), or
// split_batches with a batch size the world does not divide.
//
// group > 1 (a job restarted on `group` times fewer ranks, whose optimizer step accumulates `group`
// batches where it took one): the epoch ends on a whole group of batches, so the last optimizer step
// reads what the larger world's last batch read. drop_last drops the last incomplete group;
// even_batches pads it to whole batches, all `group` of them, wrapping around the order as before.
// (Without even_batches, an uneven last batch, the rule is per batch.)
class ShardPlan {
 public:
  ShardPlan(std::int64_t dataset_size, const DataLoaderOptions& opts, int rank = 0, int world = 1, int group = 1);
  // The epoch's order of dataset indices (identity, or the seeded permutation).
  std::vector<std::int64_t> order(std::int64_t epoch) const;
  // This rank's batches for the epoch, in order.
  std::vector<std::vector<std::int64_t>> batches(std::int64_t epoch) const;
  std::int64_t num_batches() const;    // per rank (equal on every rank with even_batches)
  std::int64_t epoch_batches() const;  // global batches in an epoch: the most any rank has (rank 0's count)
  std::int64_t remainder() const;      // real samples in the last batch when it holds padding, else -1
  std::int64_t real_samples(std::int64_t batch) const;  // the same for global batch `batch` of the epoch
  std::int64_t global_batch() const;                    // G above
  std::int64_t per_process_batch() const;
  std::int64_t dataset_size() const { return size_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int group() const { return group_; }
  const DataLoaderOptions& options() const { return opts_; }

 private:
  std::int64_t size_;
  DataLoaderOptions opts_;
  int rank_, world_, group_;
};

// One batch: the examples' data and targets stacked along a new dim 0.
using Batch = torch::data::Example<at::Tensor, at::Tensor>;

// Stacks examples (each data/target of one shape) into a Batch on `device` (non-blocking copy to CUDA).
// Throws std::invalid_argument for no examples, or naming both shapes when two examples differ.
Batch collate(const std::vector<torch::data::Example<>>& examples, c10::Device device);

template <class Dataset>
class DataLoader {
 public:
  DataLoader(Dataset dataset, DataLoaderOptions opts)
      : dataset_(std::make_shared<Dataset>(std::move(dataset))), opts_(opts), state_(std::make_shared<LoaderState>()) {
    const auto n = dataset_->size();
    if (!n) throw accel::InvalidArgumentError("accel::DataLoader: the dataset must know its size");
    size_ = static_cast<std::int64_t>(*n);
    plan_ = std::make_shared<ShardPlan>(size_, opts_, 0, 1);
  }

  // Called by Accelerator::prepare. shrink > 1 (a job restarted on that many times fewer ranks than
  // it started with, accumulating that many more batches per optimizer step): a split_batches loader
  // reads global batches that many times smaller, so each rank's share stays what it was, and the
  // epoch ends on a whole group of `shrink` batches (ShardPlan's group).
  void shard(int rank, int world, c10::Device device, std::shared_ptr<LoaderState> state, int shrink = 1) {
    DataLoaderOptions o = opts_;
    if (o.split_batches && shrink > 1) {
      if (o.batch_size % shrink != 0)
        throw accel::InvalidArgumentError("accel::DataLoader: batch_size " + std::to_string(o.batch_size) +
                                          " cannot be split " + std::to_string(shrink) +
                                          " ways to keep the global batch on fewer ranks");
      o.batch_size /= shrink;
    }
    plan_ = std::make_shared<ShardPlan>(size_, o, rank, world, shrink);
    device_ = device;
    state_ = std::move(state);
    publish();
  }

  // Epoch used by the next iteration (shuffling); iterating advances it by one.
  void set_epoch(std::int64_t epoch) {
    epoch_ = epoch;
    publish();
  }
  std::int64_t epoch() const { return epoch_; }
  // Batches yielded so far in the current epoch (skipped ones included): the resume position.
  std::int64_t batches_consumed() const { return consumed_; }
  // A copy whose next iteration starts at batch n of its epoch (resuming mid-epoch); n past the end
  // gives an empty epoch. The copy shares the dataset and LoaderState, not the epoch counter.
  DataLoader skip_first_batches(std::int64_t n) const {
    if (n < 0)
      throw accel::InvalidArgumentError("accel::DataLoader::skip_first_batches: n must be >= 0, got " +
                                        std::to_string(n));
    DataLoader c = *this;
    c.skip_ = n;
    return c;
  }
  std::int64_t size() const { return plan_->num_batches(); }  // batches per epoch on this rank
  std::int64_t dataset_size() const { return size_; }
  const ShardPlan& plan() const { return *plan_; }
  const DataLoaderOptions& options() const { return opts_; }
  const std::shared_ptr<LoaderState>& state() const { return state_; }
  c10::Device device() const { return device_; }

  class Iterator {
   public:
    Iterator(DataLoader* l, std::size_t i) : l_(l), i_(i) {}
    const Batch& operator*() {
      if (!cur_) cur_ = l_->load(i_);
      return *cur_;
    }
    const Batch* operator->() { return &**this; }
    Iterator& operator++() {
      ++i_;
      cur_.reset();
      if (i_ >= l_->batches_.size()) l_->finish_epoch();
      return *this;
    }
    bool operator!=(const Iterator& o) const { return i_ != o.i_; }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }

   private:
    DataLoader* l_;
    std::size_t i_;
    std::optional<Batch> cur_;
  };

  // One epoch. Not reentrant: one iteration at a time per loader.
  Iterator begin() {
    bool resumed_at_end = false;
    if (state_->resume_epoch >= 0) {  // resuming from a checkpoint (Accelerator::load_state)
      epoch_ = state_->resume_epoch;
      resumed_at_end = state_->resume_skip >= plan_->epoch_batches();  // (rank 0's position, for every rank)
      skip_ = std::max(skip_, state_->resume_skip);
      state_->resume_epoch = -1;
      state_->resume_skip = 0;
    }
    if (resumed_at_end) {  // saved on its epoch's last batch: the next epoch, from its start
      ++epoch_;
      skip_ = 0;
    }
    batches_ = plan_->batches(epoch_);
    const std::size_t start = static_cast<std::size_t>(std::min<std::int64_t>(skip_, batches_.size()));
    skip_ = 0;
    consumed_ = static_cast<std::int64_t>(start);
    state_->started = next_loader_stamp();
    state_->in_epoch = start < batches_.size();
    state_->end_of_dataloader = false;
    state_->remainder = -1;
    publish();
    if (start >= batches_.size()) finish_epoch();
    return Iterator(this, start);
  }
  Iterator end() { return Iterator(this, batches_.size()); }

 private:
  Batch load(std::size_t i) {
    std::vector<torch::data::Example<>> ex;
    ex.reserve(batches_[i].size());
    for (std::int64_t idx : batches_[i]) ex.push_back(dataset_->get(static_cast<std::size_t>(idx)));
    consumed_ = static_cast<std::int64_t>(i) + 1;
    publish();
    state_->end_of_dataloader = i + 1 == batches_.size();
    state_->remainder = plan_->real_samples(static_cast<std::int64_t>(i));
    return collate(ex, device_);
  }
  void finish_epoch() {
    state_->in_epoch = false;
    ++epoch_;
    consumed_ = 0;
    publish();
  }
  void publish() {
    state_->global_batch = plan_->global_batch();
    state_->dataset_size = size_;
    state_->epoch = epoch_;
    state_->batches_consumed = consumed_;
  }

  std::shared_ptr<Dataset> dataset_;
  DataLoaderOptions opts_;
  std::int64_t size_ = 0;
  std::shared_ptr<ShardPlan> plan_;
  std::shared_ptr<LoaderState> state_;
  c10::Device device_ = c10::Device(c10::kCPU);
  std::int64_t epoch_ = 0, consumed_ = 0, skip_ = 0;
  std::vector<std::vector<std::int64_t>> batches_;
};

}  // namespace accel
