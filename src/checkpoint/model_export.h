// accel::checkpoint model export — a prepared (possibly sharded) model's full weights to and from
// safetensors files in the Hugging Face layout (model_files.h).
//
// Names are the model's own (named_parameters() then named_buffers(), as state_dict()), so the
// files load with Python's safetensors / transformers and into an unprepared libtorch model.
//
// save_model is collective (every rank of the engine's world calls it). Units are gathered one at a
// time into a temporary (charged to memory::Category::Gathered) that is freed before the next one:
// rank 0 never holds more than one unit's parameters beyond its shard, plus one tensor's CPU copy
// when training on a GPU. Rank 0 streams each tensor into its file as its unit arrives (the headers
// are written first: names, dtypes and shapes are known on every rank). Each file is written to
// name.tmp and renamed into place; the index comes last, then files of an earlier save_model that
// the new one does not list (model.safetensors, model-*-of-*.safetensors, the index) are removed.
// Weights are saved in the dtype the optimizer steps (the fp32 master where one exists in another
// dtype than the compute copy, as FSDP's full state dict does), else the parameters' dtype.
//
// load_model is collective too; call it between steps (units at rest, as after prepare() or
// optimizer->step()). Every rank reads only the byte ranges it keeps: the elements of its
// master shard (Engine::master_range), of its parameter shard for frozen flats, and whole buffers;
// then Engine::params_from_masters() refreshes the compute copies and re-gathers replicated
// parameters. Every check (names, shapes, dtypes, files) runs before anything is written; ranks agree
// on failure, so a bad checkpoint is an exception on every rank, not a hang. Floating-point tensors
// are converted to the model's dtype; other dtypes must match.
//
// Errors: std::runtime_error (SafetensorsError for a malformed file) naming the file or directory,
// the tensor, and what is wrong.
#pragma once

#include "checkpoint/model_files.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace accel::zero {
class Engine;
}

namespace accel::checkpoint {

struct SaveModelOptions {
  std::map<std::string, std::string> metadata = {{"format", "pt"}};  // every file's __metadata__
  bool progress = false;                                             // a progress bar on rank 0 (one step per unit)
  // Write the weights in the compute dtype (bf16/fp16 under mixed precision: DeepSpeed's
  // gather_16bit_weights_on_model_save) instead of the fp32 masters.
  bool compute_dtype = false;
};

struct SaveModelResult {
  std::vector<std::string> files;  // file names inside dir, in order (the same on every rank)
  std::int64_t total_bytes = 0;    // bytes of tensor data (the index's total_size)
  // Most bytes of gathered temporaries this rank held at once, and the bound it must respect:
  // the padded bytes of the largest unit (all its flat parameters, in the saved dtype).
  std::int64_t peak_gathered_bytes = 0;
  std::int64_t largest_unit_bytes = 0;
};

// Collective. Writes the model's full weights into `dir` (created if missing) from rank 0.
// max_shard_size_bytes > 0: a new file starts when the next tensor would push the current one past
// it (a tensor larger than that gets a file of its own).
SaveModelResult save_model(zero::Engine& engine, torch::nn::Module& model, const std::string& dir,
                           std::int64_t max_shard_size_bytes = kDefaultMaxShardSize,
                           const SaveModelOptions& options = {});

struct LoadModelOptions {
  bool progress = false;
};

struct LoadModelResult {
  std::vector<std::string> files;  // the safetensors files the checkpoint consists of
  std::int64_t tensors = 0;        // tensors loaded
  std::uint64_t bytes_read = 0;    // tensor bytes this rank read (its shards, its buffers)
};

// Collective. path_or_dir: a .safetensors file, or a directory holding model.safetensors or
// model.safetensors.index.json (+ its shards). The checkpoint must hold exactly the model's
// parameters and buffers, with the same shapes.
LoadModelResult load_model(zero::Engine& engine, torch::nn::Module& model, const std::string& path_or_dir,
                           const LoadModelOptions& options = {});

}  // namespace accel::checkpoint
