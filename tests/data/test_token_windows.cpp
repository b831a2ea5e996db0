// accel::data (src/data/): token files written by NumPy (tests/data/write_tokens.py, token i =
// (7i + 3) mod M) read back through the mapping, cut into packed windows and document rows, and bad
// files refused by name. One process.
#include "data/token_windows.h"

#include "base/error.h"
#include "base/files.h"
#include "support/errors.h"
#include "support/python.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#ifndef ACCEL_PYTHON
#define ACCEL_PYTHON ""
#endif

namespace accel::data {
namespace {

constexpr std::int64_t kTokens = 1000;

std::int64_t expected_token(std::int64_t i, std::int64_t modulus) { return (i * 7 + 3) % modulus; }

class TokenFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::string(ACCEL_BINARY_DIR) + "/token_files";
    if (!test::python_available(ACCEL_PYTHON)) return;
    auto [rc, out] = test::run_python(ACCEL_PYTHON, std::string(ACCEL_SOURCE_DIR) + "/tests/data/write_tokens.py",
                                      "'" + dir_ + "' " + std::to_string(kTokens));
    std::printf("%s", out.c_str());
    written_ = rc == 0;
  }
  void SetUp() override {
    if (!test::python_available(ACCEL_PYTHON)) GTEST_SKIP() << "ACCEL_PYTHON (with numpy) not configured";
    ASSERT_TRUE(written_) << "write_tokens.py failed (its output is above)";
  }
  static std::string path(const std::string& name) { return dir_ + "/" + name; }
  static inline std::string dir_;
  static inline bool written_ = false;
};

TEST_F(TokenFiles, EveryDtypeReadsWhatNumpyWrote) {
  struct Case {
    const char* name;
    TokenDtype bin_dtype, dtype;
    std::int64_t modulus;
  };
  for (const Case& c : {Case{"u16.npy", TokenDtype::UInt16, TokenDtype::UInt16, 50000},
                        Case{"u32.npy", TokenDtype::UInt16, TokenDtype::UInt32, 100003},
                        Case{"i32.npy", TokenDtype::UInt16, TokenDtype::Int32, 100003},
                        Case{"i64.npy", TokenDtype::UInt16, TokenDtype::Int64, 100003},
                        Case{"u16.bin", TokenDtype::UInt16, TokenDtype::UInt16, 50000},
                        Case{"u32.bin", TokenDtype::UInt32, TokenDtype::UInt32, 100003}}) {
    SCOPED_TRACE(c.name);
    const TokenFile f = TokenFile::open(path(c.name), c.bin_dtype);
    EXPECT_EQ(f.dtype(), c.dtype);  // an .npy's header decides, a .bin's option
    ASSERT_EQ(f.size(), kTokens);
    for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, std::int64_t{9364 % kTokens}, kTokens - 1})
      EXPECT_EQ(f.at(i), expected_token(i, c.modulus)) << "token " << i;
    const auto some = f.read(500, 20);
    for (std::int64_t k = 0; k < 20; ++k)
      EXPECT_EQ(some[static_cast<std::size_t>(k)], expected_token(500 + k, c.modulus));
  }
}

TEST_F(TokenFiles, PackedWindowsAreTheFileShiftedByOne) {
  TokenWindows w(TokenFile::open(path("u32.npy")), {.seq_len = 16});
  ASSERT_EQ(*w.size(), static_cast<std::size_t>((kTokens - 1) / 16));  // 62: the last token only a target
  for (std::size_t i : {std::size_t{0}, std::size_t{7}, *w.size() - 1}) {
    auto ex = w.get(i);
    ASSERT_EQ(ex.data.sizes(), at::IntArrayRef({16}));
    ASSERT_EQ(ex.data.scalar_type(), at::kLong);
    for (std::int64_t t = 0; t < 16; ++t) {
      const std::int64_t pos = static_cast<std::int64_t>(i) * 16 + t;
      EXPECT_EQ(ex.data[t].item<std::int64_t>(), expected_token(pos, 100003));
      EXPECT_EQ(ex.target[t].item<std::int64_t>(), expected_token(pos + 1, 100003));
    }
  }
  // A range of the file: [900, 1000) holds (100 - 1) / 16 = 6 windows, the first starting at 900.
  TokenWindows tail(TokenFile::open(path("u32.npy")), {.seq_len = 16, .begin = 900});
  EXPECT_EQ(*tail.size(), 6u);
  EXPECT_EQ(tail.get(0).data[0].item<std::int64_t>(), expected_token(900, 100003));
  EXPECT_THROW(tail.get(6), OutOfRangeError);
}

