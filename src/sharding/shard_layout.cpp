#include "sharding/shard_layout.h"
#include "base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace accel::sharding {
namespace {
std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

ShardLayout::ShardLayout(std::vector<std::int64_t> numels, int world, std::int64_t align)
    : numels_(std::move(numels)), world_(world), align_(align) {
  if (world < 1) throw accel::InvalidArgumentError(fmt::format("ShardLayout: world must be >= 1, got {}", world));
  if (align < 1) throw accel::InvalidArgumentError(fmt::format("ShardLayout: align must be >= 1, got {}", align));
  std::int64_t at = 0;
  offsets_.reserve(numels_.size());
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    if (numels_[i] < 0)
      throw accel::InvalidArgumentError(fmt::format("ShardLayout: tensor {} has negative numel {}", i, numels_[i]));
    at = round_up(at, align_);
    offsets_.push_back(at);
    at += numels_[i];
    total_ += numels_[i];
  }
  padded_ = round_up(at, static_cast<std::int64_t>(world_) * align_);
}

std::pair<std::int64_t, std::int64_t> ShardLayout::shard_range(int rank) const {
  if (rank < 0 || rank >= world_)
    throw accel::OutOfRangeError(fmt::format("ShardLayout: rank {} not in [0, {})", rank, world_));
  return {rank * shard_size(), (rank + 1) * shard_size()};
}

int ShardLayout::owner(std::int64_t index) const {
  if (index < 0 || index >= padded_)
    throw accel::OutOfRangeError(fmt::format("ShardLayout: index {} not in [0, {})", index, padded_));
  return static_cast<int>(index / shard_size());
}

int ShardLayout::tensor_at(std::int64_t index) const {
  if (index < 0 || index >= padded_)
    throw accel::OutOfRangeError(fmt::format("ShardLayout: index {} not in [0, {})", index, padded_));
  // Last tensor whose offset <= index (empty tensors share offsets; upper_bound skips past them).
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), index);
  while (it != offsets_.begin()) {
    --it;
    std::size_t i = static_cast<std::size_t>(it - offsets_.begin());
    if (index < offsets_[i] + numels_[i]) return static_cast<int>(i);
    if (numels_[i] > 0) break;  // index lies in the gap (alignment padding) after tensor i
  }
  return -1;
}

std::vector<ShardLayout::Piece> ShardLayout::pieces(int rank) const {
  auto [begin, end] = shard_range(rank);
  std::vector<Piece> out;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    std::int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i] + numels_[i]);
    if (lo < hi) out.push_back({static_cast<int>(i), lo - offsets_[i], lo - begin, hi - lo});
  }
  return out;
}

std::string ShardLayout::to_string() const {
  return fmt::format("ShardLayout({} tensors, {} elements, padded {} = {} x {}, align {})", numels_.size(), total_,
                     padded_, world_, shard_size(), align_);
}

}  // namespace accel::sharding
