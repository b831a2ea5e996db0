// GoogleTest main for every rank of an mpirun (or a single process). Rank 0 prints the usual report;
// other ranks print only their failures, tagged with the rank. All ranks exit with the worst result.
#include "test_world.h"

#include "base/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace accel::test {

static std::shared_ptr<comm::Communicator> g_world;
std::shared_ptr<comm::Communicator> world() { return g_world; }

namespace {
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};
}  // namespace
}  // namespace accel::test

int main(int argc, char** argv) {
  // A test that desynchronizes the ranks fails within a minute instead of hanging for the default.
  setenv("ACCEL_COMM_TIMEOUT_S", "60", /*overwrite=*/0);
  // Before any tensor exists, so the memory tests see every allocation.
  accel::memory::install_counting_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  accel::test::g_world = accel::comm::Communicator::world();
  const int rank = accel::test::g_world->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new accel::test::RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  at::Tensor worst = at::full({1}, rc, at::kInt);
  accel::test::g_world->all_reduce(worst, {accel::comm::ReduceOp::Max});
  accel::test::g_world.reset();
  return worst.item<int>();
}
