#include "zero/param_offload.h"
#include "base/error.h"

#include "base/memory.h"
#include "offload/async_file.h"
#include "sharding/flat_param.h"
#include "zero/host_copies.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace accel::zero {
namespace {

std::string offloaded_message(const sharding::FlatParam& f, bool on_disk) {
  return fmt::format("accel: the shard of {} is offloaded to {} and not loaded now", f.name(),
                     on_disk ? "disk (offload_param.device nvme)" : "host memory (offload_param.device cpu)");
}

}  // namespace

ParamOffload::ParamOffload(const OffloadSpec& spec, int rank, std::vector<sharding::FlatParam*> flats,
                           HostCopies* copies, const std::vector<at::Tensor>& masters)
    : spec_(spec) {
  if (!spec_.param_on_disk()) {  // pinned host memory: one copy per shard, or the shard's master
    for (std::size_t k = 0; k < flats.size(); ++k) {
      auto* f = flats[k];
      const at::Tensor& shard = f->shard();
      Slot s;
      s.flat = f;
      s.bytes = static_cast<std::uint64_t>(shard.numel()) * shard.element_size();
      const at::Tensor master = k < masters.size() ? masters[k] : at::Tensor();
      if (master.defined()) {
        if (!master.is_cpu() || !master.is_contiguous() || master.scalar_type() != shard.scalar_type() ||
            master.numel() != shard.numel())
          throw accel::LogicError(
              fmt::format("ParamOffload: the master given for {} is not its shard's host twin", f->name()));
        s.host = master;
      } else {
        s.host = HostCopies::pinned_empty(static_cast<std::int64_t>(s.bytes), at::kByte,
                                          copies ? copies->device() : c10::Device(c10::kCPU));
        owned_bytes_ += s.bytes;
      }
      s.resident = true;
      bytes_ += s.bytes;
      slots_.push_back(std::move(s));
      if (!master.defined()) store(slots_.size() - 1, 0, shard);  // (a master holds these values already)
      release(slots_.size() - 1);
    }
    copies_ = copies;
    return;
  }
  copies_ = copies;
  std::uint64_t offset = 0, largest = 0;
  for (auto* f : flats) {
    Slot s;
    s.flat = f;
    s.offset = offset;
    s.bytes = static_cast<std::uint64_t>(f->shard().numel()) * f->shard().element_size();
    s.padded = offload::align_up(s.bytes);
    offset += s.padded;
    largest = std::max(largest, s.padded);
    slots_.push_back(std::move(s));
  }
  bytes_ = owned_bytes_ = offset;
  scratch_ = std::make_unique<offload::ScratchFile>(
      spec_.param_nvme_path, fmt::format("accel-param-rank{}-pid{}.swp", rank, static_cast<long>(getpid())), bytes_,
      spec_.aio, "offload_param.nvme_path");
  file_ = &scratch_->file();
  // Buffers are made as reads need them, up to buffer_count (prefetching one unit ahead uses two).
  largest_ = largest;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].resident = true;
    store(i, 0, slots_[i].flat->shard());
    release(i);
  }
}

ParamOffload::~ParamOffload() {
  // The page-locked buffers go with this object: no copy to the device may still read them, waited
  // for by the device or not. (A device in an error state throws from synchronize: nothing is left to
  // protect then, and a destructor must not throw.)
  try {
    for (auto& s : slots_)
      if (s.last_copy) s.last_copy->synchronize();
    for (auto& e : buffer_copy_)
      if (e) e->synchronize();
  } catch (...) {
  }
}

const std::string& ParamOffload::path() const {
  static const std::string none;
  return file_ ? file_->path() : none;
}
std::uint64_t ParamOffload::bytes_read() const { return file_ ? file_->bytes_read() : 0; }
std::uint64_t ParamOffload::bytes_written() const { return file_ ? file_->bytes_written() : 0; }
bool ParamOffload::resident(std::size_t i) const { return slots_.at(i).resident; }

