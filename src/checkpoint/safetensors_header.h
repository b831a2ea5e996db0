// accel::checkpoint safetensors header parsing: the first 8 bytes (N) and the N-byte JSON header of a
// safetensors file (the format and the checks: see safetensors.h). No torch: the libFuzzer harness
// (tests/checkpoint/fuzz_safetensors_header.cpp) compiles safetensors_header.cpp alone.
#pragma once

#include "base/error.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::checkpoint {

class SafetensorsError : public accel::RuntimeError {
 public:
  using accel::RuntimeError::RuntimeError;
};

// The largest header accepted (the Python reader's limit).
constexpr std::uint64_t kSafetensorsMaxHeader = 100'000'000;

// The one table of safetensors dtypes: X(name, bytes per element, the c10::ScalarType constant).
// This file stays torch-free: the third column is a token that only safetensors.cpp expands.
// Sub-byte dtypes (F4, F6_*) are not supported: libtorch has no tensor type for them.
// clang-format off
#define ACCEL_SAFETENSORS_DTYPES(X)                                                                   \
  X(BOOL, 1, kBool) X(U8, 1, kByte) X(I8, 1, kChar) X(F8_E4M3, 1, kFloat8_e4m3fn)                     \
  X(F8_E5M2, 1, kFloat8_e5m2) X(F8_E4M3FNUZ, 1, kFloat8_e4m3fnuz) X(F8_E5M2FNUZ, 1, kFloat8_e5m2fnuz)  \
  X(F8_E8M0, 1, kFloat8_e8m0fnu) X(I16, 2, kShort) X(U16, 2, kUInt16) X(F16, 2, kHalf)                 \
  X(BF16, 2, kBFloat16) X(I32, 4, kInt) X(U32, 4, kUInt32) X(F32, 4, kFloat) X(I64, 8, kLong)          \
  X(U64, 8, kUInt64) X(F64, 8, kDouble) X(C64, 8, kComplexFloat)
// clang-format on

// Bytes per element of a safetensors dtype name ("F32" -> 4), 0 if the name is not one we know.
std::size_t safetensors_dtype_size(const std::string& dtype);
// Every dtype name we know, comma-separated (for messages).
std::string safetensors_dtype_names();

struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 // "F32", "BF16", ...
  std::vector<std::int64_t> shape;   // [] for a scalar
  std::uint64_t begin = 0, end = 0;  // byte offsets relative to the data start
  std::int64_t numel() const;
};

struct SafetensorsHeader {
  std::uint64_t header_size = 0;          // N
  std::uint64_t data_start = 0;           // 8 + N
  std::uint64_t data_size = 0;            // file size - data_start
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  // The entry called `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
};

// N from the file's first 8 bytes, checked against the file size and kSafetensorsMaxHeader.
// `file` only names the file in messages.
std::uint64_t parse_safetensors_prefix(const unsigned char* first8, std::uint64_t file_size, const std::string& file);
// Parses and validates the N header bytes of a file of file_size bytes. Throws SafetensorsError.
SafetensorsHeader parse_safetensors_header(const char* json, std::size_t size, std::uint64_t file_size,
                                           const std::string& file);
// Both of the above over an in-memory file (prefix and header; the data is not needed).
SafetensorsHeader parse_safetensors_bytes(const char* bytes, std::size_t size, std::uint64_t file_size,
                                          const std::string& file);

// Throw SafetensorsError "safetensors file '<file>': <what>" (and "... tensor '<tensor>': <what>").
[[noreturn]] void safetensors_fail(const std::string& file, const std::string& what);
[[noreturn]] void safetensors_fail_tensor(const std::string& file, const std::string& tensor, const std::string& what);

}  // namespace accel::checkpoint
