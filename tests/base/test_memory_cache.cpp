// accel's CPU allocator with the large-block cache on (memory::keep_freed_cpu_memory): a freed block of
// 32 MiB or more is handed out again to a request of the same size, the counters count blocks in use
// only, and the cache never lets in-use plus cached bytes pass the most ever in use at once plus the
// largest block handed out.
#include "base/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace accel::memory {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

at::Tensor block(std::int64_t bytes) { return at::empty({bytes}, at::kByte); }

void expect_within_high_water() {
  const CpuCacheStats s = cpu_cache_stats();
  EXPECT_LE(s.in_use + s.cached, s.high_water + s.largest_block) << "in use " << s.in_use << ", cached " << s.cached;
}

class MemoryCache : public ::testing::Test {
 protected:
  void SetUp() override {
    install_counting_allocator();
    keep_freed_cpu_memory();
    empty_cpu_cache();
  }
};

TEST_F(MemoryCache, AFreedLargeBlockIsHandedOutAgainToTheSameSize) {
  const std::int64_t n = 48 * kMiB + 4096;
  const std::int64_t counted0 = snapshot().total.current;
  ASSERT_EQ(cpu_cache_stats().cached, 0);
  at::Tensor a = block(n);
  a.fill_(7);  // touch its pages
  const void* where = a.data_ptr();
  EXPECT_EQ(snapshot().total.current - counted0, n);
  a = at::Tensor();
  // Freed: cached, and no longer counted as in use.
  EXPECT_EQ(cpu_cache_stats().cached, n);
  EXPECT_EQ(snapshot().total.current, counted0);
  expect_within_high_water();

  at::Tensor b = block(n);
  EXPECT_EQ(b.data_ptr(), where);
  EXPECT_EQ(cpu_cache_stats().cached, 0);
  EXPECT_EQ(snapshot().total.current - counted0, n);
  // Its old bytes are there (empty() promises nothing, and the cache does not clear).
  EXPECT_EQ(b[n - 1].item<std::uint8_t>(), 7);
  expect_within_high_water();
  b = at::Tensor();
  empty_cpu_cache();
  EXPECT_EQ(cpu_cache_stats().cached, 0);
}

TEST_F(MemoryCache, SmallBlocksAreNotCached) {
  at::Tensor a = block(8 * kMiB);
  const std::int64_t cached0 = cpu_cache_stats().cached;
  a = at::Tensor();
  EXPECT_EQ(cpu_cache_stats().cached, cached0);
}

TEST_F(MemoryCache, AnAllocationPastTheRoomEvictsCachedBlocks) {
  const std::int64_t n = 40 * kMiB;
  {
    std::vector<at::Tensor> v;
    for (int i = 0; i < 3; ++i) v.push_back(block(n));
  }  // three blocks cached
  const CpuCacheStats s = cpu_cache_stats();
  ASSERT_GE(s.cached, 3 * n);
  ASSERT_LT(s.largest_block + 36 * kMiB, s.cached) << "the test needs more cached than one block of room";
  // Small (uncached) blocks fill the room above in use + cached to within 8 MiB.
  std::vector<at::Tensor> small;
  auto room = [] {
    const CpuCacheStats t = cpu_cache_stats();
    return t.high_water + t.largest_block - t.in_use - t.cached;
  };
  for (int i = 0; i < 1024 && room() >= 8 * kMiB; ++i) small.push_back(block(8 * kMiB));
  ASSERT_LT(room(), 8 * kMiB) << "the room does not shrink as blocks are allocated";
  const CpuCacheStats f = cpu_cache_stats();
  ASSERT_EQ(f.cached, s.cached);
  expect_within_high_water();
  // No cached block has this size, and it fits under the room only if the cache lets go.
  at::Tensor b = block(36 * kMiB);
  const CpuCacheStats t = cpu_cache_stats();
  EXPECT_EQ(t.high_water, f.high_water) << "the request fit under the mark";
  EXPECT_LT(t.cached, f.cached);
  expect_within_high_water();
}

TEST_F(MemoryCache, ManySmallAllocationsDrainTheCacheRatherThanGrowPastTheRoom) {
  std::vector<at::Tensor> big;
  for (int i = 0; i < 3; ++i) big.push_back(block(33 * kMiB));
  big.clear();  // three blocks cached
  const CpuCacheStats s = cpu_cache_stats();
  ASSERT_GE(s.cached, 3 * 33 * kMiB);
  ASSERT_LT(s.largest_block + 40 * kMiB, s.cached) << "the test needs more cached than one block of room";
  std::vector<at::Tensor> small;
  const std::int64_t room = s.high_water + s.largest_block - s.in_use - s.cached;
  for (std::int64_t got = 0; got < room + 40 * kMiB; got += kMiB) {
    small.push_back(block(kMiB));
    expect_within_high_water();
  }
  EXPECT_EQ(cpu_cache_stats().high_water, s.high_water);
  EXPECT_LT(cpu_cache_stats().cached, s.cached);
}

// The one block of room: at a step's peak, a unit's freed gradient (one size) stays cached for the
// next unit while blocks of other sizes are allocated, instead of being freed and page-faulted again.
TEST_F(MemoryCache, AtThePeakAFreedBlockStaysCachedWhileOtherSizesAreAllocated) {
  const std::int64_t grad = 38 * kMiB, out = 34 * kMiB;
  for (int unit = 0; unit < 3; ++unit) {
    at::Tensor g = block(grad);  // autograd's gradient of a weight
    const void* where = g.data_ptr();
    // The unit's flat gradient, sized so that holding it makes a new high-water mark.
    const CpuCacheStats s = cpu_cache_stats();
    const std::int64_t flat = std::max<std::int64_t>(112 * kMiB, s.high_water - s.in_use + 16 * kMiB);
    ASSERT_LT(flat, std::int64_t{1} << 30);
    at::Tensor f = block(flat);
    g = at::Tensor();           // copied into the flat gradient, freed: cached at the mark
    at::Tensor o = block(out);  // the reduce-scatter's output, another size
    o = at::Tensor();
    f = at::Tensor();
    at::Tensor next = block(grad);  // the next unit's gradient
    EXPECT_EQ(next.data_ptr(), where) << "unit " << unit << ": the freed gradient was evicted";
    expect_within_high_water();
  }
}

}  // namespace
}  // namespace accel::memory
