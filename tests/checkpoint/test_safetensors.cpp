// The safetensors reader/writer (src/checkpoint/safetensors.h): round trips over every dtype, files
// exchanged with the real Python `safetensors` package (both directions), element-range reads that
// read only their bytes, every kind of corrupted header named in the error, and a seeded mutation
// test (the deterministic cousin of the libFuzzer run in run_fuzz.sh).
#include "checkpoint/safetensors.h"
#include "support/python.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifndef ACCEL_PYTHON
#define ACCEL_PYTHON ""
#endif

namespace accel::checkpoint {
namespace {

// A fresh directory per test (removed with POSIX calls: std::filesystem::remove_all is unsafe here).
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/accel_st_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    if (const char* keep = std::getenv("ACCEL_KEEP_TEST_FILES"); keep && *keep) return;
    std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", path_.c_str());
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// --- the recipe shared with safetensors_interop.py -------------------------------------------------
struct RecipeItem {
  const char* name;
  c10::ScalarType dtype;
  std::vector<std::int64_t> shape;
};
const std::vector<RecipeItem> kRecipe = {
    {"f64", at::kDouble, {5}},
    {"f32.matrix", at::kFloat, {3, 4}},
    {"f16", at::kHalf, {2, 3, 2}},
    {"bf16", at::kBFloat16, {7}},
    {"i64", at::kLong, {4}},
    {"i32", at::kInt, {2, 2}},
    {"i16", at::kShort, {3}},
    {"i8", at::kChar, {5}},
    {"u8", at::kByte, {6}},
    {"bool", at::kBool, {5}},
    {"f8_e4m3", at::kFloat8_e4m3fn, {4}},
    {"f8_e5m2", at::kFloat8_e5m2, {4}},
    {"u16", at::kUInt16, {3}},
    {"u32", at::kUInt32, {3}},
    {"u64", at::kUInt64, {3}},
    {"scalar", at::kFloat, {}},
    {"scalar_i64", at::kLong, {}},
    {"empty", at::kFloat, {0}},
    {"empty2d", at::kLong, {2, 0}},
    {"layers.0.weight", at::kFloat, {8, 3}},
};

at::Tensor make(c10::ScalarType dt, const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  at::Tensor t;
  if (dt == at::kBool)
    t = at::arange(n, at::kLong).remainder(3).eq(0);
  else if (dt == at::kLong || dt == at::kUInt64)
    t = (at::arange(n, at::kLong) * (std::int64_t{1} << 40) + 7).to(dt);
  else if (dt == at::kInt || dt == at::kUInt32)
    t = (at::arange(n, at::kLong) * 100003 + 5).to(dt);
  else if (dt == at::kShort || dt == at::kChar || dt == at::kByte || dt == at::kUInt16)
    t = (at::arange(n, at::kLong) * 7 - 3).remainder(100).to(dt);
  else
    t = (at::arange(n, at::kDouble) * 0.37 - 2.5).to(dt);
  return t.reshape(shape);
}

std::vector<std::pair<std::string, at::Tensor>> recipe_tensors() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& r : kRecipe) out.emplace_back(r.name, make(r.dtype, r.shape));
  return out;
}

// Same dtype, shape and bytes.
::testing::AssertionResult same(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << c10::toString(a.scalar_type()) << a.sizes() << " vs "
                                         << c10::toString(b.scalar_type()) << b.sizes();
  at::Tensor ca = a.contiguous(), cb = b.contiguous();
  if (std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

const std::string kInterop = std::string(ACCEL_SOURCE_DIR) + "/tests/checkpoint/safetensors_interop.py";
using accel::test::run_python;

#define REQUIRE_PYTHON()                                                            \
  do {                                                                              \
    if (!accel::test::python_available(ACCEL_PYTHON))                               \
      GTEST_SKIP() << "ACCEL_PYTHON (the venv with safetensors) is not configured"; \
  } while (0)

// Expects SafetensorsFile::open(path) to fail with a message naming the file and each of `parts`.
void expect_open_error(const std::string& path, const std::vector<std::string>& parts) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "opened a bad file: " << path;
  } catch (const SafetensorsError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  }
}

// A file from a header JSON text and `data_size` bytes of data (header padded to 8 with spaces).
std::string file_bytes(std::string header, std::size_t data_size, std::uint64_t claimed = ~std::uint64_t{0}) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::uint64_t n = claimed == ~std::uint64_t{0} ? header.size() : claimed;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  out.append(data_size, '\x5a');
  return out;
}

