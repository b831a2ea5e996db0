#include "zero/optimizer_offload.h"
#include "base/error.h"

#include "offload/async_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace accel::zero {
namespace {

constexpr std::int64_t kChunkQuantum = 4096;  // elements: chunk boundaries stay 4 KiB-aligned at any dtype >= 1 byte

std::int64_t chunk_elements(const OffloadSpec& spec) {
  return std::max<std::int64_t>(kChunkQuantum,
                                (spec.sub_group_size + kChunkQuantum - 1) / kChunkQuantum * kChunkQuantum);
}

}  // namespace

void OptimizerOffload::mark_torn(const std::string& why) {
  torn_ = why.empty() ? std::string("an error without a message") : why;
  rewritten_.assign(regions_.size(), {});
  for (std::size_t i = 0; i < regions_.size(); ++i)
    rewritten_[i].assign(static_cast<std::size_t>(1 + regions_[i].rule.state_count()), region_chunks_[i].empty());
}

int OffloadRule::state_count() const {
  if (kind == Kind::Adam) return adam.amsgrad ? 3 : 2;
  return sgd.momentum != 0 ? 1 : 0;
}

const char* OffloadRule::state_name(int slot) const {
  static const char* adam_names[] = {"master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  static const char* sgd_names[] = {"master", "momentum_buffer"};
  return kind == Kind::Adam ? adam_names[slot] : sgd_names[slot];
}

std::uint64_t OptimizerOffload::file_bytes(const OffloadSpec& spec, const std::vector<Region>& regions) {
  const std::int64_t c = chunk_elements(spec);
  std::uint64_t total = 0;
  for (const auto& r : regions)
    for (std::int64_t b = 0; b < r.numel; b += c) {
      const std::int64_t len = std::min(c, r.numel - b);
      total += static_cast<std::uint64_t>(1 + r.rule.state_count()) * offload::align_up(len * 4);
    }
  return total;
}

OptimizerOffload::OptimizerOffload(const OffloadSpec& spec, int rank, std::vector<Region> regions)
    : spec_(spec), regions_(std::move(regions)) {
  const std::int64_t c = chunk_elements(spec_);
  region_chunks_.resize(regions_.size());
  std::uint64_t offset = 0, largest = 0;
  for (std::size_t i = 0; i < regions_.size(); ++i)
    for (std::int64_t b = 0; b < regions_[i].numel; b += c) {
      Chunk ch{i, b, std::min(c, regions_[i].numel - b), offset, 0};
      ch.slot_bytes = offload::align_up(ch.len * 4);
      region_chunks_[i].push_back(chunks_.size());
      chunks_.push_back(ch);
      offset += record_bytes(ch);
      largest = std::max(largest, record_bytes(ch));
    }
  bytes_ = offset;
  steps_.assign(regions_.size(), 0);
  scratch_ = std::make_unique<offload::ScratchFile>(
      spec_.optimizer_nvme_path, fmt::format("accel-optimizer-rank{}-pid{}.swp", rank, static_cast<long>(getpid())),
      bytes_, spec_.aio, "offload_optimizer.nvme_path");
  file_ = &scratch_->file();
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(spec_.optimizer_buffer_count), chunks_.size());
  for (std::size_t i = 0; i < n; ++i) buffers_.emplace_back(largest);
}

OptimizerOffload::~OptimizerOffload() = default;

std::uint64_t OptimizerOffload::record_bytes(const Chunk& c) const {
  return static_cast<std::uint64_t>(1 + regions_[c.region].rule.state_count()) * c.slot_bytes;
}

const std::string& OptimizerOffload::path() const { return file_->path(); }
std::uint64_t OptimizerOffload::bytes_read() const { return file_->bytes_read(); }
std::uint64_t OptimizerOffload::bytes_written() const { return file_->bytes_written(); }

void OptimizerOffload::init(std::size_t i, const at::Tensor& values) {
  const at::Tensor v = values.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();  // (from a device too)
  if (v.numel() != regions_.at(i).numel)
    throw accel::InvalidArgumentError(
        fmt::format("OptimizerOffload::init: region {} has {} elements, got {}", i, regions_[i].numel, v.numel()));
  offload::AlignedBuffer& buf = buffers_.at(0);
  for (std::size_t ci : region_chunks_[i]) {
    const Chunk& c = chunks_[ci];
    std::memset(buf.data(), 0, record_bytes(c));
    std::memcpy(buf.data(), v.data_ptr<float>() + c.begin, c.len * 4);
    file_->write(buf.data(), record_bytes(c), c.offset);
  }
  steps_[i] = 0;
}

void OptimizerOffload::check_whole(const char* what) const {
  if (torn_.empty()) return;
  throw accel::RuntimeError(fmt::format(
      "offloaded optimizer: cannot {}: the state in {} is partly updated by a step that failed partway ({}); load a "
      "checkpoint (load_state) before training or saving again",
      what, path(), torn_));
}

