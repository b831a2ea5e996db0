// accel::comm::Signature — what every rank of a group must agree on for one collective (kind, dtype,
// element counts, op, root), packed so that one MAX all-reduce of [fields | -fields] yields each
// field's maximum and minimum across ranks. Backends compare the two to raise MismatchError on every
// rank alike (the MPI transport over its check communicator, NCCL with a tiny all-reduce on its
// stream). Internal to src/comm.
#pragma once

#include "backend.h"

#include <cstdint>
#include <string>

namespace accel::comm {

struct Signature {
  enum Field { kKind, kDtype, kInNumel, kOutNumel, kOp, kRoot, kNumFields };
  // [fields | negated fields]: after a MAX all-reduce, max = v[f] and min = -v[kNumFields + f].
  std::int64_t v[2 * kNumFields] = {};

  static Signature of(const Request& r);
  // After the all-reduce: empty when every rank agreed, else the sentence for MismatchError.
  // `mine` is this rank's own signature (before the all-reduce).
  static std::string disagreement(const Signature& mine, const std::int64_t* reduced, const std::string& what, int rank,
                                  int size);
};

}  // namespace accel::comm