// --- round trips ---------------------------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDtypeShapeAndMetadata) {
  TempDir d;
  auto tensors = recipe_tensors();
  tensors.emplace_back("c64", at::randn({3}, at::kComplexFloat));
  tensors.emplace_back("f8_e8m0", at::tensor({0.5f, 1.f, 4.f}).to(at::kFloat8_e8m0fnu));
  tensors.emplace_back("transposed", at::arange(12, at::kFloat).reshape({3, 4}).t());  // non-contiguous
  write_safetensors(d.file("a.safetensors"), tensors, {{"format", "pt"}, {"k", "v"}});
  EXPECT_NE(::access(d.file("a.safetensors.tmp").c_str(), F_OK), 0) << "temporary left behind";
  auto f = SafetensorsFile::open(d.file("a.safetensors"));
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}}));
  EXPECT_EQ(f.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    EXPECT_EQ(f.dtype(name), t.scalar_type());
    EXPECT_EQ(f.shape(name), t.sizes().vec());
    EXPECT_TRUE(same(f.read(name), t));
  }
  // Header padded to 8; larger elements first, so every tensor starts aligned to its element size.
  EXPECT_EQ(f.header().data_start % 8, 0u);
  for (const auto& e : f.header().tensors) EXPECT_EQ(e.begin % safetensors_dtype_size(e.dtype), 0u) << e.name;
}

TEST(SafetensorsRoundTrip, ReadRangeReadsOnlyItsBytes) {
  TempDir d;
  at::Tensor w = at::arange(1000, at::kDouble).reshape({10, 100});
  at::Tensor h = at::arange(77, at::kFloat).to(at::kHalf);
  write_safetensors(d.file("r.safetensors"), {{"w", w}, {"h", h}});
  auto f = SafetensorsFile::open(d.file("r.safetensors"));
  EXPECT_EQ(f.bytes_read(), 0u);
  for (auto [b, e] : std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {123, 457}, {999, 1000}, {0, 1000}}) {
    const auto before = f.bytes_read();
    at::Tensor r = f.read_range("w", b, e);
    EXPECT_EQ(f.bytes_read() - before, static_cast<std::uint64_t>(e - b) * 8);
    EXPECT_TRUE(same(r, w.reshape({-1}).narrow(0, b, e - b)));
  }
  EXPECT_TRUE(same(f.read_range("h", 5, 70), h.narrow(0, 5, 65)));
  at::Tensor into = at::empty({10}, at::kHalf);
  f.read_range_into("h", 60, 70, into);
  EXPECT_TRUE(same(into, h.narrow(0, 60, 10)));
  // Out of range or wrong name: errors naming the file and the tensor.
  for (auto [b, e] : std::vector<std::pair<int, int>>{{-1, 3}, {5, 4}, {0, 1001}}) {
    try {
      f.read_range("w", b, e);
      ADD_FAILURE() << "range accepted";
    } catch (const SafetensorsError& ex) {
      EXPECT_NE(std::string(ex.what()).find("'w'"), std::string::npos) << ex.what();
      EXPECT_NE(std::string(ex.what()).find(d.file("r.safetensors")), std::string::npos) << ex.what();
    }
  }
  EXPECT_THROW(f.read("nope"), SafetensorsError);
  EXPECT_THROW(f.read_range_into("h", 0, 10, at::empty({10}, at::kFloat)), std::invalid_argument);
}

