// accel::checkpoint — the sharded training state on disk, readable at any world size and strategy.
//
// Layout of a checkpoint directory:
//   index.json        written last by rank 0: format/version, the saving world and strategy, every
//                     tensor's full shape and dtype and where each slice of it lives, the optimizer's
//                     type and scalar state, the training state (step, scheduler, loaders, ...), and
//                     "state_dict": [[name, key], ...], the model's tensors in state_dict order with
//                     the key holding each (merge_weights.h writes the model's files from it).
//   shard_<r>.bin     rank r's slices, raw little-endian, one after another (CRC32 per slice).
//   rng_<r>.bin       rank r's CPU generator state.
//   object_<name>.bin objects registered with register_for_checkpointing (rank 0).
//
// A tensor is addressed flat: a slice is the element range [begin, end) of the tensor viewed 1-D.
// Keys: "param/<name>" (the fp32 master values, or the parameter itself where it has no master),
// "optim/<state>/<name>" (exp_avg, exp_avg_sq, momentum_buffer, ...), "buffer/<name>" (rank 0, whole).
// Each rank writes the slices its masters hold; replicated state is written once (by rank 0 of the
// replicas). Loading maps the new engine's masters onto those slices, so ZeRO-3 at 4 ranks loads into
// ZeRO-1 at 2 or DDP at 1, optimizer moments included.
//
// Loading checks everything it reads (file sizes, checksums, shapes, the optimizer type) on every rank
// and agrees across ranks before it changes anything: a bad checkpoint leaves the model as it was.
#pragma once

#include "checkpoint/checkpoint_error.h"
#include "comm/communicator.h"
#include "zero/engine.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace accel::checkpoint {

struct LoaderPosition {
  std::int64_t epoch = 0;             // the epoch being iterated (or the next one)
  std::int64_t batches_consumed = 0;  // batches of that epoch already yielded
  std::int64_t global_batch = 0;      // samples per batch over all ranks then; 0: not recorded (older checkpoints)
};

// What the Accelerator saves beside the model and the optimizer.
struct TrainingState {
  std::int64_t step = 0;                        // optimizer steps taken
  std::int64_t micro_step = 0;                  // micro-steps into the accumulation window (0: at its start)
  std::int64_t accumulation_steps = 1;          // the window's length then
  std::optional<std::int64_t> scheduler_steps;  // the prepared scheduler's steps, if one was prepared
  std::vector<double> lrs;                      // per optimizer param group
  std::vector<LoaderPosition> loaders;          // prepared loaders, in prepare order
  std::string loss_scaler;                      // the loss scaler's state as text, "" if none
  std::map<std::string, std::string> objects;   // register_for_checkpointing: name -> bytes (rank 0)
};

struct SavedInfo {
  int world_size = 0;
  std::string strategy;
  std::string optimizer;  // "AdamW", "Adam", "SGD", "RMSprop", "Adagrad", "" (none)
};

// Collective. Writes this rank's files into `dir` (which must exist, on a filesystem every rank
// sees); after a barrier rank 0 writes index.json. `opt` may be null (model only). full: rank 0
// writes every tensor whole (gathered one flat parameter at a time); the reader does not care which.
void write_state(const std::string& dir, const zero::Engine& engine, torch::nn::Module& model,
                 torch::optim::Optimizer* opt, const TrainingState& training, comm::Communicator& world,
                 bool full = false);

// Collective. Reads `dir` into the prepared engine/model/optimizer (any saving world size and
// strategy) and this rank's RNG state (when the checkpoint has one for this rank), and returns the
// training state. Throws CheckpointError on every rank, naming the file and what is wrong, with
// nothing changed, when any rank finds a problem.
TrainingState read_state(const std::string& dir, zero::Engine& engine, torch::nn::Module& model,
                         torch::optim::Optimizer* opt, comm::Communicator& world);

// index.json's summary (throws CheckpointError if it is missing or does not parse).
SavedInfo read_info(const std::string& dir);

}  // namespace accel::checkpoint