// Documents end at each eos token (kept); a row is a document's first seq_len + 1 tokens, padded with
// pad_token_id in the input and -100 in the target. Tokens (7i + 3) mod 50000 take the value 24 at
// i = 3 only (7 is invertible mod 50000), so eos 24 splits [0, 1000) into a 4-token document and a
// 996-token one.
TEST_F(TokenFiles, DocumentRowsArePaddedAfterTheirEnd) {
  TokenWindows w(TokenFile::open(path("u16.npy")), {.seq_len = 8, .eos_token_id = 24, .pad_token_id = 7});
  ASSERT_EQ(*w.size(), 2u);
  auto first = w.get(0);  // tokens 0..3 = 3, 10, 17, 24(eos)
  EXPECT_TRUE(at::equal(first.data, at::tensor({3, 10, 17, 24, 7, 7, 7, 7}, at::kLong)));
  EXPECT_TRUE(at::equal(first.target, at::tensor({10, 17, 24, -100, -100, -100, -100, -100}, at::kLong)));
  auto second = w.get(1);  // tokens 4..12: truncated to seq_len + 1
  EXPECT_EQ(w.row_start(1), 4);
  for (std::int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(second.data[t].item<std::int64_t>(), expected_token(4 + t, 50000));
    EXPECT_EQ(second.target[t].item<std::int64_t>(), expected_token(5 + t, 50000));
  }
}

TEST_F(TokenFiles, BadFilesAreRefusedByName) {
  auto two_d = test::message_of<InvalidArgumentError>([] { TokenFile::open(path("two_d.npy")); });
  EXPECT_NE(two_d.find("two_d.npy: shape (2, 500): expected a one-dimensional array"), std::string::npos) << two_d;
  auto f32 = test::message_of<InvalidArgumentError>([] { TokenFile::open(path("f32.npy")); });
  EXPECT_NE(f32.find("f32.npy: dtype '<f4' is not a token dtype"), std::string::npos) << f32;
  const std::string odd = dir_ + "/odd.bin";
  files::write_file_atomic(odd, "abc", 3);
  auto o = test::message_of<InvalidArgumentError>([&] { TokenFile::open(odd, TokenDtype::UInt16); });
  EXPECT_NE(o.find("odd.bin: 3 bytes of tokens are not a whole number of uint16 tokens"), std::string::npos) << o;
  auto small =
      test::message_of<InvalidArgumentError>([] { TokenWindows(TokenFile::open(path("u16.bin")), {.seq_len = 1000}); });
  EXPECT_NE(small.find("1000 tokens in [0, 1000) make no window of 1000 + 1 tokens"), std::string::npos) << small;
  auto range = test::message_of<InvalidArgumentError>(
      [] { TokenWindows(TokenFile::open(path("u16.bin")), {.seq_len = 4, .begin = 10, .end = 2000}); });
  EXPECT_NE(range.find("the range [10, 2000) is not within its 1000 tokens"), std::string::npos) << range;
  EXPECT_NE(test::message_of<InvalidArgumentError>([] {
              parse_dtype("float32");
            }).find("expected uint16, uint32, int32 or int64"),
            std::string::npos);
}

}  // namespace
}  // namespace accel::data
