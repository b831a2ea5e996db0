// Accelerator::save (main process only, atomic, read back by Python's safetensors) and
// accel::get_logger (rank prefix, main-process filter, in_order, level), at world sizes 1..3.
#include "accelerator/accelerator.h"
#include "accelerator/logging.h"
#include "base/files.h"
#include "support/python.h"
#include "test_world.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace accel::test {
namespace {

namespace fs = std::filesystem;

AcceleratorOptions quiet_options() {
  AcceleratorOptions o;
  o.report_ignored_keys = false;
  return o;
}

// Python's safetensors prints name, dtype, shape and the values' sum of every tensor in the file.
std::string python_summary(const std::string& path) {
  const std::string code =
      "import sys\nfrom safetensors.numpy import load_file\n"
      "d = load_file(sys.argv[1])\n"
      "for k in sorted(d): print(k, d[k].dtype, list(d[k].shape), float(d[k].astype(\"float64\").sum()))\n";
  auto [rc, out] = run_python(ACCEL_PYTHON, "-c", "'" + code + "' '" + path + "'");
  EXPECT_EQ(rc, 0) << out;
  return out;
}

TEST(AcceleratorSave, MainProcessWritesTensorsAndTextAtomically) {
  if (!python_available(ACCEL_PYTHON)) GTEST_SKIP() << "ACCEL_PYTHON (the venv with safetensors) is not configured";
  Accelerator acc(quiet_options());
  const std::string dir = scratch_dir("save");
  // Each rank passes its own values: only rank 0's may reach the file.
  const double r = acc.process_index();
  acc.save({{"weights", at::arange(6, at::kFloat).reshape({2, 3}) + r}, {"steps", at::full({1}, 7 + r, at::kLong)}},
           dir + "/state.safetensors");
  acc.save(at::ones({4}, at::kDouble) * (r + 1), dir + "/one.safetensors");
  acc.save(std::string("epoch 3 rank ") + std::to_string(acc.process_index()), dir + "/note.txt");
  acc.wait_for_everyone();

  EXPECT_EQ(python_summary(dir + "/state.safetensors"), "steps int64 [1] 7.0\nweights float32 [2, 3] 15.0\n");
  EXPECT_EQ(python_summary(dir + "/one.safetensors"), "tensor float64 [4] 4.0\n");
  EXPECT_EQ(files::read_file(dir + "/note.txt"), "epoch 3 rank 0");
  // No temporaries left behind.
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().extension(), ".tmp") << e.path();

  // A save that cannot be written fails on the main process naming the path, and leaves the old file.
  acc.wait_for_everyone();
  if (acc.is_main_process()) {
    try {
      acc.save(std::string("x"), dir + "/missing/note.txt");
      ADD_FAILURE() << "no error for a missing directory";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(dir + "/missing/note.txt"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_NO_THROW(acc.save(std::string("x"), dir + "/missing/note.txt"));  // not the main process: nothing
  }
  EXPECT_EQ(files::read_file(dir + "/note.txt"), "epoch 3 rank 0");
}

// Runs `body` with this process's stderr appended to `path` (O_APPEND: the lines of every rank land
// in the order they were written), then puts stderr back.
template <class F>
void with_stderr_to(const std::string& path, F body) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ASSERT_GE(fd, 0) << path;
  ::dup2(fd, 2);
  ::close(fd);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::string line;
  for (char c : text) {
    if (c == '\n') {
      out.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  return out;
}

TEST(Logger, RankPrefixMainProcessFilterInOrderAndLevel) {
  auto w = world();
  const int n = w->size(), me = w->rank();
  const std::string log = scratch_dir("logger") + "/stderr.log";
  auto logger = get_logger("train", log::Level::Info);
  with_stderr_to(log, [&] {
    logger.info("hello from the main process");
    w->barrier();
    // Rank 0 waits before writing: without in_order the other ranks' lines would come first.
    if (me == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    logger.info("rank " + std::to_string(me) + " in order", {.main_process_only = false, .in_order = true});
    w->barrier();
    logger.debug("below the level", {.main_process_only = false});
    logger.warning("warned by every rank", {.main_process_only = false});
    w->barrier();
  });
  w->barrier();
  const auto lines = lines_of(files::read_file(log));
  const std::regex shape(R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[train rank (\d+)/(\d+)\] \[(\w+)\] (.*))");
  std::vector<int> in_order_ranks;
  int hello = 0, warned = 0;
  for (const auto& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, shape)) << "a line not in the logger's shape: " << line;
    EXPECT_EQ(std::stoi(m[2]), n) << line;
    const int rank = std::stoi(m[1]);
    const std::string level = m[3], text = m[4];
    EXPECT_NE(text, "below the level");
    if (text == "hello from the main process") {
      ++hello;
      EXPECT_EQ(rank, 0);
      EXPECT_EQ(level, "info");
    } else if (text.ends_with(" in order")) {
      EXPECT_EQ(text, "rank " + std::to_string(rank) + " in order");
      in_order_ranks.push_back(rank);
    } else if (text == "warned by every rank") {
      ++warned;
      EXPECT_EQ(level, "warning");
    } else {
      ADD_FAILURE() << "unexpected line: " << line;
    }
  }
  EXPECT_EQ(hello, 1);
  EXPECT_EQ(warned, n);
  std::vector<int> expected(n);
  for (int r = 0; r < n; ++r) expected[r] = r;
  EXPECT_EQ(in_order_ranks, expected);
}

TEST(Logger, LevelStartsAtTheEnvironmentsAndGetLoggerSetsIt) {
  // The ctest environment leaves ACCEL_LOG_LEVEL unset unless a test sets it (see CMake).
  const log::Level from_env =
      log::parse_level(std::getenv("ACCEL_LOG_LEVEL") ? std::getenv("ACCEL_LOG_LEVEL") : "warning");
  auto fresh = get_logger("fresh");
  EXPECT_EQ(fresh.enabled(log::Level::Info), from_env <= log::Level::Info);
  EXPECT_EQ(fresh.enabled(log::Level::Warning), from_env <= log::Level::Warning);
  auto loud = get_logger("loud", log::Level::Debug);
  EXPECT_TRUE(loud.enabled(log::Level::Debug));
  EXPECT_TRUE(get_logger("loud").enabled(log::Level::Debug));  // one level per name
  get_logger("loud", log::Level::Error);
  EXPECT_FALSE(loud.enabled(log::Level::Warning));
}

}  // namespace
}  // namespace accel::test