void* ParamOffload::staging(int b) const {
  if (!pinned_[b].defined()) return buffers_[b].data();
  const auto p = reinterpret_cast<std::uintptr_t>(pinned_[b].data_ptr());
  return reinterpret_cast<void*>(offload::align_up(p));
}

int choose_staging_buffer(const std::vector<bool>& free, const std::vector<bool>& copy_running,
                          const std::vector<std::uint64_t>& queued, bool can_grow) {
  for (std::size_t k = 0; k < free.size(); ++k)
    if (free[k] && !copy_running[k]) return static_cast<int>(k);
  if (can_grow) return kGrowBuffer;
  int b = kLandOldestRead;
  for (std::size_t k = 0; k < free.size(); ++k)
    if (free[k] && (b < 0 || queued[k] < queued[static_cast<std::size_t>(b)])) b = static_cast<int>(k);
  return b;
}

int ParamOffload::take_buffer() {
  std::vector<bool> free(buffers_.size()), running(buffers_.size());
  for (std::size_t k = 0; k < buffers_.size(); ++k) {
    free[k] = buffer_owner_[k] < 0;
    running[k] = buffer_copy_[k] && !buffer_copy_[k]->query();
  }
  int b = choose_staging_buffer(free, running, buffer_copy_order_,
                                buffers_.size() < static_cast<std::size_t>(spec_.param_buffer_count));
  if (b == kGrowBuffer) {
    if (copies_) {  // (a device: pinned, so that its copy there runs on the side stream)
      buffers_.emplace_back();
      pinned_.push_back(HostCopies::pinned_empty(static_cast<std::int64_t>(largest_ + offload::kAlignment), at::kByte,
                                                 copies_->device()));
    } else {
      buffers_.emplace_back(largest_);
      pinned_.emplace_back();
    }
    buffer_copy_.emplace_back();
    buffer_copy_order_.push_back(0);
    buffer_owner_.push_back(-1);
    b = static_cast<int>(buffers_.size() - 1);
  }
  if (b == kLandOldestRead) {  // (all in use by reads nobody waited for yet: land the one issued first)
    std::size_t oldest = 0;
    for (std::size_t k = 1; k < buffer_owner_.size(); ++k)
      if (slots_[buffer_owner_[k]].ticket < slots_[buffer_owner_[oldest]].ticket) oldest = k;
    land(static_cast<std::size_t>(buffer_owner_[oldest]));
    b = static_cast<int>(oldest);
  }
  if (buffer_copy_[b]) {  // its last copy to the device still reads it
    buffer_copy_[b]->synchronize();
    buffer_copy_[b].reset();
  }
  return b;
}

void ParamOffload::fetch_async(std::size_t i) {
  Slot& s = slots_.at(i);
  if (s.resident || s.buffer >= 0) return;
  if (!file_) {  // host memory: to a device on the side stream; to the host, fetch() copies it
    const at::Tensor& shard = s.flat->shard();
    if (!copies_) return;
    {
      memory::CategoryScope cat(memory::Category::Parameters);
      sharding::alloc_storage(shard, s.bytes);
    }
    s.arriving =
        std::make_shared<const HostCopies::Done>(copies_->to_device_async(shard, s.host.view(shard.scalar_type())));
    s.last_copy = s.arriving;
    s.resident = true;
    return;
  }
  const int b = take_buffer();
  s.buffer = b;
  buffer_owner_[b] = static_cast<int>(i);
  s.ticket = file_->read_async(staging(b), s.padded, s.offset);
}

