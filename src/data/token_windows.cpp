// Token files and their windows (data/token_windows.h).
#include "data/token_windows.h"

#include "base/error.h"

#include <fmt/format.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <string_view>

namespace accel::data {
namespace {

std::int64_t width(TokenDtype d) {
  switch (d) {
    case TokenDtype::UInt16: return 2;
    case TokenDtype::UInt32:
    case TokenDtype::Int32: return 4;
    case TokenDtype::Int64: return 8;
  }
  return 0;
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InvalidArgumentError("token file " + path + ": " + what);
}

// The value of `key` in an .npy header dict ("'descr': '<u2'" -> "<u2"; "'shape': (12,)" -> "(12,)").
std::string header_value(std::string_view header, const std::string& key, const std::string& path) {
  const auto k = header.find("'" + key + "'");
  if (k == std::string_view::npos) bad(path, "the .npy header has no '" + key + "'");
  auto v = header.find(':', k);
  if (v == std::string_view::npos) bad(path, "the .npy header's '" + key + "' has no value");
  v = header.find_first_not_of(' ', v + 1);
  std::size_t e = header[v] == '(' ? header.find(')', v) + 1 : header.find_first_of(",}", v);
  if (header[v] == '\'') e = header.find('\'', v + 1) + 1;
  return std::string(header.substr(v, e - v));
}

}  // namespace

const char* dtype_name(TokenDtype d) {
  switch (d) {
    case TokenDtype::UInt16: return "uint16";
    case TokenDtype::UInt32: return "uint32";
    case TokenDtype::Int32: return "int32";
    case TokenDtype::Int64: return "int64";
  }
  return "?";
}

TokenDtype parse_dtype(const std::string& name) {
  for (TokenDtype d : {TokenDtype::UInt16, TokenDtype::UInt32, TokenDtype::Int32, TokenDtype::Int64})
    if (name == dtype_name(d)) return d;
  throw InvalidArgumentError("token dtype '" + name + "': expected uint16, uint32, int32 or int64");
}

TokenFile TokenFile::open(const std::string& path, TokenDtype bin_dtype) {
  TokenFile f;
  f.path_ = path;
  f.file_ = files::MappedFile::open(path);
  const char* p = f.file_->data();
  std::uint64_t bytes = f.file_->size(), offset = 0;
  f.dtype_ = bin_dtype;
  const bool npy = path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
  if (npy) {
    if (bytes < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) bad(path, "not an .npy file (no \\x93NUMPY magic)");
    const int major = static_cast<unsigned char>(p[6]);
    std::uint32_t header_len = 0;
    if (major == 1) {
      header_len = static_cast<unsigned char>(p[8]) | (static_cast<unsigned char>(p[9]) << 8);
      offset = 10;
    } else {
      if (bytes < 12) bad(path, "a truncated .npy header");
      std::memcpy(&header_len, p + 8, 4);
      offset = 12;
    }
    if (offset + header_len > bytes) bad(path, "a truncated .npy header");
    const std::string_view header(p + offset, header_len);
    offset += header_len;
    const std::string descr = header_value(header, "descr", path), shape = header_value(header, "shape", path);
    const std::string fortran = header_value(header, "fortran_order", path);
    if (descr == "'<u2'")
      f.dtype_ = TokenDtype::UInt16;
    else if (descr == "'<u4'")
      f.dtype_ = TokenDtype::UInt32;
    else if (descr == "'<i4'")
      f.dtype_ = TokenDtype::Int32;
    else if (descr == "'<i8'")
      f.dtype_ = TokenDtype::Int64;
    else
      bad(path, "dtype " + descr + " is not a token dtype (uint16, uint32, int32 or int64, little-endian)");
    std::string dims;  // "(12345,)" -> "12345,"
    for (char c : shape)
      if (c != ' ' && c != '(' && c != ')') dims += c;
    const bool one_dim = dims.size() >= 2 && dims.back() == ',' &&
                         std::all_of(dims.begin(), dims.end() - 1, [](char c) { return c >= '0' && c <= '9'; });
    if (!one_dim || fortran != "False") bad(path, "shape " + shape + ": expected a one-dimensional array");
  }
  const std::uint64_t data = bytes - offset, w = static_cast<std::uint64_t>(width(f.dtype_));
  if (data % w != 0)
    bad(path, fmt::format("{} bytes of tokens are not a whole number of {} tokens ({} bytes each)", data,
                          dtype_name(f.dtype_), w));
  f.data_ = p + offset;
  f.n_ = static_cast<std::int64_t>(data / w);
  return f;
}

std::int64_t TokenFile::at(std::int64_t i) const {
  const char* q = data_ + i * width(dtype_);
  auto as = [q](auto v) {  // the token at q as the file's type (memcpy: q need not be aligned)
    std::memcpy(&v, q, sizeof v);
    return static_cast<std::int64_t>(v);
  };
  switch (dtype_) {
    case TokenDtype::UInt16: return as(std::uint16_t{});
    case TokenDtype::UInt32: return as(std::uint32_t{});
    case TokenDtype::Int32: return as(std::int32_t{});
    case TokenDtype::Int64: return as(std::int64_t{});
  }
  return 0;
}

std::vector<std::int64_t> TokenFile::read(std::int64_t begin, std::int64_t n) const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = at(begin + i);
  return out;
}

