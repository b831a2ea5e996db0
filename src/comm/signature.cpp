// Cross-rank signatures: what is compared and how a disagreement is reported.
#include "comm/signature.h"

#include "comm/dtype.h"

#include <fmt/format.h>

namespace accel::comm {

static const char* const kSigNames[kNumSig] = {"collective",      "dtype",     "input elements",
                                               "output elements", "reduce op", "root"};

void make_signature(const Request& r, long long sig[kNumSig]) {
  sig[kSigKind] = static_cast<long long>(r.kind);
  sig[kSigDtype] = r.input.defined() ? static_cast<long long>(r.input.scalar_type()) : -1;
  sig[kSigInNumel] = r.input.defined() ? r.input.numel() : 0;
  sig[kSigOutNumel] = r.output.defined() ? r.output.numel() : 0;
  sig[kSigOp] = static_cast<long long>(r.op);
  sig[kSigRoot] = r.kind == Collective::Broadcast ? r.root : 0;
}

void verify_signature(const long long mine[kNumSig], const long long lo[kNumSig], const long long hi[kNumSig],
                      const std::string& what, int rank, int size) {
  for (int f = 0; f < kNumSig; ++f) {
    if (hi[f] == lo[f]) continue;
    std::string m = fmt::format("{}", mine[f]);
    if (f == kSigKind) m = to_string(static_cast<Collective>(mine[f]));
    if (f == kSigDtype) m = dtype_name(static_cast<c10::ScalarType>(mine[f]));
    if (f == kSigOp) m = to_string(static_cast<ReduceOp>(mine[f]));
    throw MismatchError(fmt::format(
        "{} on rank {} of {}: ranks disagree on the {} (this rank: {}; values across ranks range {}..{}). Every "
        "rank must issue the same collectives in the same order with the same sizes, dtype, op and root.",
        what, rank, size, kSigNames[f], m, lo[f], hi[f]));
  }
}

}  // namespace accel::comm
