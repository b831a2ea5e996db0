// The sharding data loader: ShardPlan's arithmetic exhaustively over small sizes and every flag,
// the seeded shuffle, collate, and the DataLoader template iterating at world sizes 1..3 (the ranks'
// batches gathered and checked against one global order).
#include "accelerator/data_loader.h"
#include "test_world.h"

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace accel::test {
namespace {

using Index = std::int64_t;
using Batches = std::vector<std::vector<Index>>;

std::string describe(std::int64_t n, const DataLoaderOptions& o, int world) {
  return "n=" + std::to_string(n) + " batch_size=" + std::to_string(o.batch_size) + " world=" + std::to_string(world) +
         " shuffle=" + std::to_string(o.shuffle) + " drop_last=" + std::to_string(o.drop_last) +
         " even_batches=" + std::to_string(o.even_batches) + " split_batches=" + std::to_string(o.split_batches);
}

// Every combination of the four flags, on top of `base`.
std::vector<DataLoaderOptions> flag_combinations(DataLoaderOptions base) {
  std::vector<DataLoaderOptions> out;
  for (int bits = 0; bits < 16; ++bits) {
    DataLoaderOptions o = base;
    o.shuffle = bits & 1;
    o.drop_last = bits & 2;
    o.even_batches = bits & 4;
    o.split_batches = bits & 8;
    out.push_back(o);
  }
  return out;
}

// The ranks' batches concatenated the way a gather sees them: batch 0 of rank 0, 1, ..., then batch 1...
std::vector<Index> interleave(const std::vector<Batches>& per_rank) {
  std::size_t most = 0;
  for (const auto& b : per_rank) most = std::max(most, b.size());
  std::vector<Index> out;
  for (std::size_t g = 0; g < most; ++g)
    for (const auto& b : per_rank)
      if (g < b.size()) out.insert(out.end(), b[g].begin(), b[g].end());
  return out;
}

// All the properties of one (n, options, world) point; `why` names it in failures.
void check_plan(std::int64_t n, const DataLoaderOptions& given, int world, std::int64_t epoch, const std::string& why) {
  std::vector<ShardPlan> plans;
  for (int r = 0; r < world; ++r) plans.emplace_back(n, given, r, world);
  DataLoaderOptions o = given;
  if (world == 1) o.even_batches = false;  // one process: a plain loader (short last batch)
  const ShardPlan& p0 = plans[0];
  const std::int64_t b = o.split_batches ? o.batch_size / world : o.batch_size;
  const std::int64_t G = b * world;
  ASSERT_EQ(p0.per_process_batch(), b) << why;
  ASSERT_EQ(p0.global_batch(), G) << why;

  const std::vector<Index> order = p0.order(epoch);
  std::vector<Index> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<Index> iota(static_cast<std::size_t>(n));
  std::iota(iota.begin(), iota.end(), Index{0});
  ASSERT_EQ(sorted, iota) << "order is not a permutation: " << why;
  if (!o.shuffle) EXPECT_EQ(order, iota) << why;

  std::vector<Batches> per_rank;
  for (const ShardPlan& p : plans) {
    EXPECT_EQ(p.order(epoch), order) << "ranks disagree on the order: " << why;
    EXPECT_EQ(p.remainder(), p0.remainder()) << why;
    per_rank.push_back(p.batches(epoch));
    EXPECT_EQ(static_cast<std::int64_t>(per_rank.back().size()), p.num_batches()) << why;
  }

  const std::int64_t full = n / G, rem = n % G;
  const bool incomplete = rem != 0;
  // The remainder is set exactly when the last global batch was padded.
  const bool padded = incomplete && !o.drop_last && o.even_batches;
  EXPECT_EQ(p0.remainder(), padded ? rem : -1) << why;
  const std::int64_t padding = padded ? G - p0.remainder() : 0;

  // Concatenated in rank order: the epoch's order (drop_last: its complete global batches), then
  // the padding, which wraps around to the order's start.
  const std::int64_t total = o.drop_last ? full * G : n + padding;
  std::vector<Index> expected;
  for (std::int64_t pos = 0; pos < total; ++pos) expected.push_back(order[static_cast<std::size_t>(pos % n)]);
  EXPECT_EQ(interleave(per_rank), expected) << why;

  // Every index read exactly once (plus the padding duplicates), or only the complete batches' ones.
  std::map<Index, int> seen;
  std::int64_t reads = 0;
  for (const auto& batches : per_rank)
    for (const auto& batch : batches)
      for (Index i : batch) ++seen[i], ++reads;
  if (o.drop_last) {
    EXPECT_EQ(reads, full * G) << why;
    for (const auto& [i, count] : seen) EXPECT_EQ(count, 1) << "index " << i << ": " << why;
  } else {
    EXPECT_EQ(static_cast<std::int64_t>(seen.size()), n) << why;
    EXPECT_EQ(reads - n, padding) << why;
  }

  // Batch counts and sizes.
  for (int r = 0; r < world; ++r) {
    const Batches& batches = per_rank[static_cast<std::size_t>(r)];
    for (std::size_t g = 0; g < batches.size(); ++g) {
      const bool last = g + 1 == batches.size();
      if (o.even_batches || o.drop_last || !last)
        EXPECT_EQ(static_cast<std::int64_t>(batches[g].size()), b) << "rank " << r << " batch " << g << ": " << why;
      EXPECT_FALSE(batches[g].empty()) << why;
    }
    std::int64_t want = full;
    if (incomplete && !o.drop_last) want += o.even_batches ? 1 : (r * b < rem ? 1 : 0);
    EXPECT_EQ(static_cast<std::int64_t>(batches.size()), want) << "rank " << r << ": " << why;
    if (o.even_batches) EXPECT_EQ(batches.size(), per_rank[0].size()) << why;
  }
}

TEST(ShardPlan, ExhaustiveSmallSizes) {
  for (std::int64_t n = 0; n <= 23; ++n)
    for (std::int64_t bs = 1; bs <= 5; ++bs)
      for (int world = 1; world <= 4; ++world)
        for (DataLoaderOptions o : flag_combinations({.batch_size = bs, .seed = 11})) {
          const std::string why = describe(n, o, world);
          if (o.split_batches && bs % world != 0) {
            for (int r = 0; r < world; ++r) EXPECT_THROW(ShardPlan(n, o, r, world), std::invalid_argument) << why;
            continue;
          }
          for (std::int64_t epoch : {0, 3}) check_plan(n, o, world, epoch, why);
          if (::testing::Test::HasFailure()) return;  // one configuration's failures are enough to read
        }
}

// A job restarted on f times fewer ranks (group f, split_batches batches f times smaller): every group
// of f batches, gathered, reads exactly what one global batch of the larger world read, in the same
// order, padding and dropped tails included; each rank's share of a batch stays the same.
TEST(ShardPlan, AGroupOfBatchesOnFewerRanksReadsWhatOneBatchOfTheLargerWorldRead) {
  for (std::int64_t n : {0, 5, 37, 48, 50, 64})
    for (int big : {2, 4})
      for (int f = 2; f <= big; f *= 2)
        for (bool split : {true, false})
          for (bool drop_last : {false, true})
            for (bool even : {true, false}) {
              if (!even && !drop_last) continue;  // uneven last batches follow the per-batch rule
              const int small = big / f;
              DataLoaderOptions o{.batch_size = split ? 4 * big : 3,
                                  .shuffle = true,
                                  .drop_last = drop_last,
                                  .even_batches = even,
                                  .split_batches = split,
                                  .seed = 9};
              DataLoaderOptions o_small = o;
              if (split) o_small.batch_size /= f;
              std::vector<Batches> ranks_big, ranks_small;
              for (int r = 0; r < big; ++r) ranks_big.push_back(ShardPlan(n, o, r, big).batches(3));
              for (int r = 0; r < small; ++r) {
                const ShardPlan p(n, o_small, r, small, f);
                ranks_small.push_back(p.batches(3));
                EXPECT_EQ(p.num_batches() % f, 0);
                if (split) EXPECT_EQ(p.per_process_batch(), ShardPlan(n, o, 0, big).per_process_batch());
              }
              const std::string why = fmt::format("n {} world {} -> {} split {} drop_last {} even {}", n, big, small,
                                                  split, drop_last, even);
              EXPECT_EQ(ranks_small[0].size(), ranks_big[0].size() * f) << why;
              EXPECT_EQ(interleave(ranks_small), interleave(ranks_big)) << why;
              // gather_for_metrics' count per batch: the padding of the big world's last batch, spread
              // over the small world's last group.
              const ShardPlan p_big(n, o, 0, big), p_small(n, o_small, 0, small, f);
              std::int64_t real_big = 0, real_small = 0;
              for (std::int64_t g = 0; g < p_big.num_batches(); ++g) {
                const std::int64_t r = p_big.real_samples(g);
                real_big += r < 0 ? p_big.global_batch() : r;
              }
              for (std::int64_t g = 0; g < p_small.num_batches(); ++g) {
                const std::int64_t r = p_small.real_samples(g);
                real_small += r < 0 ? p_small.global_batch() : r;
              }
              EXPECT_EQ(real_small, real_big) << why;
              if (::testing::Test::HasFailure()) return;
            }
}

TEST(ShardPlan, EmptyDatasetHasNoBatches) {
  for (DataLoaderOptions o : flag_combinations({.batch_size = 2})) {
    ShardPlan p(0, o, 1, 2);
    EXPECT_EQ(p.num_batches(), 0);
    EXPECT_TRUE(p.batches(0).empty());
    EXPECT_TRUE(p.order(0).empty());
    EXPECT_EQ(p.remainder(), -1);
  }
}

// The cases Accelerate's own tests pin (test_distributed_data_loop.py).
TEST(ShardPlan, KnownSmallCases) {
  // 3 samples, batch 1, 2 ranks, even_batches: [0], [2] and [1], [0] (the last one wrapped).
  EXPECT_EQ(ShardPlan(3, {.batch_size = 1}, 0, 2).batches(0), (Batches{{0}, {2}}));
  EXPECT_EQ(ShardPlan(3, {.batch_size = 1}, 1, 2).batches(0), (Batches{{1}, {0}}));
  EXPECT_EQ(ShardPlan(3, {.batch_size = 1}, 1, 2).remainder(), 1);
  // 7 samples, batch 2: even -> [2, 2] on both; uneven -> [2, 2] and [2, 1].
  EXPECT_EQ(ShardPlan(7, {.batch_size = 2}, 1, 2).batches(0), (Batches{{2, 3}, {6, 0}}));
  EXPECT_EQ(ShardPlan(7, {.batch_size = 2, .even_batches = false}, 0, 2).batches(0), (Batches{{0, 1}, {4, 5}}));
  EXPECT_EQ(ShardPlan(7, {.batch_size = 2, .even_batches = false}, 1, 2).batches(0), (Batches{{2, 3}, {6}}));
  // 3 samples, 2 ranks, batch 1, uneven: rank 1 gets one batch.
  EXPECT_EQ(ShardPlan(3, {.batch_size = 1, .even_batches = false}, 1, 2).num_batches(), 1);
  // Smaller than one global batch: keep wrapping (2 samples, batch 3, 2 ranks).
  EXPECT_EQ(ShardPlan(2, {.batch_size = 3}, 1, 2).batches(0), (Batches{{1, 0, 1}}));
  // split_batches: batch 6 over 3 ranks reads 2 each.
  EXPECT_EQ(ShardPlan(12, {.batch_size = 6, .split_batches = true}, 2, 3).batches(0), (Batches{{4, 5}, {10, 11}}));
}

TEST(ShardPlan, ShuffleDependsOnSeedAndEpochOnly) {
  const std::int64_t n = 23;
  auto order = [&](std::uint64_t seed, std::int64_t epoch, std::int64_t bs = 2, int rank = 0, int world = 1) {
    return ShardPlan(n, {.batch_size = bs, .shuffle = true, .seed = seed}, rank, world).order(epoch);
  };
  // Same (seed, epoch): the same order whatever the batch size, rank or world.
  EXPECT_EQ(order(5, 2), order(5, 2));
  EXPECT_EQ(order(5, 2), order(5, 2, 4, 2, 3));
  // Distinct epochs and distinct seeds give distinct orders (23! orders: a collision is a bug).
  std::set<std::vector<Index>> seen;
  for (std::uint64_t seed : {0, 1, 2, 42})
    for (std::int64_t epoch = 0; epoch < 8; ++epoch) seen.insert(order(seed, epoch));
  EXPECT_EQ(seen.size(), 32u);
  // Nor is a shuffled order the identity.
  std::vector<Index> iota(n);
  std::iota(iota.begin(), iota.end(), Index{0});
  EXPECT_NE(order(0, 0), iota);
}

// The order is part of a checkpoint's resume position, so it must not change between builds: pin it.
TEST(ShardPlan, ShuffleIsStableAcrossBuilds) {
  const auto o = ShardPlan(10, {.shuffle = true, .seed = 1234}, 0, 1).order(7);
  EXPECT_EQ(o, (std::vector<Index>{0, 5, 1, 8, 2, 6, 4, 7, 9, 3}));
}

// Fisher-Yates with an unbiased draw: each of the 6 orders of 3 elements about equally often.
TEST(ShardPlan, ShuffleIsUniform) {
  std::map<std::vector<Index>, int> counts;
  const int epochs = 6000;
  for (int e = 0; e < epochs; ++e) ++counts[ShardPlan(3, {.shuffle = true, .seed = 9}, 0, 1).order(e)];
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [o, c] : counts) {
    EXPECT_GT(c, 850);  // mean 1000, sd ~29
    EXPECT_LT(c, 1150);
  }
}

TEST(ShardPlan, BadArguments) {
  EXPECT_THROW(ShardPlan(10, {.batch_size = 0}), std::invalid_argument);
  EXPECT_THROW(ShardPlan(10, {.batch_size = -3}), std::invalid_argument);
  EXPECT_THROW(ShardPlan(-1, {.batch_size = 2}), std::invalid_argument);
  EXPECT_THROW(ShardPlan(10, {.batch_size = 2}, 0, 0), std::invalid_argument);
  EXPECT_THROW(ShardPlan(10, {.batch_size = 2}, -1, 2), std::invalid_argument);
  EXPECT_THROW(ShardPlan(10, {.batch_size = 2}, 2, 2), std::invalid_argument);
  try {
    ShardPlan(10, {.batch_size = 5, .split_batches = true}, 0, 2);
    ADD_FAILURE() << "split_batches with 5 over 2 ranks accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("split_batches"), std::string::npos) << what;
    EXPECT_NE(what.find('5'), std::string::npos) << what;
  }
  EXPECT_NO_THROW(ShardPlan(10, {.batch_size = 6, .split_batches = true}, 1, 3));
}

// ---------------------------------------------------------------------------------------------------
// collate

TEST(DataLoaderCollate, StacksAlongNewDim) {
  std::vector<torch::data::Example<>> ex;
  for (int i = 0; i < 3; ++i) ex.push_back({at::full({2, 4}, i), at::full({}, 10 * i, at::kLong)});
  Batch b = collate(ex, c10::kCPU);
  EXPECT_EQ(b.data.sizes(), (std::vector<std::int64_t>{3, 2, 4}));
  EXPECT_EQ(b.target.sizes(), (std::vector<std::int64_t>{3}));
  EXPECT_TRUE(at::equal(b.data[2], at::full({2, 4}, 2)));
  EXPECT_TRUE(at::equal(b.target, at::tensor({0, 10, 20}, at::kLong)));
}

TEST(DataLoaderCollate, ShapeMismatchNamesBothShapes) {
  std::vector<torch::data::Example<>> ex{{at::zeros({2, 3}), at::zeros({1})}, {at::zeros({2, 4}), at::zeros({1})}};
  try {
    collate(ex, c10::kCPU);
    ADD_FAILURE() << "mismatched shapes accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[2, 3]"), std::string::npos) << what;
    EXPECT_NE(what.find("[2, 4]"), std::string::npos) << what;
    EXPECT_NE(what.find("data"), std::string::npos) << what;
  }
  std::vector<torch::data::Example<>> targets{{at::zeros({2}), at::zeros({1})}, {at::zeros({2}), at::zeros({2})}};
  EXPECT_THROW(collate(targets, c10::kCPU), std::invalid_argument);
  EXPECT_THROW(collate({}, c10::kCPU), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------
// DataLoader

// Example i: data [i, -i] (float), target 10 * i (long).
struct IndexDs : torch::data::datasets::Dataset<IndexDs> {
  explicit IndexDs(std::size_t n) : n(n) {}
  torch::data::Example<> get(std::size_t i) override {
    const double v = static_cast<double>(i);
    return {at::tensor({v, -v}, at::kDouble), at::full({}, static_cast<std::int64_t>(10 * i), at::kLong)};
  }
  std::optional<std::size_t> size() const override { return n; }
  std::size_t n;
};

struct SizelessDs : torch::data::datasets::Dataset<SizelessDs> {
  torch::data::Example<> get(std::size_t) override { return {at::zeros({1}), at::zeros({1})}; }
  std::optional<std::size_t> size() const override { return std::nullopt; }
};

// The indices of one batch, checking its targets match its data.
std::vector<Index> batch_indices(const Batch& b) {
  EXPECT_EQ(b.data.dim(), 2);
  EXPECT_TRUE(at::equal(b.data.select(1, 1), -b.data.select(1, 0)));
  at::Tensor idx = b.data.select(1, 0).to(at::kLong);
  EXPECT_TRUE(at::equal(b.target, idx * 10));
  return std::vector<Index>(idx.data_ptr<Index>(), idx.data_ptr<Index>() + idx.numel());
}

// One epoch of `loader`, checking the LoaderState as it goes.
Batches run_epoch(DataLoader<IndexDs>& loader, std::int64_t first_batch = 0) {
  Batches out;
  const auto& st = loader.state();
  const std::int64_t epoch = loader.epoch(), n = loader.size();
  for (const Batch& b : loader) {
    out.push_back(batch_indices(b));
    const std::int64_t i = first_batch + static_cast<std::int64_t>(out.size()) - 1;
    EXPECT_TRUE(st->in_epoch);
    EXPECT_EQ(st->end_of_dataloader, i + 1 == n) << "batch " << i << " of " << n;
    EXPECT_EQ(st->remainder, loader.plan().real_samples(i));  // set on a batch that holds padding
    EXPECT_EQ(loader.batches_consumed(), i + 1);
  }
  EXPECT_FALSE(st->in_epoch);
  EXPECT_EQ(loader.epoch(), epoch + 1);
  EXPECT_EQ(loader.batches_consumed(), 0);
  return out;
}

TEST(DataLoader, UnpreparedIsAPlainLoader) {
  DataLoader<IndexDs> loader(IndexDs(7), {.batch_size = 3});
  EXPECT_EQ(loader.size(), 3);
  EXPECT_EQ(loader.dataset_size(), 7);
  EXPECT_EQ(run_epoch(loader), (Batches{{0, 1, 2}, {3, 4, 5}, {6}}));
  EXPECT_EQ(loader.state()->remainder, -1);
  DataLoader<IndexDs> dropping(IndexDs(7), {.batch_size = 3, .drop_last = true});
  EXPECT_EQ(run_epoch(dropping), (Batches{{0, 1, 2}, {3, 4, 5}}));
}

TEST(DataLoader, EmptyDatasetYieldsNothingAndAdvances) {
  DataLoader<IndexDs> loader(IndexDs(0), {.batch_size = 3});
  EXPECT_TRUE(run_epoch(loader).empty());
  EXPECT_EQ(loader.epoch(), 1);
}

TEST(DataLoader, BadArguments) {
  EXPECT_THROW(DataLoader<SizelessDs>(SizelessDs(), {}), std::invalid_argument);
  EXPECT_THROW(DataLoader<IndexDs>(IndexDs(4), {.batch_size = 0}), std::invalid_argument);
  DataLoader<IndexDs> loader(IndexDs(4), {.batch_size = 4, .split_batches = true});
  EXPECT_THROW(loader.skip_first_batches(-1), std::invalid_argument);
  EXPECT_THROW(loader.shard(0, 3, c10::kCPU, std::make_shared<LoaderState>()), std::invalid_argument);
}

// A padded [rows, width] tensor of this rank's batches (-1 where none), all-gathered: [world, rows, width].
at::Tensor gather_batches(const Batches& batches, std::int64_t rows, std::int64_t width) {
  auto w = world();
  at::Tensor mine = at::full({rows, width}, -1, at::kLong);
  EXPECT_LE(static_cast<std::int64_t>(batches.size()), rows);
  for (std::size_t g = 0; g < batches.size() && static_cast<std::int64_t>(g) < rows; ++g)
    for (std::size_t k = 0; k < batches[g].size() && static_cast<std::int64_t>(k) < width; ++k)
      mine[static_cast<std::int64_t>(g)][static_cast<std::int64_t>(k)] = batches[g][k];
  at::Tensor all = at::empty({w->size(), rows, width}, at::kLong);
  w->all_gather(mine, all);
  return all;
}

// The gathered batches back per rank (the -1 filler dropped).
std::vector<Batches> split_gathered(const at::Tensor& all) {
  std::vector<Batches> out(static_cast<std::size_t>(all.size(0)));
  for (std::int64_t r = 0; r < all.size(0); ++r)
    for (std::int64_t g = 0; g < all.size(1); ++g) {
      std::vector<Index> batch;
      for (std::int64_t k = 0; k < all.size(2); ++k)
        if (Index v = all[r][g][k].item<Index>(); v >= 0) batch.push_back(v);
      if (!batch.empty()) out[static_cast<std::size_t>(r)].push_back(batch);
    }
  return out;
}

TEST(DataLoader, ShardsAcrossRanks) {
  auto w = world();
  const int rank = w->rank(), N = w->size();
  const std::int64_t n = 23;
  std::vector<DataLoaderOptions> configs{
      {.batch_size = 2, .shuffle = true, .seed = 7},
      {.batch_size = 2, .shuffle = true, .even_batches = false, .seed = 7},
      {.batch_size = 3, .shuffle = true, .drop_last = true, .seed = 7},
      {.batch_size = 2 * N, .shuffle = true, .split_batches = true, .seed = 7},
      {.batch_size = 4, .shuffle = false},
  };
  for (const DataLoaderOptions& o : configs) {
    const std::string why = describe(n, o, N);
    DataLoader<IndexDs> loader(IndexDs(n), o);
    loader.shard(rank, N, c10::kCPU, std::make_shared<LoaderState>());
    const ShardPlan single(n, o, 0, 1);  // the order depends on (seed, epoch) only
    const std::int64_t b = loader.plan().per_process_batch(), G = loader.plan().global_batch();
    const std::int64_t rows = n / G + 1;

    std::vector<std::vector<Index>> epoch_orders;
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
      ASSERT_EQ(loader.epoch(), epoch) << why;
      const Batches mine = run_epoch(loader);
      EXPECT_EQ(mine, loader.plan().batches(epoch)) << why;
      const std::vector<Batches> per_rank = split_gathered(gather_batches(mine, rows, b));
      ASSERT_EQ(per_rank[static_cast<std::size_t>(rank)], mine) << why;

      // Every rank the same batch count (even_batches), and together the epoch's order once.
      if (o.even_batches)
        for (const Batches& r : per_rank) EXPECT_EQ(r.size(), mine.size()) << why;
      std::vector<Index> global = interleave(per_rank);
      const std::int64_t rem = loader.state()->remainder;
      if (rem >= 0) global.resize(static_cast<std::size_t>(global.size() - (G - rem)));
      const std::vector<Index> order = single.order(epoch);
      const std::size_t covered = o.drop_last ? static_cast<std::size_t>(n / G * G) : order.size();
      EXPECT_EQ(global, std::vector<Index>(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(covered))) << why;
      if (!o.drop_last) {
        std::vector<Index> sorted = global;
        std::sort(sorted.begin(), sorted.end());
        std::vector<Index> iota(static_cast<std::size_t>(n));
        std::iota(iota.begin(), iota.end(), Index{0});
        EXPECT_EQ(sorted, iota) << why;
      }
      epoch_orders.push_back(global);
    }
    if (o.shuffle)
      EXPECT_NE(epoch_orders[0], epoch_orders[1]) << why;
    else
      EXPECT_EQ(epoch_orders[0], epoch_orders[1]) << why;
  }
}

