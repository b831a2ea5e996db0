// accel::zero::ParamOffload — ZeRO-3 parameter shards in a file per rank under
// offload_param.nvme_path (ZeRO-Infinity's parameter offload to NVMe), or, for shards on a device
// with offload_param.device cpu, in pinned host memory (ZeRO-Infinity's offload to CPU memory).
//
// Each offloaded flat parameter's shard (compute dtype) has a 4 KiB-aligned region of the file. Its
// storage in RAM exists only from fetch() until release(): the engine fetches a unit's shards before
// its all-gather (ahead of time, in the order the previous forward and backward used) and releases
// them once the gather has completed; the gathered parameters then live as long as the strategy keeps
// them. After each step the updated values are store()d to the file. Reads land in buffer_count
// aligned staging buffers (O_DIRECT) and are copied into the shard's own storage (on the device:
// copied there; for a device, the staging buffers are pinned and the copy is queued on HostCopies'
// to-device side stream, which the compute stream waits for). In host memory, each shard has a
// pinned copy that fetch_async() starts copying to the device on HostCopies' side stream (after the
// work queued so far; the host does not wait), and fetch() makes the compute stream wait for that
// copy (on the device: the host goes on queueing). A shard whose host master is the same bytes (fp32
// compute over fp32 masters in pinned host memory, offload_optimizer device cpu) keeps no copy of
// its own: the master is its pinned copy, and store() of the master writes nothing.
#pragma once

#include "zero/host_copies.h"
#include "zero/spec.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace accel::offload {
class AsyncFile;
class AlignedBuffer;
class ScratchFile;
}  // namespace accel::offload
namespace accel::sharding {
class FlatParam;
}

namespace accel::zero {

// Which staging buffer ParamOffload reads into next, as a rule of its own (tests/zero/test_offload.cpp).
// For buffer k: free[k], no read is landing in it; copy_running[k], its last copy to the device has not
// finished; queued[k], when that copy was queued (larger: later). The choice: the lowest free buffer
// whose copy is done (or that never had one); else kGrowBuffer where can_grow (param_buffer_count not
// reached); else the free buffer whose copy was queued first (the host waits for it); else
// kLandOldestRead (every buffer holds a read nobody waited for yet: the one issued first is landed).
// Taking the lowest free buffer regardless would take, on a device, the one whose copy was queued
// last: the host would wait for the device at every prefetch, staying one unit ahead at most.
constexpr int kGrowBuffer = -1, kLandOldestRead = -2;
int choose_staging_buffer(const std::vector<bool>& free, const std::vector<bool>& copy_running,
                          const std::vector<std::uint64_t>& queued, bool can_grow);

class ParamOffload {
 public:
  // Checks the directory, creates and reserves this rank's file, writes each flat's shard there and
  // frees its storage. In host memory: `copies` moves the shards of a device (nullptr: copied on the
  // current stream, the host waiting), and masters[i], where defined, is flat i's pinned host master
  // in the shard's dtype and size, which then serves as its pinned copy (the engine keeps it current).
  ParamOffload(const OffloadSpec& spec, int rank, std::vector<sharding::FlatParam*> flats, HostCopies* copies = nullptr,
               const std::vector<at::Tensor>& masters = {});
  ~ParamOffload();
  ParamOffload(const ParamOffload&) = delete;
  ParamOffload& operator=(const ParamOffload&) = delete;

  // Starts reading flat i's shard (no-op when resident or already on its way); in host memory for a
  // device, its copy starts on the side stream (the device's storage is taken now, and held until
  // release(): a shard fetched ahead for a unit that is not gathered after all stays until then).
  void fetch_async(std::size_t i);
  // Flat i's shard is resident when this returns (reads it now if nobody asked before); a copy to a
  // device is waited for by the current stream, not by the host.
  void fetch(std::size_t i);
  // Frees flat i's shard storage (the file holds its values). No-op when not resident.
  void release(std::size_t i);
  // The shard has storage, and its values or a copy of them on its way (fetch() waits for that).
  bool resident(std::size_t i) const;
  // Writes `values` (converted to the flat's dtype) at element `begin` of flat i's shard in the file,
  // and into the resident shard if it is resident. begin is a multiple of 4096 elements; values
  // runs to the end of the shard or is a multiple of 4096 elements long.
  void store(std::size_t i, std::int64_t begin, const at::Tensor& values);

  const std::string& path() const;  // the file; empty when the shards are in host memory
  bool in_host_memory() const { return !scratch_; }
  std::uint64_t bytes() const { return bytes_; }
  // Of bytes(), those in buffers of its own (in host memory, the rest are the masters' bytes).
  std::uint64_t owned_bytes() const { return owned_bytes_; }
  std::uint64_t bytes_read() const;
  std::uint64_t bytes_written() const;

 private:
  struct Slot {
    sharding::FlatParam* flat;
    std::uint64_t offset = 0, bytes = 0, padded = 0;
    bool resident = false;
    int buffer = -1;  // staging buffer a read is landing in, -1: none
    std::uint64_t ticket = 0;
    at::Tensor host;  // in host memory: the shard's pinned bytes (its own, or the master's)
    std::shared_ptr<const HostCopies::Done> arriving;  // for a device: its copy there, not yet waited for
    // Its last copy from host memory to the device, waited for or not: the destructor waits for it
    // before the pinned bytes it reads go.
    std::shared_ptr<const HostCopies::Done> last_copy;
  };
  int take_buffer();
  void arrived(Slot& s);  // the current stream waits for s's copy still arriving, if any
  void land(std::size_t i);
  OffloadSpec spec_;
  std::vector<Slot> slots_;
  void* staging(int b) const;  // buffer b's bytes
  std::vector<offload::AlignedBuffer> buffers_;
  // For a device: the staging buffers in pinned memory instead (each aligned inside its tensor), and
  // the copy to the device still reading each, which a new read into it waits for.
  std::vector<at::Tensor> pinned_;
  std::vector<std::shared_ptr<const HostCopies::Done>> buffer_copy_;
  std::vector<std::uint64_t> buffer_copy_order_;  // when each buffer's copy was queued (copies_queued_)
  std::uint64_t copies_queued_ = 0;
  std::vector<int> buffer_owner_;  // slot whose read is landing in it, -1: free
  // After the buffers: destroyed first, it waits for reads still landing in them.
  std::unique_ptr<offload::ScratchFile> scratch_;
  offload::AsyncFile* file_ = nullptr;  // scratch_'s
  HostCopies* copies_ = nullptr;
  std::uint64_t bytes_ = 0, owned_bytes_ = 0, largest_ = 0;
};

}  // namespace accel::zero
