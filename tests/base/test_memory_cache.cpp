// accel's CPU allocator with the large-block cache on (memory::keep_freed_cpu_memory): a freed block of
// 32 MiB or more is handed out again to a request of the same size, the counters count blocks in use
// only, and the cache never lets in-use plus cached bytes pass the most ever in use at once.
#include "base/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace accel::memory {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

at::Tensor block(std::int64_t bytes) { return at::empty({bytes}, at::kByte); }

void expect_within_high_water() {
  const CpuCacheStats s = cpu_cache_stats();
  EXPECT_LE(s.in_use + s.cached, s.high_water) << "in use " << s.in_use << ", cached " << s.cached;
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

TEST_F(MemoryCache, AnAllocationThatWouldPassTheHighWaterMarkEvictsCachedBlocks) {
  const std::int64_t n = 40 * kMiB;
  { at::Tensor a = block(n); }
  CpuCacheStats s = cpu_cache_stats();
  ASSERT_GE(s.cached, n);
  // A different size (no reuse) that fits under the high-water mark only if the cache gives memory back.
  const std::int64_t m = s.high_water - s.in_use - s.cached + 4 * kMiB;
  ASSERT_GT(m, 0);
  ASSERT_NE(m, n);
  at::Tensor b = block(m);
  const CpuCacheStats t = cpu_cache_stats();
  EXPECT_EQ(t.high_water, s.high_water) << "the request fit under the mark once the cache let go";
  EXPECT_LT(t.cached, s.cached);
  expect_within_high_water();
}

TEST_F(MemoryCache, ManySmallAllocationsDrainTheCacheRatherThanGrowPastTheMark) {
  std::vector<at::Tensor> big;
  for (int i = 0; i < 3; ++i) big.push_back(block(33 * kMiB));
  big.clear();  // three blocks cached
  const CpuCacheStats s = cpu_cache_stats();
  ASSERT_GE(s.cached, 3 * 33 * kMiB);
  std::vector<at::Tensor> small;
  const std::int64_t room = s.high_water - s.in_use - s.cached;
  for (std::int64_t got = 0; got < room + 40 * kMiB; got += kMiB) {
    small.push_back(block(kMiB));
    expect_within_high_water();
  }
  EXPECT_EQ(cpu_cache_stats().high_water, s.high_water);
  EXPECT_LT(cpu_cache_stats().cached, s.cached);
}

}  // namespace
}  // namespace accel::memory
