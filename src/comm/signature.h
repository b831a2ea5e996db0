// accel::comm — the fields every rank must agree on before a collective moves data (kind, dtype,
// sizes, op, root), and the one MismatchError message when they do not. Shared by the MPI check
// (one small all-reduce) and the shared-memory transport (signatures posted in the control block).
#pragma once

#include "comm/transport/backend.h"

#include <string>

namespace accel::comm {

enum SigField { kSigKind, kSigDtype, kSigInNumel, kSigOutNumel, kSigOp, kSigRoot, kNumSig };

// This rank's signature of the request.
void make_signature(const Request& r, long long sig[kNumSig]);

// Throws MismatchError on the first field where the lowest and highest values across ranks differ;
// `what` names the collective, rank/size this rank in its group.
void verify_signature(const long long mine[kNumSig], const long long lo[kNumSig], const long long hi[kNumSig],
                      const std::string& what, int rank, int size);

}  // namespace accel::comm
