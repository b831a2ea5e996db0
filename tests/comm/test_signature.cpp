// comm signatures (signature.h): what the cross-rank check compares (kind, dtype, counts, op, root)
// and the sentence a disagreement raises, for two simulated ranks whose signatures are combined into
// per-field minima and maxima by hand, as the MPI, shared-memory and NCCL transports combine them.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/signature.h"

#include <algorithm>
#include <string>

namespace accel::comm {
namespace {

Request all_reduce(int64_t n, at::ScalarType t = at::kFloat, ReduceOp op = ReduceOp::Sum) {
  Request r;
  r.kind = Collective::AllReduce;
  r.input = r.output = at::zeros({n}, t);
  r.op = op;
  return r;
}

// The MismatchError message this rank (`mine`) raises against `other`, or "" when they agree.
std::string check(const Request& mine, const Request& other) {
  long long a[kNumSig], b[kNumSig], lo[kNumSig], hi[kNumSig];
  make_signature(mine, a);
  make_signature(other, b);
  for (int i = 0; i < kNumSig; ++i) {
    lo[i] = std::min(a[i], b[i]);
    hi[i] = std::max(a[i], b[i]);
  }
  try {
    verify_signature(a, lo, hi, "all_reduce(test)", 0, 2);
  } catch (const MismatchError& e) {
    return e.what();
  }
  return "";
}

TEST(Signature, AgreementIsSilentAndEachFieldIsNamed) {
  EXPECT_EQ(check(all_reduce(8), all_reduce(8)), "");
  const std::string n = check(all_reduce(8), all_reduce(9));
  EXPECT_NE(n.find("input elements (this rank: 8; values across ranks range 8..9)"), std::string::npos) << n;
  EXPECT_NE(n.find("rank 0 of 2"), std::string::npos) << n;
  const std::string d = check(all_reduce(8, at::kFloat), all_reduce(8, at::kBFloat16));
  EXPECT_NE(d.find("dtype (this rank: float32"), std::string::npos) << d;
  const std::string o = check(all_reduce(8, at::kFloat, ReduceOp::Max), all_reduce(8));
  EXPECT_NE(o.find("reduce op (this rank: max"), std::string::npos) << o;
  Request b1, b2;
  b1.kind = b2.kind = Collective::Broadcast;
  b1.input = b1.output = b2.input = b2.output = at::zeros({4});
  b1.root = 0;
  b2.root = 1;
  const std::string rt = check(b1, b2);
  EXPECT_NE(rt.find("root (this rank: 0; values across ranks range 0..1)"), std::string::npos) << rt;
  // The root only matters to a broadcast.
  Request a1 = all_reduce(4), a2 = all_reduce(4);
  a2.root = 3;
  EXPECT_EQ(check(a1, a2), "");
}

}  // namespace
}  // namespace accel::comm
