// ShardLayout against a brute-force element-by-element model of the same layout, exhaustively over
// small shapes: every element of every tensor is owned by exactly one rank, once, at the place the
// pieces say; padding belongs to no tensor; every shard has the same size and starts aligned.
#include "sharding/shard_layout.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

using accel::sharding::ShardLayout;

namespace {

// Element-level truth: flat[i] = {tensor, element} or {-1, -1}, built by walking the rules directly.
std::vector<std::pair<int, std::int64_t>> brute(const std::vector<std::int64_t>& numels, int world,
                                                std::int64_t align) {
  std::vector<std::pair<int, std::int64_t>> flat;
  for (std::size_t t = 0; t < numels.size(); ++t) {
    while (flat.size() % align) flat.push_back({-1, -1});
    for (std::int64_t e = 0; e < numels[t]; ++e) flat.push_back({static_cast<int>(t), e});
  }
  while (flat.size() % (world * align)) flat.push_back({-1, -1});
  return flat;
}

void check(const std::vector<std::int64_t>& numels, int world, std::int64_t align) {
  SCOPED_TRACE(::testing::Message() << "world " << world << " align " << align << " tensors " << numels.size());
  ShardLayout L(numels, world, align);
  auto truth = brute(numels, world, align);
  ASSERT_EQ(L.padded(), static_cast<std::int64_t>(truth.size()));
  ASSERT_EQ(L.padded() % (world * align), 0);
  std::int64_t total = 0;
  for (auto n : numels) total += n;
  ASSERT_EQ(L.total(), total);
  ASSERT_EQ(L.shard_size() * world, L.padded());
  for (std::size_t t = 0; t < numels.size(); ++t) {
    ASSERT_EQ(L.offset(t) % align, 0);
    if (numels[t] > 0) ASSERT_EQ(truth[L.offset(t)], (std::pair<int, std::int64_t>{static_cast<int>(t), 0}));
  }
  for (std::int64_t i = 0; i < L.padded(); ++i) {
    ASSERT_EQ(L.tensor_at(i), truth[i].first) << "index " << i;
    ASSERT_EQ(L.owner(i), i / L.shard_size());
  }
  // Pieces reproduce the truth exactly, and cover each element once.
  std::vector<std::vector<int>> covered(numels.size());
  for (std::size_t t = 0; t < numels.size(); ++t) covered[t].assign(numels[t], 0);
  for (int r = 0; r < world; ++r) {
    auto [b, e] = L.shard_range(r);
    ASSERT_EQ(b % align, 0);
    std::int64_t last_end = 0;
    for (const auto& p : L.pieces(r)) {
      ASSERT_GT(p.numel, 0);
      ASSERT_GE(p.shard_offset, last_end);
      last_end = p.shard_offset + p.numel;
      ASSERT_LE(last_end, L.shard_size());
      for (std::int64_t k = 0; k < p.numel; ++k) {
        ASSERT_EQ(truth[b + p.shard_offset + k], (std::pair<int, std::int64_t>{p.tensor, p.tensor_offset + k}));
        covered[p.tensor][p.tensor_offset + k]++;
      }
    }
  }
  for (std::size_t t = 0; t < numels.size(); ++t)
    for (auto c : covered[t]) ASSERT_EQ(c, 1);
}

}  // namespace

TEST(ShardLayout, ExhaustiveSmallShapes) {
  // Every list of up to 3 tensors with 0..5 elements each, worlds 1..5, alignments 1..4.
  std::vector<std::vector<std::int64_t>> lists = {{}};
  for (int len = 1; len <= 3; ++len) {
    std::vector<std::int64_t> cur(len, 0);
    while (true) {
      lists.push_back(cur);
      int i = 0;
      while (i < len && ++cur[i] > 5) cur[i++] = 0;
      if (i == len) break;
    }
  }
  for (const auto& l : lists)
    for (int world = 1; world <= 5; ++world)
      for (std::int64_t align = 1; align <= 4; ++align) check(l, world, align);
}

TEST(ShardLayout, LargeAndUneven) {
  check({1000003, 7, 65537, 1}, 3, 16);
  check({4096, 4096}, 4, 1);
  ShardLayout L({10}, 4);  // 10 elements over 4 ranks: padded to 12, shards of 3
  EXPECT_EQ(L.padded(), 12);
  EXPECT_EQ(L.shard_size(), 3);
  EXPECT_EQ(L.pieces(3), (std::vector<ShardLayout::Piece>{{0, 9, 0, 1}}));
}

TEST(ShardLayout, BadArguments) {
  EXPECT_THROW(ShardLayout({1}, 0), std::invalid_argument);
  EXPECT_THROW(ShardLayout({1}, 2, 0), std::invalid_argument);
  EXPECT_THROW(ShardLayout({-1}, 2), std::invalid_argument);
  ShardLayout L({5}, 2);
  EXPECT_THROW(L.shard_range(2), std::out_of_range);
  EXPECT_THROW(L.owner(6), std::out_of_range);
}
