// libFuzzer harness for the safetensors header parser (src/checkpoint/safetensors_header.cpp, no
// torch). The input is a whole file: 8-byte length, header, data.
// Every input must either parse into a header whose tensors cover the data exactly, or throw
// SafetensorsError naming the file; anything else (another exception, a sanitizer report, a
// violated invariant) is a crash. Build and run: tests/checkpoint/run_fuzz.sh SECONDS [WORKDIR].
#include "checkpoint/safetensors_header.h"

#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accel::checkpoint;
  const std::string file = "fuzz.safetensors";
  try {
    SafetensorsHeader h = parse_safetensors_bytes(reinterpret_cast<const char*>(data), size, size, file);
    std::uint64_t covered = 0;
    for (const auto& e : h.tensors) {
      if (e.begin > e.end || e.end > h.data_size) __builtin_trap();
      const std::size_t es = safetensors_dtype_size(e.dtype);
      if (es == 0 || static_cast<std::uint64_t>(e.numel()) * es != e.end - e.begin) __builtin_trap();
      for (auto d : e.shape)
        if (d < 0) __builtin_trap();
      covered += e.end - e.begin;
    }
    if (covered != h.data_size || h.data_start + h.data_size != size) __builtin_trap();
  } catch (const SafetensorsError& e) {
    if (std::string(e.what()).find(file) == std::string::npos) __builtin_trap();
  }
  return 0;
}
