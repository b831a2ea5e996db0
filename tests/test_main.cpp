// GoogleTest main for every rank of an mpirun (or a single process). Rank 0 prints the usual report;
// other ranks print only their failures, tagged with the rank. All ranks exit with the worst result.
#include "test_world.h"

#include "base/check_args.h"
#include "base/files.h"
#include "base/memory.h"
#include "comm/broadcast_text.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

namespace accel::test {

static std::shared_ptr<comm::Communicator> g_world;
std::shared_ptr<comm::Communicator> world() { return g_world; }

static std::string g_job_dir;  // empty until a test asks for a scratch directory

std::string scratch_dir(const std::string& name) {
  if (g_job_dir.empty()) {  // rank 0's name for it, under rank 0's $TMPDIR, sent to every rank
    std::string mine;
    if (g_world->rank() == 0) {
      const char* tmp = std::getenv("TMPDIR");
      mine = std::string(tmp && *tmp ? tmp : "/tmp") + "/accel_test_np" + std::to_string(g_world->size()) + "_" +
             std::to_string(::getpid());
    }
    g_job_dir = comm::broadcast_text(*g_world, mine);
  }
  const std::string dir = g_job_dir + "/" + name;
  if (g_world->rank() == 0) {  // (base/files.h, not std::filesystem: libtorch's copy of remove_all crashes)
    files::remove_tree(dir);
    files::make_dirs(dir);
  }
  g_world->barrier();
  return dir;
}

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

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= s.size();) {
    const std::size_t next = std::min(s.find(sep, at), s.size());
    out.push_back(s.substr(at, next - at));
    at = next + 1;
  }
  return out;
}

// ACCEL_CHECK_ARGS: whether a test binary's command line would run tests, as a script means it to. Every
// argument a GoogleTest flag it knows (a misspelt one, or --help, makes GoogleTest print its help and
// run nothing, successfully), and --gtest_filter selecting tests: each of its positive patterns matching
// one (a union whose one pattern lost its tests to a rename is caught too), some test left after the
// negative ones (GoogleTest's rules: the positive part before the first '-', empty meaning '*' only
// when a negative part follows). Says why on stderr when not.
bool arguments_select_tests(const std::vector<std::string>& args, const char* program) {
  static const std::set<std::string> known = {"filter",
                                              "also_run_disabled_tests",
                                              "fail_fast",
                                              "repeat",
                                              "shuffle",
                                              "random_seed",
                                              "color",
                                              "brief",
                                              "print_time",
                                              "print_utf8",
                                              "output",
                                              "list_tests",
                                              "break_on_failure",
                                              "catch_exceptions",
                                              "death_test_style",
                                              "death_test_use_fork",
                                              "stack_trace_depth",
                                              "throw_on_failure",
                                              "flagfile",
                                              "stream_result_to",
                                              "recreate_environments_when_repeating",
                                              "install_failure_signal_handler"};
  for (const std::string& a : args) {
    const std::size_t dashes = a.rfind("--gtest_", 0) == 0 ? 2 : a.rfind("-gtest_", 0) == 0 ? 1 : 0;
    const std::string name = dashes ? a.substr(dashes + 6, a.find('=') - dashes - 6) : "";
    if (!dashes || !known.count(name)) {
      std::fprintf(stderr, "%s: '%s' is not a GoogleTest flag (GoogleTest would print its help and run nothing)\n",
                   program, a.c_str());
      return false;
    }
  }
  const std::string filter = GTEST_FLAG_GET(filter);
  const std::size_t minus = filter.find('-');
  const std::string positive = filter.substr(0, minus);
  const std::vector<std::string> negative =
      minus == std::string::npos ? std::vector<std::string>{} : split(filter.substr(minus + 1), ':');
  const std::vector<std::string> patterns =
      positive.empty() && minus != std::string::npos ? std::vector<std::string>{"*"} : split(positive, ':');
  std::vector<std::string> names;
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit->total_test_suite_count(); ++i) {
    const auto* suite = unit->GetTestSuite(i);
    for (int j = 0; j < suite->total_test_count(); ++j)
      names.push_back(std::string(suite->name()) + "." + suite->GetTestInfo(j)->name());
  }
  auto any = [](const std::vector<std::string>& pats, const std::string& n) {
    return std::any_of(pats.begin(), pats.end(), [&](const std::string& p) { return glob_matches(p, n); });
  };
  for (const std::string& pattern : patterns)
    if (!pattern.empty() &&
        std::none_of(names.begin(), names.end(), [&](const std::string& n) { return glob_matches(pattern, n); })) {
      std::fprintf(stderr, "%s: no test matches '%s' of --gtest_filter='%s'\n", program, pattern.c_str(),
                   filter.c_str());
      return false;
    }
  if (std::none_of(names.begin(), names.end(),
                   [&](const std::string& n) { return any(patterns, n) && !any(negative, n); })) {
    std::fprintf(stderr, "%s: --gtest_filter='%s' selects no test\n", program, filter.c_str());
    return false;
  }
  return true;
}
}  // namespace
}  // namespace accel::test

int main(int argc, char** argv) {
  accel::check_args::started(argc, argv);
  const std::vector<std::string> original_args(argv + 1, argv + argc);
  // A test that desynchronizes the ranks fails within a minute instead of hanging for the default.
  setenv("ACCEL_COMM_TIMEOUT_S", "60", /*overwrite=*/0);
  // Before any tensor exists, so the memory tests see every allocation.
  accel::memory::install_counting_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  if (accel::check_args::active()) {  // (a dry run of a script's commands: none runs, no rank is formed)
    if (!accel::test::arguments_select_tests(original_args, argv[0])) return 1;
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
  // Kept when a test failed (or ACCEL_KEEP_TEST_FILES is set), to look at.
  if (rank == 0 && !accel::test::g_job_dir.empty()) {
    const char* keep = std::getenv("ACCEL_KEEP_TEST_FILES");
    if (worst.item<int>() == 0 && !(keep && *keep))
      accel::files::remove_tree(accel::test::g_job_dir);
    else
      std::fprintf(stderr, "test files kept in %s\n", accel::test::g_job_dir.c_str());
  }
  accel::test::g_world.reset();
  return worst.item<int>();
}
