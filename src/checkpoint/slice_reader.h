// accel::checkpoint SliceReader — reads element ranges of a checkpoint's tensors from the shard files
// their slices live in (slice_format.h), checking each slice's size and CRC32 as it is read. Used by
// read_state (each rank its masters' ranges) and merge_weights (every tensor whole, one at a time).
#pragma once

#include "checkpoint/slice_format.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace accel::checkpoint {

class SliceReader {
 public:
  explicit SliceReader(std::string dir) : dir_(std::move(dir)) {}
  ~SliceReader();
  SliceReader(const SliceReader&) = delete;
  SliceReader& operator=(const SliceReader&) = delete;

  // Elements [lo, hi) of `key`'s flat tensor, in its saved dtype, from every slice that overlaps.
  // Throws CheckpointError naming the file for a missing, truncated or corrupted slice, and naming
  // index.json when the slices do not cover [lo, hi) exactly once. A slice wholly inside [lo, hi) is
  // read straight into the result; one that reaches outside is read whole and kept, for the other
  // ranges that need it.
  at::Tensor range(const std::string& key, const Entry& e, std::int64_t lo, std::int64_t hi);
  // Lets go of the slices kept so far.
  void forget() { cache_.clear(); }
  // Bytes read from the shard files so far.
  std::uint64_t bytes_read() const { return bytes_read_; }

 private:
  static std::string slice_id(const Slice& s);
  const at::Tensor& slice_data(const std::string& key, const Entry& e, const Slice& s);  // read whole, kept
  void read_slice(const std::string& key, const Entry& e, const Slice& s, void* dst);    // checked, into dst
  std::string dir_;
  std::map<std::string, int> fds_;
  std::map<std::string, at::Tensor> cache_;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace accel::checkpoint
