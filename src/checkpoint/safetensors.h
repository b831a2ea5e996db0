// accel::checkpoint safetensors — a small, strict reader/writer of the safetensors format
// (https://github.com/huggingface/safetensors):
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, space-padded] [data]
//   header = {name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {str: str}}          (offsets relative to the start of the data)
//
// The reader checks everything the header claims before trusting it: N against the file size (and a
// 100 MB cap, as the Python reader), a JSON object with no duplicate names, a known dtype, a
// non-negative shape whose byte size equals end - begin, offsets inside the data, and the data
// covered exactly (no overlaps, no holes, nothing after the last tensor: the spec requires it). Every
// error is a SafetensorsError whose message names the file, the tensor (where one is at fault) and
// what is wrong. Reads use pread, so a rank can read just the elements of its shard (read_range).
//
// The writer lays tensors out as the Python writer does (by element size, largest first, then by
// name), writes to `path + ".tmp"`, fsyncs, and renames into place: a crash leaves either the old
// file or the new one. SafetensorsWriter streams: the caller declares every tensor's name, dtype and
// shape up front and then writes them one at a time, in any order.
//
// The header parser is in safetensors_header.h (no torch; the libFuzzer harness compiles it alone).
// Assumes a little-endian host (as libtorch's CPU tensors).
#pragma once

#include "checkpoint/safetensors_header.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace accel::checkpoint {

// safetensors dtype name <-> torch dtype. Throw SafetensorsError / std::invalid_argument for a dtype
// with no counterpart.
c10::ScalarType safetensors_to_scalar_type(const std::string& dtype);
std::string scalar_type_to_safetensors(c10::ScalarType t);

// A file opened for reading. Move-only; holds the file descriptor until destroyed.
class SafetensorsFile {
 public:
  // Reads and validates the header. Throws SafetensorsError naming the file and the fault.
  static SafetensorsFile open(const std::string& path);
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return header_.find(name) != nullptr; }
  // The entry of `name`; throws SafetensorsError naming the file and the tensor if absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  c10::ScalarType dtype(const std::string& name) const;
  std::vector<std::int64_t> shape(const std::string& name) const { return entry(name).shape; }

  // The whole tensor, as a new CPU tensor of its dtype and shape.
  at::Tensor read(const std::string& name) const;
  // Elements [elem_begin, elem_end) of the tensor viewed flat, as a new 1-D CPU tensor; reads only
  // those bytes. Throws SafetensorsError for a range outside [0, numel].
  at::Tensor read_range(const std::string& name, std::int64_t elem_begin, std::int64_t elem_end) const;
  // The same into `out`: a contiguous CPU tensor of the tensor's dtype with elem_end - elem_begin elements.
  void read_range_into(const std::string& name, std::int64_t elem_begin, std::int64_t elem_end,
                       const at::Tensor& out) const;
  // Bytes read by read/read_range so far (tests check that ranges read only their bytes).
  std::uint64_t bytes_read() const { return bytes_read_; }

 private:
  SafetensorsFile() = default;
  void pread_all(void* dst, std::uint64_t nbytes, std::uint64_t offset, const std::string& what) const;
  std::string path_;
  int fd_ = -1;
  SafetensorsHeader header_;
  mutable std::uint64_t bytes_read_ = 0;
};

struct SafetensorsTensorSpec {
  std::string name;
  c10::ScalarType dtype;
  std::vector<std::int64_t> shape;
};

// Streams one file: declare every tensor up front, write each exactly once (any order), finish().
// Only one tensor's CPU copy is held at a time. Destroying an unfinished writer removes the
// temporary file and leaves `path` as it was.
class SafetensorsWriter {
 public:
  // Throws std::invalid_argument for an empty, duplicate or reserved ("__metadata__") name, a
  // negative dimension or an unsupported dtype; SafetensorsError if the temporary cannot be created.
  SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> tensors,
                    std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // `t` must have the declared dtype and shape (any device, any strides). Throws std::invalid_argument
  // otherwise or for an undeclared / already written name.
  void write(const std::string& name, const at::Tensor& t);
  // Checks every tensor was written, fsyncs, renames path.tmp -> path, fsyncs the directory.
  void finish();

  const std::string& path() const { return path_; }
  std::uint64_t data_bytes() const { return data_size_; }
  std::uint64_t file_bytes() const { return data_start_ + data_size_; }
  // Byte offsets (relative to the data start) the layout assigned to `name`.
  std::pair<std::uint64_t, std::uint64_t> offsets(const std::string& name) const;

 private:
  struct Slot {
    SafetensorsTensorSpec spec;
    std::uint64_t begin = 0, end = 0;
    bool written = false;
  };
  void abandon() noexcept;
  std::string path_, tmp_;
  int fd_ = -1;
  std::map<std::string, Slot> slots_;
  std::uint64_t data_start_ = 0, data_size_ = 0;
  bool finished_ = false;
};

// Writes `tensors` (in any dtype we support, any device) as one file, atomically.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace accel::checkpoint
