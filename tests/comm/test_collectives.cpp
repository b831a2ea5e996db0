// Every collective x dtype x size, in place and out of place, sync and async, against closed forms.
#include "test_world.h"

#include "comm/dtype.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>

using namespace accel::comm;
using accel::test::world;

namespace {

const std::vector<at::ScalarType> kReducible = {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf,
                                                at::kInt,    at::kLong,  at::kByte};
const std::vector<at::ScalarType> kAllDtypes = {at::kDouble, at::kFloat, at::kBFloat16,      at::kHalf,       at::kInt,
                                                at::kLong,   at::kByte,  at::kFloat8_e4m3fn, at::kFloat8_e5m2};
// Per-rank element counts: 0, 1, odd, not divisible by 2/3/4, large enough for several MPI segments.
const std::vector<int64_t> kSizes = {0, 1, 7, 1001, 65537};

struct Case {
  at::ScalarType dtype;
  int64_t k;
  bool in_place;
  bool async;
};

std::string case_name(const ::testing::TestParamInfo<std::tuple<at::ScalarType, int64_t, bool, bool>>& i) {
  auto [d, k, ip, as] = i.param;
  return std::string(c10::toString(d)) + "_k" + std::to_string(k) + (ip ? "_inplace" : "_outofplace") +
         (as ? "_async" : "_sync");
}

class Collectives : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, bool, bool>> {
 protected:
  Case c() const {
    auto [d, k, ip, as] = GetParam();
    return {d, k, ip, as};
  }
  static at::TensorOptions opts(at::ScalarType d) { return at::TensorOptions().dtype(d); }
  // Small integers in 1..5: every dtype holds them and sums up to 4 ranks exactly.
  static at::Tensor pattern(int64_t n, at::ScalarType d) { return at::arange(n, at::kLong).remainder(5).add(1).to(d); }
  static void expect_equal(const at::Tensor& got, const at::Tensor& want) {
    ASSERT_EQ(got.numel(), want.numel());
    if (got.numel() == 0) return;
    at::Tensor g = got.to(at::kDouble).flatten(), w = want.to(at::kDouble).flatten();
    if (!at::equal(g, w)) {
      auto bad = (g != w).nonzero();
      int64_t i = bad[0].item<int64_t>();
      FAIL() << bad.size(0) << " of " << g.numel() << " elements differ; first at " << i << ": got "
             << g[i].item<double>() << ", want " << w[i].item<double>();
    }
  }
  static void run(const WorkPtr& w, bool async) {
    if (async) {
      EXPECT_NO_THROW(w->wait());
      EXPECT_TRUE(w->is_completed());
      EXPECT_EQ(w->exception(), nullptr);
    }
  }
};

// Reductions over every reducible dtype; movement (gather, broadcast) over every dtype, fp8 included.
class Reductions : public Collectives {};
class Movement : public Collectives {};

TEST_P(Reductions, AllReduceSum) {
  auto [d, k, in_place, async] = c();
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  at::Tensor in = pattern(k, d).mul(r + 1).to(d);
  at::Tensor out = in_place ? in : at::full({k}, 99, opts(d));
  if (async) {
    run(in_place ? comm->all_reduce_async(in) : comm->all_reduce_async(in, out), true);
  } else {
    in_place ? comm->all_reduce(in) : comm->all_reduce(in, out);
  }
  expect_equal(out, pattern(k, at::kDouble).mul(n * (n + 1) / 2));
  if (!in_place) expect_equal(in, pattern(k, at::kDouble).mul(r + 1));  // input untouched
}

TEST_P(Reductions, AllReduceAvgMaxMin) {
  auto [d, k, in_place, async] = c();
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  // max/min: element i on rank q is (q*3 + i) % 7; the expectation is computed rank by rank here.
  at::Tensor base = at::arange(k, at::kLong);
  at::Tensor mx = base.add(r * 3).remainder(7).to(d), mn = mx.clone();
  at::Tensor want_max = at::full({k}, -1, at::kLong), want_min = at::full({k}, 100, at::kLong);
  for (int q = 0; q < n; ++q) {
    at::Tensor v = base.add(q * 3).remainder(7);
    want_max = at::maximum(want_max, v);
    want_min = at::minimum(want_min, v);
  }
  at::Tensor mx_out = in_place ? mx : at::empty({k}, opts(d));
  at::Tensor mn_out = in_place ? mn : at::empty({k}, opts(d));
  auto w1 = comm->all_reduce_async(mx, mx_out, {ReduceOp::Max});
  auto w2 = comm->all_reduce_async(mn, mn_out, {ReduceOp::Min});
  if (!async) {
    w1->wait();
    w2->wait();
  } else {
    run(w2, true);  // out of issue order on purpose
    run(w1, true);
  }
  expect_equal(mx_out, want_max);
  expect_equal(mn_out, want_min);
  if (classify(d) == DtypeClass::Integer) return;  // avg needs a floating dtype (see Misuse)
  // avg of (r+1) * p over ranks = p * (n+1)/2, rounded once into the dtype.
  at::Tensor av = pattern(k, d).mul(r + 1).to(d);
  at::Tensor av_out = in_place ? av : at::empty({k}, opts(d));
  auto w3 = comm->all_reduce_async(av, av_out, {ReduceOp::Avg});
  w3->wait();
  expect_equal(av_out, pattern(k, at::kDouble).mul((n + 1) / 2.0).to(d));
}

TEST_P(Reductions, ReduceScatter) {
  auto [d, k, in_place, async] = c();
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  at::Tensor in = pattern(n * k, d).mul(r + 1).to(d);
  at::Tensor out = in_place ? in.narrow(0, r * k, k) : at::empty({k}, opts(d));
  auto w = comm->reduce_scatter_async(in, out);
  if (async)
    run(w, true);
  else
    w->wait();
  expect_equal(out, pattern(n * k, at::kDouble).narrow(0, r * k, k).mul(n * (n + 1) / 2));
}

TEST_P(Movement, AllGather) {
  auto [d, k, in_place, async] = c();
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  // rank q contributes (q*k + i) % 61: distinct per rank, exact in every dtype (fp8 included).
  auto contribution = [&](int q, at::ScalarType t) { return at::arange(k, at::kLong).add(q * k).remainder(61).to(t); };
  at::Tensor out = at::zeros({n * k}, opts(d));
  at::Tensor in = in_place ? out.narrow(0, r * k, k) : contribution(r, d);
  if (in_place) in.copy_(contribution(r, d));
  auto w = comm->all_gather_async(in, out);
  if (async)
    run(w, true);
  else
    w->wait();
  std::vector<at::Tensor> parts;
  for (int q = 0; q < n; ++q) parts.push_back(contribution(q, d));
  at::Tensor want = at::cat(parts);
  // byte-exact, whatever the dtype
  EXPECT_TRUE(at::equal(out.view(at::kByte), want.view(at::kByte)));
  if (classify(d) != DtypeClass::Fp8) expect_equal(out, want);
}

TEST_P(Movement, Broadcast) {
  auto [d, k, in_place, async] = c();
  (void)in_place;  // broadcast is in place by nature
  auto comm = world();
  const int n = comm->size(), r = comm->rank(), root = n - 1;
  at::Tensor want = at::arange(k, at::kLong).add(3).remainder(50).to(d);
  at::Tensor t = r == root ? want.clone() : at::zeros({k}, opts(d));
  auto w = comm->broadcast_async(t, {root});
  if (async)
    run(w, true);
  else
    w->wait();
  EXPECT_TRUE(at::equal(t.view(at::kByte), want.view(at::kByte)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Reductions,
                         ::testing::Combine(::testing::ValuesIn(kReducible), ::testing::ValuesIn(kSizes),
                                            ::testing::Bool(), ::testing::Bool()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Dtypes, Movement,
                         ::testing::Combine(::testing::ValuesIn(kAllDtypes), ::testing::ValuesIn(kSizes),
                                            ::testing::Bool(), ::testing::Bool()),
                         case_name);

// 16-bit sums are accumulated in fp32 and rounded once: rank 0 adds 256 (2048 for fp16), the others
// 1 each. Rounding at every hop would lose each +1; one rounding of the exact sum keeps it.
TEST(HalfPrecisionSums, RoundedOnceFromExactSum) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (auto [d, big] : {std::pair{at::kBFloat16, 256.0}, std::pair{at::kHalf, 2048.0}}) {
    at::Tensor t = at::full({3}, r == 0 ? big : 1.0, at::TensorOptions().dtype(d));
    comm->all_reduce(t);
    double exact = big + (n - 1);
    at::Tensor want = at::full({3}, exact, at::kDouble).to(d);
    EXPECT_TRUE(at::equal(t, want)) << c10::toString(d) << ": got " << t[0].item<double>() << ", want "
                                    << want[0].item<double>() << " (exact " << exact << ")";
    // reduce_scatter takes the same path
    at::Tensor in = at::full({3 * n}, r == 0 ? big : 1.0, at::TensorOptions().dtype(d));
    at::Tensor out = at::empty({3}, in.options());
    comm->reduce_scatter(in, out);
    EXPECT_TRUE(at::equal(out, want));
  }
}

TEST(Barrier, SyncAndAsync) {
  auto comm = world();
  comm->barrier();
  auto w = comm->barrier_async();
  w->wait();
  EXPECT_TRUE(w->is_completed());
}

// The progress thread moves collectives without the caller calling into MPI: an async all_reduce
// completes while this thread only sleeps and polls is_completed().
TEST(Progress, AsyncCompletesWithoutWait) {
  auto comm = world();
  const int n = comm->size();
  at::Tensor t = at::ones({1 << 20}, at::kFloat);
  auto w = comm->all_reduce_async(t);
  bool done = false;
  for (int i = 0; i < 2000 && !(done = w->is_completed()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(done);
  w->wait();
  EXPECT_TRUE(at::equal(t, at::full({1 << 20}, n, at::kFloat)));
}

// Several collectives in flight at once complete in any wait order with the right results.
TEST(Progress, ManyInFlight) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  std::vector<at::Tensor> ts;
  std::vector<WorkPtr> ws;
  for (int i = 0; i < 16; ++i) {
    ts.push_back(at::full({100 + i * 37}, r + i, at::kDouble));
    ws.push_back(comm->all_reduce_async(ts.back()));
  }
  for (int i = 15; i >= 0; --i) {
    ws[i]->wait();
    EXPECT_TRUE(at::equal(ts[i], at::full({100 + i * 37}, n * (n - 1) / 2.0 + n * i, at::kDouble))) << i;
  }
}

}  // namespace
