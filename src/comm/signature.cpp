// Signature: packing a collective's arguments for the cross-rank check, and the mismatch message.
#include "comm/signature.h"

#include "comm/dtype.h"

#include <fmt/format.h>

namespace accel::comm {

namespace {
const char* const kNames[Signature::kNumFields] = {"collective",      "dtype",     "input elements",
                                                   "output elements", "reduce op", "root"};
}

Signature Signature::of(const Request& r) {
  const std::int64_t f[kNumFields] = {static_cast<std::int64_t>(r.kind),
                                      r.input.defined() ? static_cast<std::int64_t>(r.input.scalar_type()) : -1,
                                      r.input.defined() ? r.input.numel() : 0,
                                      r.output.defined() ? r.output.numel() : 0,
                                      static_cast<std::int64_t>(r.op),
                                      r.kind == Collective::Broadcast ? r.root : 0};
  Signature s;
  for (int i = 0; i < kNumFields; ++i) {
    s.v[i] = f[i];
    s.v[kNumFields + i] = -f[i];
  }
  return s;
}

std::string Signature::disagreement(const Signature& mine, const std::int64_t* reduced, const std::string& what,
                                    int rank, int size) {
  for (int f = 0; f < kNumFields; ++f) {
    const std::int64_t hi = reduced[f], lo = -reduced[kNumFields + f];
    if (hi == lo) continue;
    std::string own = fmt::format("{}", mine.v[f]);
    if (f == kKind) own = to_string(static_cast<Collective>(mine.v[f]));
    if (f == kDtype) own = dtype_name(static_cast<c10::ScalarType>(mine.v[f]));
    if (f == kOp) own = to_string(static_cast<ReduceOp>(mine.v[f]));
    return fmt::format(
        "{} on rank {} of {}: ranks disagree on the {} (this rank: {}; values across ranks range {}..{}). Every "
        "rank must issue the same collectives in the same order with the same sizes, dtype, op and root.",
        what, rank, size, kNames[f], own, lo, hi);
  }
  return {};
}

}  // namespace accel::comm