TEST(SafetensorsWriter, StreamsInAnyOrderAndIsAtomic) {
  TempDir d;
  const std::string path = d.file("s.safetensors");
  write_safetensors(path, {{"old", at::ones({2})}});
  const std::string old_bytes = slurp(path);
  {
    SafetensorsWriter w(path, {{"a", at::kFloat, {2, 3}}, {"b", at::kBFloat16, {4}}, {"c", at::kLong, {}}});
    w.write("c", at::tensor(42, at::kLong).reshape({}));
    w.write("a", at::arange(6, at::kFloat).reshape({2, 3}));
    EXPECT_EQ(slurp(path), old_bytes) << "the target changed before finish()";
    EXPECT_THROW(w.write("a", at::zeros({2, 3})), std::invalid_argument);              // twice
    EXPECT_THROW(w.write("zz", at::zeros({1})), std::invalid_argument);                // undeclared
    EXPECT_THROW(w.write("b", at::zeros({4})), std::invalid_argument);                 // wrong dtype
    EXPECT_THROW(w.write("b", at::zeros({5}, at::kBFloat16)), std::invalid_argument);  // wrong shape
    EXPECT_THROW(w.finish(), std::logic_error);                                        // b missing
    w.write("b", at::arange(4, at::kFloat).to(at::kBFloat16));
    w.finish();
  }
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(f.read("c").item<std::int64_t>(), 42);
  EXPECT_TRUE(same(f.read("b"), at::arange(4, at::kFloat).to(at::kBFloat16)));

  // An abandoned writer leaves the previous file untouched and no temporary behind.
  const std::string good = slurp(path);
  {
    SafetensorsWriter w(path, {{"x", at::kFloat, {3}}});
    w.write("x", at::zeros({3}));
  }  // no finish()
  EXPECT_EQ(slurp(path), good);
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);

  EXPECT_THROW(SafetensorsWriter(d.file("bad"), {{"x", at::kFloat, {1}}, {"x", at::kFloat, {1}}}),
               std::invalid_argument);
  EXPECT_THROW(SafetensorsWriter(d.file("bad"), {{"__metadata__", at::kFloat, {1}}}), std::invalid_argument);
  EXPECT_THROW(SafetensorsWriter(d.file("bad"), {{"x", at::kFloat, {-1}}}), std::invalid_argument);
  EXPECT_THROW(SafetensorsWriter(d.file("no/such/dir/x.safetensors"), {}), SafetensorsError);
  // An empty file (no tensors) is valid.
  write_safetensors(d.file("empty.safetensors"), {});
  EXPECT_TRUE(SafetensorsFile::open(d.file("empty.safetensors")).names().empty());
}

// --- the real Python reader and writer ----------------------------------------------------------

TEST(SafetensorsPython, FilesWrittenHereLoadInPython) {
  REQUIRE_PYTHON();
  TempDir d;
  write_safetensors(d.file("cpp.safetensors"), recipe_tensors(), {{"format", "pt"}, {"written_by", "accel"}});
  auto [rc, out] = run_python(ACCEL_PYTHON, kInterop, "check '" + d.file("cpp.safetensors") + "'");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("OK"), std::string::npos) << out;
}

TEST(SafetensorsPython, FilesWrittenByPythonLoadHere) {
  REQUIRE_PYTHON();
  TempDir d;
  auto [rc, out] = run_python(ACCEL_PYTHON, kInterop, "write '" + d.file("py.safetensors") + "'");
  ASSERT_EQ(rc, 0) << out;
  auto f = SafetensorsFile::open(d.file("py.safetensors"));
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"written_by", "python"}}));
  EXPECT_EQ(f.names().size(), kRecipe.size());
  for (const auto& r : kRecipe) {
    SCOPED_TRACE(r.name);
    at::Tensor want = make(r.dtype, r.shape);
    EXPECT_TRUE(same(f.read(r.name), want));
    if (want.numel() > 1)
      EXPECT_TRUE(same(f.read_range(r.name, 1, want.numel()), want.reshape({-1}).narrow(0, 1, want.numel() - 1)));
  }
}

// --- corrupted files ------------------------------------------------------------------------------

TEST(SafetensorsCorrupt, TruncatedAnywhere) {
  TempDir d;
  write_safetensors(d.file("good.safetensors"), recipe_tensors());
  const std::string good = slurp(d.file("good.safetensors"));
  auto f = SafetensorsFile::open(d.file("good.safetensors"));
  const std::size_t ds = f.header().data_start;
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{7}, std::size_t{8}, std::size_t{9}, ds / 2,
                          ds - 1, ds, ds + 1, good.size() / 2 + ds / 2, good.size() - 1}) {
    SCOPED_TRACE(cut);
    const std::string p = d.file("cut" + std::to_string(cut));
    spit(p, good.substr(0, cut));
    expect_open_error(p, {});
  }
  expect_open_error(d.file("cut0"), {"shorter than the 8-byte header length"});
  expect_open_error(d.file("cut" + std::to_string(ds - 1)), {"runs past the end of the file"});
  expect_open_error(d.file("cut" + std::to_string(good.size() - 1)), {"run past the end of the data"});
  expect_open_error(d.file("missing.safetensors"), {"cannot open"});
}

