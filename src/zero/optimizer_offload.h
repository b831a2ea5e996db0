// accel::zero::OptimizerOffload — the optimizer's fp32 master weights and its state (Adam's moments,
// SGD's momentum) in one file per rank under offload_optimizer.nvme_path, stepped one sub-group at a
// time (ZeRO-Infinity's optimizer offload to NVMe).
//
// The file holds, per region (one flat parameter's master range on this rank), chunks of at most
// sub_group_size elements; a chunk's record is its master then each state tensor, each padded to a
// multiple of 4 KiB so that every transfer is O_DIRECT-aligned. A step walks the chunks whose region
// has a gradient through buffer_count buffers: while chunk i is stepped (optim::adam_step/sgd_step,
// the same bits as torch::optim), chunks i+1.. are read ahead and chunk i-1 is written behind. RAM
// holds the buffers, never the state.
//
// The file is scratch: it is removed when the object goes, and checkpoints read and write the state
// through read()/write() (the durable copy is the checkpoint, as in DeepSpeed).
//
// A step that fails partway (an I/O error, a throwing callback) leaves some chunks stepped and others
// not. Then step() and read() (so save_state) refuse, naming the file and the failure, until every
// region's master and state have been written again (write(): load_state from a checkpoint); never a
// mix of two steps passed on as one.
#pragma once

#include "optim/fused_step.h"
#include "zero/spec.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace accel::offload {
class AsyncFile;
class AlignedBuffer;
class ScratchFile;
}  // namespace accel::offload

namespace accel::zero {

// How one param group steps: the optimizer's kind and its options now (an LR scheduler changes lr
// between steps; the state layout is fixed by the rule the region was created with).
struct OffloadRule {
  enum class Kind { Adam, Sgd };
  Kind kind = Kind::Adam;
  optim::AdamHyper adam;
  optim::SgdHyper sgd;
  // State tensors beside the master, and their names as torch::optim and checkpoints call them.
  int state_count() const;
  const char* state_name(int slot) const;  // slot 1..state_count(); 0 is the master
};

class OptimizerOffload {
 public:
  struct Region {
    std::int64_t numel = 0;
    OffloadRule rule;
  };
  // Creates (and reserves room for) this rank's file under spec.optimizer_nvme_path, after checking
  // the directory (offload::check_offload_dir). Masters start at zero until init() writes them.
  OptimizerOffload(const OffloadSpec& spec, int rank, std::vector<Region> regions);
  ~OptimizerOffload();
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  // Bytes the file holds for `regions` under `spec` (what the directory needs): per region
  // (1 + state_count) * numel * 4 bytes, each chunk's tensors rounded up to 4 KiB.
  static std::uint64_t file_bytes(const OffloadSpec& spec, const std::vector<Region>& regions);

  // Region i's master := values (numel fp32 elements, any device-CPU tensor), its state := zeros,
  // its step count := 0 (before the first step, as torch::optim creates state).
  void init(std::size_t i, const at::Tensor& values);

  // Called with each updated master chunk: region, the chunk's first element, its fp32 values (valid
  // only during the call).
  using Updated = std::function<void(std::size_t region, std::int64_t begin, const at::Tensor& values)>;
  // One step of every region whose grads[i] is defined (fp32, numel elements) under rules[i] (same
  // kind and state layout as the region's own rule).
  void step(const std::vector<at::Tensor>& grads, const std::vector<OffloadRule>& rules, const Updated& updated);

  // Checkpoint access: region i's slot (0 master, 1.. state) as a new fp32 tensor; write replaces it.
  at::Tensor read(std::size_t i, int slot) const;
  void write(std::size_t i, int slot, const at::Tensor& values);
  // Steps region i has taken (torch's state step; for SGD whether the momentum buffer exists).
  std::int64_t steps(std::size_t i) const { return steps_.at(i); }
  void set_steps(std::size_t i, std::int64_t n) { steps_.at(i) = n; }
  const std::vector<Region>& regions() const { return regions_; }

  const std::string& path() const;
  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t bytes_read() const;
  std::uint64_t bytes_written() const;

 private:
  struct Chunk {
    std::size_t region;
    std::int64_t begin, len;   // elements of the region
    std::uint64_t offset;      // of its record in the file
    std::uint64_t slot_bytes;  // each tensor's padded bytes
  };
  std::uint64_t record_bytes(const Chunk& c) const;
  OffloadSpec spec_;
  std::vector<Region> regions_;
  std::vector<Chunk> chunks_;
  std::vector<std::vector<std::size_t>> region_chunks_;
  std::vector<std::int64_t> steps_;
  // Non-empty after a step failed partway: what failed. Cleared once every (region, slot) is rewritten.
  std::string torn_;
  std::vector<std::vector<char>> rewritten_;
  void check_whole(const char* what) const;
  void mark_torn(const std::string& why);
  std::vector<offload::AlignedBuffer> buffers_;
  // After the buffers: destroyed first, it waits for transfers into or out of them.
  std::unique_ptr<offload::ScratchFile> scratch_;
  offload::AsyncFile* file_ = nullptr;  // scratch_'s
  std::uint64_t bytes_ = 0;
};

}  // namespace accel::zero
