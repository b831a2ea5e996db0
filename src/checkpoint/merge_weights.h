// accel::checkpoint merge_weights — a save_state checkpoint (sharded or full, saved at any world size
// under any strategy) to the model's full weights in the Hugging Face layout (model_files.h), offline:
// one process, no model, no ranks. What Accelerate's `accelerate merge-weights` does for FSDP's
// sharded state dicts and DeepSpeed's zero_to_fp32.py for ZeRO checkpoints; `accel merge-weights` runs it.
//
// The weights are the checkpoint's "param/<name>" tensors (the fp32 masters, or a parameter's own
// values where it has none) and its buffers, named and ordered as the model's state_dict. So merging a
// checkpoint gives the files save_model writes at the same point of training, byte for byte (with
// options.dtype, those of save_model's compute_dtype where the compute copies are the masters rounded:
// parameters converted, buffers as they are). A checkpoint written before index.json recorded that
// order ("state_dict") gets its parameters, then its buffers, in name order, and a tied parameter under
// its first name only: the same weights, split into files differently. Optimizer state is left out.
// One tensor is held at a time (read in place from its slices); every slice's size and CRC32 is checked
// as it is read.
//
// Errors: CheckpointError naming the checkpoint's file and what is wrong (not a checkpoint, a missing,
// truncated or corrupted shard, slices that do not cover a tensor exactly once); InvalidArgumentError
// for bad options, or an out_dir inside the checkpoint. Every tensor is read before the first file is
// renamed into place: a checkpoint that fails to read leaves `out_dir`'s earlier files as they were
// (and removes the directories the merge created).
#pragma once

#include "checkpoint/model_files.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace accel::checkpoint {

struct MergeOptions {
  std::int64_t max_shard_size = kDefaultMaxShardSize;  // bytes per file before the next one starts
  // Floating-point parameters converted to this dtype (bf16, fp16 for a smaller export; buffers keep
  // theirs, as in save_model's compute_dtype files); none: as saved.
  std::optional<c10::ScalarType> dtype;
  std::map<std::string, std::string> metadata = {{"format", "pt"}};  // every file's __metadata__
  bool progress = false;                                             // a progress bar, one step per tensor
};

struct MergeResult {
  std::vector<std::string> files;  // file names inside out_dir, in order
  std::int64_t tensors = 0;        // tensors written
  std::int64_t total_bytes = 0;    // bytes of tensor data written
  std::uint64_t bytes_read = 0;    // bytes read from the checkpoint's shard files
  std::int64_t largest_tensor_bytes = 0;
  int world_size = 0;    // the checkpoint's saving world
  std::string strategy;  // ... and strategy
  std::int64_t step = 0;
};

MergeResult merge_weights(const std::string& checkpoint_dir, const std::string& out_dir,
                          const MergeOptions& options = {});

}  // namespace accel::checkpoint
