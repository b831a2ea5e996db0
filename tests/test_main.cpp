// GoogleTest main for every rank of an mpirun (or a single process). Rank 0 prints the usual report;
// other ranks print only their failures, tagged with the rank. All ranks exit with the worst result.
#include "test_world.h"

#include "base/check_args.h"
#include "base/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

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

// GoogleTest's filter patterns: '*' any run of characters, '?' one.
bool glob_matches(const std::string& pattern, const std::string& name) {
  std::size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = n;
    } else if (star != std::string::npos) {
      p = star + 1, n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}
}  // namespace
}  // namespace accel::test

int main(int argc, char** argv) {
  accel::check_args::started(argc, argv);
  // A test that desynchronizes the ranks fails within a minute instead of hanging for the default.
  setenv("ACCEL_COMM_TIMEOUT_S", "60", /*overwrite=*/0);
  // Before any tensor exists, so the memory tests see every allocation.
  accel::memory::install_counting_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  if (accel::check_args::active()) {
    // A dry run of a script's commands: each pattern of the filter must match a test (none runs; no
    // rank is formed). A union whose one pattern lost its tests to a rename is caught too.
    const std::string filter = GTEST_FLAG_GET(filter);
    const std::string positive = filter.substr(0, filter.find('-'));
    std::vector<std::string> names;
    const auto* unit = ::testing::UnitTest::GetInstance();
    for (int i = 0; i < unit->total_test_suite_count(); ++i) {
      const auto* suite = unit->GetTestSuite(i);
      for (int j = 0; j < suite->total_test_count(); ++j)
        names.push_back(std::string(suite->name()) + "." + suite->GetTestInfo(j)->name());
    }
    std::size_t at = 0;
    while (at <= positive.size()) {
      const std::size_t colon = std::min(positive.find(':', at), positive.size());
      const std::string pattern = positive.substr(at, colon - at);
      at = colon + 1;
      if (pattern.empty()) continue;
      if (std::none_of(names.begin(), names.end(),
                       [&](const std::string& n) { return accel::test::glob_matches(pattern, n); })) {
        std::fprintf(stderr, "%s: no test matches '%s' of --gtest_filter='%s'\n", argv[0], pattern.c_str(),
                     filter.c_str());
        return 1;
      }
    }
    accel::check_args::stop_here(argv[0]);
  }
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
