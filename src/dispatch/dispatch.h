// accel::load_checkpoint_and_dispatch — big-model inference: load a checkpoint into a model (built
// normally or under init_empty_weights), each part at its place, the parts that do not fit in memory
// paged in from disk around their forward. Accelerate's big_modeling.py, for accel's units.
//
//   auto model = accel::make_empty<Llama>(config);
//   accel::DispatchOptions o;
//   o.max_memory = accel::parse_max_memory("cpu=2GB");
//   o.offload_folder = "/tmp/offload";
//   auto r = accel::load_checkpoint_and_dispatch(model, "path/to/checkpoint_dir", o);
//   auto logits = model->forward(tokens);   // the same code as before
//
// Places (device_map.h): groups of accel units go to "cuda:N", "cpu" or "disk"; everything outside
// the groups (the model's own code) to one main device. Loading streams one tensor at a time from
// the checkpoint (a .safetensors file, or a Hugging Face directory: model.safetensors or an index
// and its shards) into a new tensor at its place and points the parameter at it (Tensor::set_data:
// the parameter keeps its identity, so the module's members see it); floating-point tensors are
// converted to the parameter's dtype (or options.dtype).
//
// Disk: a disk group's parameters point into a private read-only-in-effect memory mapping of a
// safetensors file: the checkpoint's own file when the tensor is stored there in the right dtype
// (and aligned), else a copy converted into offload_folder/offload.safetensors. The unit's hooks
// (sharding/unit.h) ask the kernel to read its ranges ahead just before its forward (MADV_WILLNEED)
// and drop its pages right after (MADV_DONTNEED; with drop_page_cache, the page cache's copy too).
// Between forwards the parameters point into the mapping (always readable: a page that was dropped
// is read again from the file); for its forward a unit's parameters point at a copy in aligned memory
// (copy_disk_weights), each tensor's mapped pages dropped as soon as it is copied. The memory the
// process holds for disk weights is the unit that runs. Writes into a disk parameter are not kept.
//
// Devices: a group on another device than the main one gets its tensor arguments moved to its
// device before it runs and its Tensor / vector<Tensor> outputs moved back to the main device (disk
// groups run on the cpu). A unit returning anything else (a tuple with a cache) must be on the main
// device or take care of devices itself.
//
// Checks, all before anything is loaded (std::invalid_argument, naming what is wrong): an unknown
// device map strategy, a map naming a module or tensor the model does not have, an unknown or absent
// device, a map that splits a group or puts something outside the groups on two places or on disk,
// a tensor not covered by the map, disk places without offload_folder, a parameter the checkpoint
// lacks, a shape that differs (both shapes), a non-floating dtype that differs. Checkpoint tensors
// the model lacks are ignored (Accelerate's strict=False) and counted.
//
// The checkpoint's files (and offload_folder's) must stay as they are while the model lives: disk
// parameters are read from them at every forward. A dispatched model is for inference:
// Accelerator::prepare refuses it (is_dispatched).
#pragma once

#include "dispatch/device_map.h"
#include "dispatch/empty_weights.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace torch::nn {
class Module;
}

namespace accel {

struct DispatchOptions {
  // "auto" | "balanced" | "sequential" (infer_auto_device_map), or an explicit map.
  std::variant<std::string, DeviceMap> device_map = std::string("auto");
  MaxMemory max_memory;                  // empty: the cpu with the memory the system has available
  std::string offload_folder;            // required when anything goes to disk
  std::vector<std::string> no_split;     // module class names placed whole (units always are)
  std::optional<c10::ScalarType> dtype;  // floating-point weights converted to it (else: the model's)
  bool drop_page_cache = false;          // after a disk unit runs, drop its pages from the page cache too
  // A disk unit's forward runs on a copy of its weights in allocator-aligned memory (made from the
  // mapping just before, freed just after): results bitwise equal to the model loaded in memory.
  // false: straight from the mapping (no copy; BLAS may round differently on the unaligned data).
  bool copy_disk_weights = true;
};

struct DispatchResult {
  DeviceMap device_map;
  std::string main_device;
  std::int64_t tensors_loaded = 0;
  std::int64_t unexpected_tensors = 0;  // in the checkpoint, not in the model (ignored)
  std::map<std::string, std::int64_t> bytes_by_place;
  std::int64_t disk_units = 0;
  std::int64_t disk_bytes_mapped_from_checkpoint = 0;
  std::int64_t disk_bytes_written_to_offload = 0;
  std::int64_t largest_group_bytes = 0;
};

DispatchResult load_checkpoint_and_dispatch(const std::shared_ptr<torch::nn::Module>& model,
                                            const std::string& checkpoint, const DispatchOptions& options = {});

// Whether `model` was dispatched by load_checkpoint_and_dispatch (and is still alive), and its map.
bool is_dispatched(const torch::nn::Module& model);
std::optional<DeviceMap> dispatched_device_map(const torch::nn::Module& model);

// The counters of disk paging since the start of the process (for tests and benchmarks).
struct PagingStats {
  std::int64_t page_ins = 0;     // disk units that ran
  std::int64_t bytes_paged = 0;  // their parameter bytes
};
PagingStats paging_stats();

}  // namespace accel
