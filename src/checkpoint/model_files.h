// accel::checkpoint model files — the Hugging Face layout of a model's full weights in a directory:
//
//   dir/model.safetensors                                   everything fits in max_shard_size, or
//   dir/model-00001-of-0000n.safetensors ... + dir/model.safetensors.index.json
//        {"metadata": {"total_size": <tensor bytes>}, "weight_map": {name: file}}
//
// Both writers of that layout use it: save_model (a prepared model, model_export.h) and merge_weights
// (a sharded save_state checkpoint, offline: merge_weights.h). So the same tensors in the same order
// give the same files, byte for byte. resolve_model_files is its reading side (load_model, dispatch).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace accel::checkpoint {

struct SafetensorsTensorSpec;  // safetensors.h
class SafetensorsWriter;

// Accelerate's default max_shard_size ("10GB").
inline constexpr std::int64_t kDefaultMaxShardSize = 10'000'000'000;

// Which file each tensor goes to: a new file starts when the next tensor (in the given order) would
// push the current one past max_shard_size (a tensor larger than that gets a file of its own).
struct ModelFilesPlan {
  std::vector<std::string> files;    // names inside the directory, in order
  std::vector<std::size_t> file_of;  // per tensor of the given order
  std::int64_t total_bytes = 0;      // bytes of tensor data (the index's total_size)
};
// Throws InvalidArgumentError for max_shard_size <= 0.
ModelFilesPlan plan_model_files(const std::vector<SafetensorsTensorSpec>& tensors, std::int64_t max_shard_size);

// Writes one model's files: the constructor creates `dir` (and its parents) and opens every file
// (headers first); write() each declared tensor once, in any order; finish() closes the files, writes
// the index (several files), and removes files of an earlier save into `dir` that this one does not list
// (model.safetensors, model-*-of-*.safetensors, the index). Destroyed unfinished, it leaves `dir`'s
// earlier files as they were. `who` begins its error messages ("save_model", "merge-weights").
class ModelFilesWriter {
 public:
  ModelFilesWriter(std::string who, std::string dir, const std::vector<SafetensorsTensorSpec>& tensors,
                   std::int64_t max_shard_size, const std::map<std::string, std::string>& metadata);
  ~ModelFilesWriter();
  ModelFilesWriter(const ModelFilesWriter&) = delete;
  ModelFilesWriter& operator=(const ModelFilesWriter&) = delete;

  const ModelFilesPlan& plan() const { return plan_; }
  // `t` must have the declared dtype and shape (any device, any strides).
  void write(const std::string& name, const at::Tensor& t);
  void finish();

 private:
  std::string who_, dir_;
  ModelFilesPlan plan_;
  std::vector<std::string> names_;  // the tensors, in the given order
  std::map<std::string, std::size_t> file_by_name_;
  std::vector<std::unique_ptr<SafetensorsWriter>> writers_;
};

// The safetensors files of a checkpoint (as load_model resolves path_or_dir), and which file holds
// each tensor. Throws naming the path for a missing or malformed checkpoint / index.
struct ModelFiles {
  std::vector<std::string> files;            // full paths
  std::map<std::string, std::string> where;  // tensor name -> full path (empty for a single file)
};
ModelFiles resolve_model_files(const std::string& path_or_dir);

}  // namespace accel::checkpoint