TEST(DataLoader, SetEpochAndSkipFirstBatchesResume) {
  auto w = world();
  const int rank = w->rank(), N = w->size();
  const DataLoaderOptions o{.batch_size = 2, .shuffle = true, .seed = 3};
  DataLoader<IndexDs> loader(IndexDs(23), o);
  loader.shard(rank, N, c10::kCPU, std::make_shared<LoaderState>());
  loader.set_epoch(4);
  EXPECT_EQ(loader.epoch(), 4);
  const Batches full = run_epoch(loader);
  EXPECT_EQ(loader.epoch(), 5);
  ASSERT_EQ(static_cast<std::int64_t>(full.size()), loader.size());

  for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, loader.size() - 1}) {
    loader.set_epoch(4);
    DataLoader<IndexDs> resumed = loader.skip_first_batches(k);
    EXPECT_EQ(resumed.epoch(), 4);
    const Batches rest = run_epoch(resumed, k);
    EXPECT_EQ(rest, Batches(full.begin() + k, full.end())) << "k=" << k;
    EXPECT_EQ(resumed.epoch(), 5);
    // The skip applies once: the next epoch is whole.
    EXPECT_EQ(run_epoch(resumed), loader.plan().batches(5)) << "k=" << k;
  }

  // Skipping all of an epoch yields nothing and moves on to the next.
  loader.set_epoch(4);
  DataLoader<IndexDs> past = loader.skip_first_batches(loader.size() + 3);
  EXPECT_TRUE(run_epoch(past, loader.size()).empty());
  EXPECT_EQ(past.epoch(), 5);

  // Stopping mid-epoch: batches_consumed() is the resume position.
  loader.set_epoch(4);
  std::int64_t consumed = 0;
  for (const Batch& b : loader) {
    (void)b;
    if (loader.batches_consumed() == 2) {
      consumed = loader.batches_consumed();
      break;
    }
  }
  EXPECT_EQ(consumed, 2);
  DataLoader<IndexDs> again = loader.skip_first_batches(consumed);
  again.set_epoch(4);
  EXPECT_EQ(run_epoch(again, consumed), Batches(full.begin() + consumed, full.end()));
}

}  // namespace
}  // namespace accel::test
