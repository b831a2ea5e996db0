#include "checkpoint/slice_format.h"

#include "base/files.h"

#include <fmt/format.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

namespace accel::checkpoint {
namespace {

using nlohmann::json;

c10::ScalarType dtype_from(const std::string& s, const std::string& file) {
  for (auto t : {c10::kFloat, c10::kDouble, c10::kHalf, c10::kBFloat16, c10::kLong, c10::kInt, c10::kShort, c10::kChar,
                 c10::kByte, c10::kBool})
    if (s == c10::toString(t)) return t;
  throw CheckpointError(fmt::format("{}: unknown dtype '{}'", file, s));
}

}  // namespace

std::uint32_t slice_crc32(const void* data, std::size_t n) {
  return static_cast<std::uint32_t>(::crc32_z(0, static_cast<const Bytef*>(data), n));
}

std::string rank_file(const char* stem, int rank, const char* ext) {
  return std::string(stem) + "_" + std::to_string(rank) + ext;
}

json slice_record(const std::string& key, const std::vector<std::int64_t>& shape, c10::ScalarType dtype,
                  const Slice& s) {
  return {{"key", key},       {"shape", shape},     {"dtype", c10::toString(dtype)},
          {"file", s.file},   {"offset", s.offset}, {"bytes", s.bytes},
          {"begin", s.begin}, {"end", s.end},       {"crc32", s.crc}};
}

void add_slice_records(json& tensors, const json& records) {
  for (const auto& s : records) {
    json& t = tensors[s.at("key").get<std::string>()];
    if (t.is_null()) t = {{"shape", s.at("shape")}, {"dtype", s.at("dtype")}, {"slices", json::array()}};
    t["slices"].push_back({{"file", s.at("file")},
                           {"offset", s.at("offset")},
                           {"bytes", s.at("bytes")},
                           {"begin", s.at("begin")},
                           {"end", s.at("end")},
                           {"crc32", s.at("crc32")}});
  }
}

json parse_index(const std::string& dir) {
  const std::string path = dir + "/index.json";
  if (!files::is_file(path))
    throw CheckpointError(
        fmt::format("no index.json in {}: not an accel checkpoint, or a save that did not finish", dir));
  json j;
  try {
    j = json::parse(files::read_file(path));
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{} does not parse: {}", path, e.what()));
  } catch (const std::runtime_error& e) {
    throw CheckpointError(e.what());
  }
  if (!j.is_object() || j.value("format", "") != kCheckpointFormat)
    throw CheckpointError(
        fmt::format("{}: not an accel checkpoint index (format is not '{}')", path, kCheckpointFormat));
  if (j.value("version", 0) != kCheckpointVersion)
    throw CheckpointError(fmt::format("{}: checkpoint version {}, this accel reads version {}", path,
                                      j.value("version", 0), kCheckpointVersion));
  return j;
}

std::map<std::string, Entry> entries_of(const json& index, const std::string& dir) {
  std::map<std::string, Entry> out;
  try {
    for (const auto& [key, e] : index.at("tensors").items()) {
      Entry en;
      en.shape = e.at("shape").get<std::vector<std::int64_t>>();
      en.dtype = dtype_from(e.at("dtype").get<std::string>(), dir + "/index.json");
      for (const auto& s : e.at("slices"))
        en.slices.push_back({s.at("file").get<std::string>(), s.at("offset").get<std::uint64_t>(),
                             s.at("bytes").get<std::uint64_t>(), s.at("begin").get<std::int64_t>(),
                             s.at("end").get<std::int64_t>(), s.at("crc32").get<std::uint32_t>()});
      out.emplace(key, std::move(en));
    }
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{}/index.json: malformed tensor table: {}", dir, e.what()));
  }
  return out;
}

}  // namespace accel::checkpoint
