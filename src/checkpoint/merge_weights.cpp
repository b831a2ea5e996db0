// merge_weights: a save_state checkpoint to the model's full weights, offline (see merge_weights.h).
#include "checkpoint/merge_weights.h"

#include "base/error.h"
#include "base/files.h"
#include "base/progress.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/slice_reader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>

namespace accel::checkpoint {

namespace {

using nlohmann::json;

// The model's tensors as (name, key) in state_dict order. index.json lists them ("state_dict"); a
// checkpoint written before it did gets its parameters, then its buffers, by name.
std::vector<std::pair<std::string, std::string>> tensors_in_order(const json& index,
                                                                  const std::map<std::string, Entry>& entries,
                                                                  const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  if (index.contains("state_dict")) {
    try {
      for (const auto& pair : index.at("state_dict"))
        out.emplace_back(pair.at(0).get<std::string>(), pair.at(1).get<std::string>());
    } catch (const json::exception& e) {
      throw CheckpointError(fmt::format("{}/index.json: malformed \"state_dict\": {}", dir, e.what()));
    }
    for (const auto& [name, key] : out)
      if (!entries.count(key))
        throw CheckpointError(
            fmt::format("{}/index.json: '{}' is held by '{}', which the checkpoint does not have", dir, name, key));
    return out;
  }
  for (const char* prefix : {"param/", "buffer/"})
    for (const auto& [key, e] : entries)
      if (key.rfind(prefix, 0) == 0) out.emplace_back(key.substr(std::string(prefix).size()), key);
  return out;
}

// index.json of `dir`; where it has none but is a project directory (or its checkpoints/), the error
// names its newest automatic checkpoint.
json index_or_hint(const std::string& dir) {
  if (files::is_file(dir + "/index.json") || !files::is_dir(dir)) return parse_index(dir);
  std::string project = dir;
  while (project.size() > 1 && project.back() == '/') project.pop_back();
  const std::string base = project.substr(project.find_last_of('/') + 1);
  if (base == "checkpoints") project = files::parent_dir(project);
  auto found = automatic_checkpoints(project);
  while (!found.empty() && !files::is_file(found.back().second + "/index.json")) found.pop_back();
  if (found.empty()) return parse_index(dir);
  throw CheckpointError(
      fmt::format("no index.json in {}: not a checkpoint; its newest checkpoint is {}", dir, found.back().second));
}

}  // namespace

MergeResult merge_weights(const std::string& checkpoint_dir, const std::string& out_dir, const MergeOptions& options) {
  if (options.dtype && !at::isFloatingType(*options.dtype))
    throw accel::InvalidArgumentError(
        fmt::format("merge-weights: --dtype must be a floating-point type, not {}", c10::toString(*options.dtype)));
  if (files::is_within(out_dir, checkpoint_dir))
    throw accel::InvalidArgumentError(
        fmt::format("merge-weights: the output directory {} is inside the checkpoint {}; name one outside it", out_dir,
                    checkpoint_dir));
  const json index = index_or_hint(checkpoint_dir);
  const auto entries = entries_of(index, checkpoint_dir);
  const auto order = tensors_in_order(index, entries, checkpoint_dir);
  if (order.empty())
    throw CheckpointError(fmt::format("{}/index.json: the checkpoint holds no parameters", checkpoint_dir));

  MergeResult result;
  result.world_size = index.value("world_size", 0);
  result.strategy = index.value("strategy", "");
  if (index.contains("training")) result.step = index["training"].value("step", std::int64_t{0});

  // --dtype converts the parameters (buffers keep their dtype, as in save_model's compute_dtype files).
  auto out_dtype = [&](const std::string& key, c10::ScalarType saved) {
    return options.dtype && at::isFloatingType(saved) && key.rfind("param/", 0) == 0 ? *options.dtype : saved;
  };
  std::vector<SafetensorsTensorSpec> specs;
  for (const auto& [name, key] : order) {
    const Entry& e = entries.at(key);
    specs.push_back({name, out_dtype(key, e.dtype), e.shape});
  }
  // The directories this merge creates (the output and any missing parents), removed again if it fails.
  std::vector<std::string> created;
  for (std::string d = files::resolved_path(out_dir); d.size() > 1 && !files::exists(d); d = files::parent_dir(d))
    created.push_back(d);
  try {
    ModelFilesWriter writer("merge-weights", out_dir, specs, options.max_shard_size, options.metadata);
    result.files = writer.plan().files;
    result.total_bytes = writer.plan().total_bytes;
    SliceReader reader(checkpoint_dir);
    ProgressBar bar(static_cast<std::int64_t>(order.size()), "merge-weights", options.progress);
    for (const auto& [name, key] : order) {
      const Entry& e = entries.at(key);
      std::int64_t numel = 1;
      for (auto d : e.shape) numel *= d;
      at::Tensor t = reader.range(key, e, 0, numel).view(e.shape);
      reader.forget();
      if (t.scalar_type() != out_dtype(key, e.dtype)) t = t.to(out_dtype(key, e.dtype));
      result.largest_tensor_bytes = std::max<std::int64_t>(result.largest_tensor_bytes, t.nbytes());
      writer.write(name, t);
      ++result.tensors;
      bar.update();
    }
    writer.finish();
    bar.close();
    result.bytes_read = reader.bytes_read();
  } catch (...) {
    for (const auto& d : created) ::rmdir(d.c_str());  // deepest first; each only if left empty
    throw;
  }
  return result;
}

}  // namespace accel::checkpoint
