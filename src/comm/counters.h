// accel::comm::Counters — calls and payload bytes per collective kind, per communicator.
// Bytes are counted in the caller's dtype, as the ZeRO traffic formulas count them:
//   all_reduce n bytes:        sent n,      received n
//   reduce_scatter N*s -> s:   sent N*s,    received s
//   all_gather s -> N*s:       sent s,      received N*s
//   broadcast n:               root sent n, others received n
// (The MPI transport sums 16-bit floats in fp32, moving twice these bytes on the wire.)
// wait_seconds: the time callers spent blocked in Work::wait (the blocking calls included) on this
// communicator's collectives, summed over waits: communication the caller did not hide.
#pragma once

#include "types.h"

#include <array>
#include <cstdint>

namespace accel::comm {

struct CollectiveCount {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

struct Counters {
  std::array<CollectiveCount, kNumCollectives> by_kind{};
  double wait_seconds = 0;

  const CollectiveCount& operator[](Collective c) const { return by_kind[static_cast<int>(c)]; }
  CollectiveCount& operator[](Collective c) { return by_kind[static_cast<int>(c)]; }
  CollectiveCount total() const;
};

}  // namespace accel::comm