at::Tensor OptimizerOffload::read(std::size_t i, int slot) const {
  check_whole("read the optimizer state");
  at::Tensor out = at::empty({regions_.at(i).numel}, at::kFloat);
  if (region_chunks_[i].empty()) return out;
  offload::AlignedBuffer tmp(chunks_[region_chunks_[i][0]].slot_bytes);
  for (std::size_t ci : region_chunks_[i]) {
    const Chunk& c = chunks_[ci];
    file_->read(tmp.data(), c.slot_bytes, c.offset + slot * c.slot_bytes);
    std::memcpy(out.data_ptr<float>() + c.begin, tmp.data(), c.len * 4);
  }
  return out;
}

void OptimizerOffload::write(std::size_t i, int slot, const at::Tensor& values) {
  const at::Tensor v = values.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
  if (v.numel() != regions_.at(i).numel)
    throw accel::InvalidArgumentError(
        fmt::format("OptimizerOffload::write: region {} has {} elements, got {}", i, regions_[i].numel, v.numel()));
  if (region_chunks_[i].empty()) return;
  offload::AlignedBuffer tmp(chunks_[region_chunks_[i][0]].slot_bytes);
  for (std::size_t ci : region_chunks_[i]) {
    const Chunk& c = chunks_[ci];
    std::memset(tmp.data(), 0, c.slot_bytes);
    std::memcpy(tmp.data(), v.data_ptr<float>() + c.begin, c.len * 4);
    file_->write(tmp.data(), c.slot_bytes, c.offset + slot * c.slot_bytes);
  }
  if (torn_.empty()) return;
  rewritten_.at(i).at(static_cast<std::size_t>(slot)) = 1;
  for (const auto& r : rewritten_)
    for (char done : r)
      if (!done) return;
  torn_.clear();  // every region's master and state came from one consistent source again
}

void OptimizerOffload::step(const std::vector<at::Tensor>& grads, const std::vector<OffloadRule>& rules,
                            const Updated& updated) {
  check_whole("step");
  std::vector<std::size_t> todo;
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci)
    if (grads.at(chunks_[ci].region).defined()) todo.push_back(ci);
  for (std::size_t r = 0; r < regions_.size(); ++r) {
    if (!grads[r].defined()) continue;
    if (grads[r].scalar_type() != at::kFloat || !grads[r].is_contiguous() || grads[r].numel() != regions_[r].numel)
      throw accel::LogicError(fmt::format(
          "OptimizerOffload::step: region {} needs a contiguous fp32 gradient of {} elements", r, regions_[r].numel));
    if (rules.at(r).kind != regions_[r].rule.kind || rules[r].state_count() != regions_[r].rule.state_count())
      throw accel::InvalidArgumentError(fmt::format(
          "offloaded optimizer: a param group's options changed what state it keeps ({} tensors, now {}): amsgrad "
          "and momentum must stay as they were when the optimizer was prepared",
          regions_[r].rule.state_count(), rules[r].state_count()));
  }
  const std::size_t nbuf = buffers_.size(), n = todo.size();
  const std::size_t ahead = std::max<std::size_t>(1, nbuf >= 3 ? nbuf - 2 : 1);
  std::vector<offload::AsyncFile::Ticket> rt(nbuf, 0), wt(nbuf, 0);
  std::vector<char> writing(nbuf, 0);
  auto issue_read = [&](std::size_t j) {
    const std::size_t b = j % nbuf;
    if (writing[b]) file_->wait(wt[b]), writing[b] = 0;
    const Chunk& c = chunks_[todo[j]];
    rt[b] = file_->read_async(buffers_[b].data(), record_bytes(c), c.offset);
  };
  try {
    for (std::size_t j = 0; j < std::min(ahead, n); ++j) issue_read(j);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = i % nbuf;
      file_->wait(rt[b]);
      if (i + ahead < n) issue_read(i + ahead);
      const Chunk& c = chunks_[todo[i]];
      const OffloadRule& rule = rules[c.region];
      const std::int64_t slot = static_cast<std::int64_t>(c.slot_bytes / 4);
      float* master = static_cast<float*>(buffers_[b].data());
      const float* grad = grads[c.region].data_ptr<float>() + c.begin;
      if (rule.kind == OffloadRule::Kind::Adam) {
        optim::adam_step(master, grad, master + slot, master + 2 * slot,
                         rule.adam.amsgrad ? master + 3 * slot : nullptr, c.len, steps_[c.region] + 1, rule.adam);
      } else {
        optim::sgd_step(master, grad, rule.sgd.momentum != 0 ? master + slot : nullptr, c.len, steps_[c.region] == 0,
                        rule.sgd);
      }
      updated(c.region, c.begin, at::from_blob(master, {c.len}, at::kFloat));
      wt[b] = file_->write_async(buffers_[b].data(), record_bytes(c), c.offset);
      writing[b] = 1;
    }
    file_->wait_all();
  } catch (const std::exception& e) {
    try {
      file_->wait_all();
    } catch (...) {
    }
    mark_torn(e.what());
    throw;
  } catch (...) {
    try {
      file_->wait_all();
    } catch (...) {
    }
    mark_torn("an unknown error");
    throw;
  }
  for (std::size_t r = 0; r < regions_.size(); ++r)
    if (grads[r].defined()) ++steps_[r];
}

}  // namespace accel::zero
