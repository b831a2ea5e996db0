// accel::sharding::ShardLayout — where each element of a group of tensors lives once they are
// flattened into one padded buffer split evenly over `world` ranks. Pure arithmetic: no torch.
//
// Tensor i starts at offset(i), a multiple of `align` elements; the buffer is padded to a multiple of
// world * align elements, so every shard has the same size and starts aligned. Rank r owns the flat
// elements [r * shard_size(), (r + 1) * shard_size()). Padding elements belong to no tensor.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace accel::sharding {

class ShardLayout {
 public:
  // numels: element count of each tensor, in order. world >= 1, align >= 1; throws
  // std::invalid_argument otherwise (or for a negative numel).
  ShardLayout(std::vector<std::int64_t> numels, int world, std::int64_t align = 1);

  int world() const { return world_; }
  std::int64_t align() const { return align_; }
  std::size_t num_tensors() const { return numels_.size(); }
  std::int64_t numel(std::size_t i) const { return numels_.at(i); }
  // Sum of the tensors' element counts (no padding).
  std::int64_t total() const { return total_; }
  // Size of the flat buffer: >= offset of the last tensor + its numel, a multiple of world*align.
  std::int64_t padded() const { return padded_; }
  std::int64_t shard_size() const { return padded_ / world_; }
  std::int64_t offset(std::size_t i) const { return offsets_.at(i); }
  // [begin, end) of rank r's shard in the flat buffer.
  std::pair<std::int64_t, std::int64_t> shard_range(int rank) const;
  // The rank owning flat element `index` (padding included).
  int owner(std::int64_t index) const;
  // The tensor holding flat element `index`, or -1 for padding.
  int tensor_at(std::int64_t index) const;

  // One contiguous run of a tensor's elements inside one rank's shard.
  struct Piece {
    int tensor;                  // index of the tensor
    std::int64_t tensor_offset;  // first element within the tensor
    std::int64_t shard_offset;   // where it sits within the shard
    std::int64_t numel;
    bool operator==(const Piece&) const = default;
  };
  // The pieces of tensors rank r owns, in flat order (padding omitted). Their numels sum to the
  // number of non-padding elements in the shard.
  std::vector<Piece> pieces(int rank) const;

  std::string to_string() const;

 private:
  std::vector<std::int64_t> numels_, offsets_;
  int world_;
  std::int64_t align_, total_ = 0, padded_ = 0;
};

}  // namespace accel::sharding
