// accel::checkpoint slice format — how index.json describes where the slices of each tensor live
// (the directory layout: see sharded_state.h). A slice is the element range [begin, end) of a tensor
// viewed flat, stored raw at bytes [offset, offset + bytes) of one shard file, with its CRC32.
// Every parse error is a CheckpointError naming the file.
#pragma once

#include "checkpoint/checkpoint_error.h"

#include <c10/core/ScalarType.h>
#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace accel::checkpoint {

constexpr const char* kCheckpointFormat = "accel-checkpoint";  // index.json's "format"
constexpr int kCheckpointVersion = 1;                          // ... and "version"

struct Slice {
  std::string file;
  std::uint64_t offset = 0, bytes = 0;
  std::int64_t begin = 0, end = 0;
  std::uint32_t crc = 0;
};

// A tensor of the checkpoint: its full shape, dtype and slices.
struct Entry {
  std::vector<std::int64_t> shape;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<Slice> slices;
};

// A slice's checksum: the CRC32 (zlib's) of its bytes.
std::uint32_t slice_crc32(const void* data, std::size_t n);
// "<stem>_<rank><ext>": shard_3.bin, slices_3.json, rng_3.bin.
std::string rank_file(const char* stem, int rank, const char* ext);

// One slice of tensor `key` as a rank lists it in its slices_<rank>.json.
nlohmann::json slice_record(const std::string& key, const std::vector<std::int64_t>& shape, c10::ScalarType dtype,
                            const Slice& s);
// Adds the records of one rank's slices_<rank>.json to index.json's "tensors" table.
void add_slice_records(nlohmann::json& tensors, const nlohmann::json& records);

// index.json of `dir`, checked to be an accel checkpoint of kCheckpointVersion.
nlohmann::json parse_index(const std::string& dir);
// The "tensors" table of a parsed index.json, by key.
std::map<std::string, Entry> entries_of(const nlohmann::json& index, const std::string& dir);

}  // namespace accel::checkpoint