TEST(SafetensorsCorrupt, HeaderLengthLies) {
  TempDir d;
  const std::string hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct Case {
    std::uint64_t n;
    const char* what;
  };
  for (Case c : {Case{~std::uint64_t{1}, "exceeds the limit"}, Case{std::uint64_t{1} << 40, "exceeds the limit"},
                 Case{100'000'001, "exceeds the limit"}, Case{4096, "runs past the end of the file"},
                 Case{0, "too short"}, Case{5, "not valid JSON"}, Case{64, ""}}) {
    SCOPED_TRACE(c.n);
    const std::string p = d.file("len" + std::to_string(c.n));
    spit(p, file_bytes(hdr, 8, c.n));
    expect_open_error(p, {c.what});
  }
}

TEST(SafetensorsCorrupt, EveryHeaderFaultIsNamed) {
  TempDir d;
  struct Case {
    std::string header;
    std::size_t data;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, {"not valid JSON"}},
      {R"([1, 2, 3])", 0, {"does not start with '{'"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       16,
       {"'a' twice"}},
      {R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})",
       8,
       {"'a'", "unknown or unsupported dtype 'F31'", "F32"}},
      {R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8, {"'a'", "dtype must be a string"}},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8, {"'a'", "no dtype"}},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8, {"'a'", "no shape"}},
      {R"({"a":{"dtype":"F32","shape":[2]}})", 8, {"'a'", "no data_offsets"}},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {"'a'", "not a non-negative integer"}},
      {R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, {"'a'", "not a non-negative integer"}},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, {"'a'", "needs 12 bytes", "hold 8"}},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, {"'a'", "64 bits"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, {"'a'", "end before they begin"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, {"'a'", "two non-negative integers"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8, {"'a'", "two non-negative integers"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[1000,1008]}})", 8, {"'a'", "run past the end of the data"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12,
       {"'b'", "overlap tensor 'a'"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       20,
       {"'b'", "leave a hole", "[8, 12)"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, {"'a'", "leave a hole"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9, {"trailing bytes"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8, {"'a'", "unknown field 'extra'"}},
      {R"({"a":[1,2]})", 0, {"'a'", "expected an object"}},
      {R"({"__metadata__":{"k":1}})", 0, {"__metadata__", "'k'", "must be a string"}},
      {R"({"__metadata__":["x"]})", 0, {"__metadata__ must be an object"}},
      {R"({"a":{"dtype":"F32","shape":[[[[[[2]]]]]],"data_offsets":[0,8]}})", 8, {"nests deeper"}},
      {"{\"a\xff\":{}}", 0, {"not valid JSON"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} trailing)", 8, {"not valid JSON"}},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].header);
    const std::string p = d.file("case" + std::to_string(i) + ".safetensors");
    spit(p, file_bytes(cases[i].header, cases[i].data));
    expect_open_error(p, cases[i].parts);
  }
  // Valid corner cases: empty tensors sharing an offset, scalars, an empty file, metadata only.
  const std::vector<std::pair<std::string, std::size_t>> ok = {
      {R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"f":{"dtype":"I64","shape":[2,0],"data_offsets":[0,0]},"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
       8},
      {R"({})", 0},
      {R"({"__metadata__":{"format":"pt"}})", 0},
  };
  for (std::size_t i = 0; i < ok.size(); ++i) {
    const std::string p = d.file("ok" + std::to_string(i) + ".safetensors");
    spit(p, file_bytes(ok[i].first, ok[i].second));
    EXPECT_NO_THROW(SafetensorsFile::open(p)) << ok[i].first;
  }
}

TEST(SafetensorsCorrupt, FlippedHeaderBytesNeverCrash) {
  TempDir d;
  write_safetensors(d.file("good.safetensors"), recipe_tensors());
  const std::string good = slurp(d.file("good.safetensors"));
  const std::size_t ds = SafetensorsFile::open(d.file("good.safetensors")).header().data_start;
  const std::string p = d.file("flip.safetensors");
  int rejected = 0, accepted = 0;
  for (std::size_t i = 0; i < ds; ++i) {
    for (unsigned char mask : {0x01, 0x20, 0x80}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      spit(p, bad);
      try {
        auto f = SafetensorsFile::open(p);
        for (const auto& n : f.names()) f.read(n);  // what parses must read within the file
        ++accepted;
      } catch (const SafetensorsError& e) {
        ++rejected;
        ASSERT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_GT(rejected, static_cast<int>(ds));  // most flips break something; some (inside a name) do not
  std::printf("flipped header bytes: %d rejected, %d still valid\n", rejected, accepted);
}

// 20,000 seeded mutations of valid files through the parser: every outcome is a parse or a
// SafetensorsError naming the file; what parses satisfies the invariants the reader relies on.
TEST(SafetensorsFuzz, SeededMutationsOfValidFiles) {
  TempDir d;
  std::vector<std::string> seeds;
  write_safetensors(d.file("s0"), recipe_tensors(), {{"format", "pt"}});
  write_safetensors(d.file("s1"), {{"w", at::ones({3, 3})}, {"e", at::zeros({0})}});
  write_safetensors(d.file("s2"), {});
  for (const char* s : {"s0", "s1", "s2"}) seeds.push_back(slurp(d.file(s)));
  std::mt19937_64 rng(20240607);
  const char* tokens[] = {"{",
                          "}",
                          "[",
                          "]",
                          ",",
                          ":",
                          "\"",
                          "0",
                          "-1",
                          "18446744073709551615",
                          "1e400",
                          "\"F32\"",
                          "\"dtype\"",
                          "\"shape\"",
                          "\"data_offsets\"",
                          "\"__metadata__\"",
                          "null",
                          "[0,0]",
                          " ",
                          "\\u0000"};
  int parsed = 0, rejected = 0;
  const int kIters = 20000;
  for (int it = 0; it < kIters; ++it) {
    std::string b = seeds[rng() % seeds.size()];
    const int nmut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < nmut; ++m) {
      const std::size_t hdr_end =
          std::min<std::size_t>(b.size(), 8 + (b.size() >= 8 ? static_cast<unsigned char>(b[0]) : 0));
      const std::size_t pos =
          b.empty() ? 0 : (rng() % 4 ? 8 + rng() % std::max<std::size_t>(1, hdr_end - 8) : rng() % b.size());
      switch (rng() % 7) {
        case 0:
          if (pos < b.size()) b[pos] = static_cast<char>(b[pos] ^ (1u << (rng() % 8)));
          break;
        case 1:
          if (pos < b.size()) b[pos] = static_cast<char>(rng());
          break;
        case 2: b.insert(std::min(pos, b.size()), tokens[rng() % std::size(tokens)]); break;
        case 3:
          if (pos < b.size()) b.erase(pos, 1 + rng() % 8);
          break;
        case 4: b.resize(rng() % (b.size() + 1)); break;
        case 5:
          if (b.size() >= 8) b[rng() % 8] = static_cast<char>(rng());
          break;  // the length prefix
        case 6: b.append(rng() % 16, static_cast<char>(rng())); break;
      }
    }
    try {
      SafetensorsHeader h = parse_safetensors_bytes(b.data(), b.size(), b.size(), "mutant.safetensors");
      ++parsed;
      std::uint64_t covered = 0;
      for (const auto& e : h.tensors) {
        ASSERT_LE(e.end, h.data_size);
        ASSERT_LE(e.begin, e.end);
        ASSERT_EQ(static_cast<std::uint64_t>(e.numel()) * safetensors_dtype_size(e.dtype), e.end - e.begin);
        covered += e.end - e.begin;
      }
      ASSERT_EQ(covered, h.data_size);
      ASSERT_EQ(h.data_start + h.data_size, b.size());
    } catch (const SafetensorsError& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find("mutant.safetensors"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parsed + rejected, kIters);
  std::printf("mutations: %d parsed, %d rejected\n", parsed, rejected);
}

TEST(SafetensorsDtypes, MapBothWays) {
  for (const auto& r : kRecipe) {
    const std::string n = scalar_type_to_safetensors(r.dtype);
    EXPECT_EQ(safetensors_to_scalar_type(n), r.dtype);
    EXPECT_EQ(safetensors_dtype_size(n), c10::elementSize(r.dtype));
  }
  EXPECT_THROW(scalar_type_to_safetensors(at::kQInt8), std::invalid_argument);
  EXPECT_EQ(safetensors_dtype_size("F4"), 0u);
}

}  // namespace
}  // namespace accel::checkpoint
