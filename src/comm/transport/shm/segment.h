// accel::comm::shm — the shared-memory segment of one group (shm_backend.h): every rank's control
// block (its counters, posted signature and single-copy addresses), then each rank's two chunk
// buffers. Internal.
#pragma once

#include "comm/signature.h"

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace accel::comm::shm {

using Counter = std::atomic<std::uint64_t>;
static_assert(Counter::is_always_lock_free, "shared-memory counters must be lock-free (address-free)");

// One rank's control block, on cache lines of its own; only that rank writes it. The counters count
// chunks over the group's whole life, so they never need resetting between collectives.
struct alignas(128) RankCtl {
  Counter in_step;   // chunks this rank has copied into its buffer
  Counter red_step;  // chunks whose reduced slice this rank has written to its buffer (all_reduce)
  Counter out_step;  // chunks this rank has finished reading from its peers' buffers
  // The signature of a collective, posted with its first chunk (by collective parity: a rank writes
  // the next-but-one only once every peer is done with this one's first chunk, so with it).
  long long sig[2][kNumSig];
  // Single copy (cross-memory attach): this rank's pid, and where the tensor its peers read in the
  // current single-copy collective lies in its own address space (a broadcast's root tensor, an
  // all_gather's or reduce_scatter's input; published by in_step).
  std::int64_t pid;
  std::uint64_t src_addr;
  std::int64_t world_rank;  // for messages: the rank a stuck peer is named by
  // A reduce_scatter whose input lies in node-shared memory (node_shared.h): where, as (key, offset),
  // so the peers read it in place; key 0 when it goes through this rank's buffers. By collective
  // parity, like sig, and published with the first chunk.
  std::uint64_t in_key[2], in_off[2];
};

constexpr int kBuffers = 2;

// The mapping: `size` control blocks, then each rank's two chunk buffers.
class Segment {
 public:
  Segment(void* base, std::size_t bytes, int size, std::size_t chunk)
      : base_(static_cast<char*>(base)), bytes_(bytes), size_(size), chunk_(chunk) {}
  ~Segment() { munmap(base_, bytes_); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  static std::size_t ctl_bytes(int size) { return (size * sizeof(RankCtl) + 4095) / 4096 * 4096; }
  static std::size_t total_bytes(int size, std::size_t chunk) {
    return ctl_bytes(size) + static_cast<std::size_t>(size) * kBuffers * chunk;
  }
  RankCtl& ctl(int r) { return reinterpret_cast<RankCtl*>(base_)[r]; }
  char* buf(int r, int b) { return base_ + ctl_bytes(size_) + (static_cast<std::size_t>(r) * kBuffers + b) * chunk_; }
  std::size_t chunk() const { return chunk_; }

 private:
  char* base_;
  std::size_t bytes_;
  int size_;
  std::size_t chunk_;
};

}  // namespace accel::comm::shm