TokenWindows::TokenWindows(TokenFile file, TokenWindowsOptions options)
    : file_(std::move(file)), opts_(std::move(options)) {
  const std::string& path = file_.path();
  end_ = opts_.end.value_or(file_.size());
  if (opts_.seq_len < 1) bad(path, "seq_len must be at least 1");
  if (opts_.begin < 0 || end_ > file_.size() || opts_.begin > end_)
    bad(path, fmt::format("the range [{}, {}) is not within its {} tokens", opts_.begin, end_, file_.size()));
  if (!opts_.eos_token_id) {
    rows_ = (end_ - opts_.begin - 1) / opts_.seq_len;
  } else {
    // Documents end at each eos token; a document of fewer than 2 tokens has nothing to predict.
    std::int64_t start = opts_.begin;
    for (std::int64_t i = opts_.begin; i < end_; ++i)
      if (file_.at(i) == *opts_.eos_token_id || i + 1 == end_) {
        if (i + 1 - start >= 2) {
          doc_starts_.push_back(start);
          doc_starts_.push_back(i + 1);
        }
        start = i + 1;
      }
    rows_ = static_cast<std::int64_t>(doc_starts_.size() / 2);
  }
  if (rows_ < 1)
    bad(path, fmt::format("{} tokens in [{}, {}) make no window of {} + 1 tokens{}", end_ - opts_.begin, opts_.begin,
                          end_, opts_.seq_len, opts_.eos_token_id ? " (no document of 2 tokens or more)" : ""));
}

std::int64_t TokenWindows::row_start(std::int64_t i) const {
  return opts_.eos_token_id ? doc_starts_[static_cast<std::size_t>(2 * i)] : opts_.begin + i * opts_.seq_len;
}

torch::data::Example<> TokenWindows::get(std::size_t index) {
  const auto i = static_cast<std::int64_t>(index);
  if (i >= rows_) throw OutOfRangeError(fmt::format("TokenWindows: row {} of {}", i, rows_));
  const std::int64_t T = opts_.seq_len;
  at::Tensor input = at::empty({T}, at::kLong), target = at::empty({T}, at::kLong);
  auto in = input.accessor<std::int64_t, 1>();
  auto tg = target.accessor<std::int64_t, 1>();
  if (!opts_.eos_token_id) {
    const std::int64_t s = row_start(i);
    for (std::int64_t t = 0; t < T; ++t) in[t] = file_.at(s + t), tg[t] = file_.at(s + t + 1);
  } else {
    const std::int64_t s = doc_starts_[static_cast<std::size_t>(2 * i)];
    const std::int64_t len = std::min(doc_starts_[static_cast<std::size_t>(2 * i + 1)] - s, T + 1);
    for (std::int64_t t = 0; t < T; ++t) {
      in[t] = t < len ? file_.at(s + t) : opts_.pad_token_id;
      tg[t] = t + 1 < len ? file_.at(s + t + 1) : -100;
    }
  }
  return {input, target};
}

}  // namespace accel::data