void ParamOffload::land(std::size_t i) {
  Slot& s = slots_[i];
  if (file_) file_->wait(s.ticket);
  const at::Tensor& shard = s.flat->shard();
  {
    memory::CategoryScope cat(memory::Category::Parameters);
    sharding::alloc_storage(shard, s.bytes);
  }
  if (!file_) {
    shard.copy_(s.host.view(shard.scalar_type()));
  } else if (pinned_[s.buffer].defined()) {
    // A device's shard from pinned staging: on the side stream; the buffer's next read waits for it.
    const at::Tensor& pinned = pinned_[s.buffer];
    const auto skip =
        static_cast<std::int64_t>(static_cast<char*>(staging(s.buffer)) - static_cast<char*>(pinned.data_ptr()));
    s.arriving = std::make_shared<const HostCopies::Done>(copies_->to_device_async(
        shard, pinned.narrow(0, skip, static_cast<std::int64_t>(s.bytes)).view(shard.scalar_type())));
    buffer_copy_[s.buffer] = s.arriving;
    buffer_copy_order_[s.buffer] = ++copies_queued_;
  } else if (shard.is_cpu()) {
    std::memcpy(shard.data_ptr(), staging(s.buffer), s.bytes);
  } else {  // (a device's shard: from the staging buffer, which is reused once this returns)
    shard.copy_(at::from_blob(staging(s.buffer), {shard.numel()}, shard.options().device(at::kCPU)));
  }
  if (s.buffer >= 0) buffer_owner_[s.buffer] = -1;
  s.buffer = -1;
  s.resident = true;
}

void ParamOffload::fetch(std::size_t i) {
  Slot& s = slots_.at(i);
  if (!s.resident && s.buffer < 0) fetch_async(i);
  if (!s.resident) land(i);
  arrived(s);  // (on the device: the host goes on)
}

void ParamOffload::arrived(Slot& s) {
  if (!s.arriving) return;
  copies_->current_waits(*s.arriving);
  s.arriving.reset();
}

void ParamOffload::release(std::size_t i) {
  Slot& s = slots_.at(i);
  if (!s.resident) return;
  // A copy fetched ahead and never waited for (the unit was not gathered after all): the host waits
  // for it here, a rare path, so that no copy from this slot is left behind untracked.
  if (s.arriving) {
    s.arriving->synchronize();
    s.arriving.reset();
  }
  sharding::free_storage(s.flat->shard(), offloaded_message(*s.flat, file_ != nullptr));
  s.resident = false;
}

void ParamOffload::store(std::size_t i, std::int64_t begin, const at::Tensor& values) {
  Slot& s = slots_.at(i);
  if (s.buffer >= 0) land(i);
  const at::Tensor& shard = s.flat->shard();
  const at::Tensor v = values.reshape({-1}).to(at::kCPU, shard.scalar_type()).contiguous();  // (from a device too)
  const std::uint64_t esize = shard.element_size(), first = static_cast<std::uint64_t>(begin) * esize;
  const std::uint64_t bytes = static_cast<std::uint64_t>(v.numel()) * esize;
  if (begin < 0 || begin + v.numel() > shard.numel() || (file_ && first % offload::kAlignment != 0))
    throw accel::LogicError(fmt::format("ParamOffload::store: elements [{}, {}) of {} ({} elements)", begin,
                                        begin + v.numel(), s.flat->name(), shard.numel()));
  if (!file_) {
    char* host = static_cast<char*>(s.host.data_ptr()) + first;
    if (v.data_ptr() != host) {             // (a slot whose pinned copy is its master, given it: already there)
      if (copies_) copies_->synchronize();  // no copy to the device still reads these bytes
      std::memcpy(host, v.data_ptr(), bytes);
    }
    arrived(s);  // (what arrives is overwritten below, after it on the compute stream)
    if (s.resident) shard.narrow(0, begin, v.numel()).copy_(v);
    return;
  }
  offload::AlignedBuffer tmp(offload::align_up(bytes));
  std::memcpy(tmp.data(), v.data_ptr(), bytes);
  file_->write(tmp.data(), offload::align_up(bytes), s.offset + first);
  arrived(s);
  if (s.resident && !(shard.is_cpu() && shard.data_ptr() == v.data_ptr())) shard.narrow(0, begin, v.numel()).copy_(v);
}

}  // namespace accel::zero
