// Accelerator::gather_object / broadcast_object / gather_for_metrics of strings (accelerator.h): byte
// strings across ranks, for what is not a tensor (generated text, JSON records, a rank's report).
#include "accelerator/accelerator.h"

#include "base/error.h"
#include "comm/broadcast_text.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>

namespace accel {
namespace {

// A list of strings as bytes: its count, each length (int64), then the strings one after another.
std::string encode(const std::vector<std::string>& items) {
  std::vector<std::int64_t> head{static_cast<std::int64_t>(items.size())};
  std::size_t total = 0;
  for (const auto& s : items) {
    head.push_back(static_cast<std::int64_t>(s.size()));
    total += s.size();
  }
  std::string out(head.size() * sizeof(std::int64_t), '\0');
  std::memcpy(out.data(), head.data(), out.size());
  out.reserve(out.size() + total);
  for (const auto& s : items) out += s;
  return out;
}

void decode(const char* p, std::size_t n, std::vector<std::string>& out) {
  auto word = [&](std::size_t k) {
    std::int64_t v = 0;
    std::memcpy(&v, p + k * sizeof v, sizeof v);
    return v;
  };
  const auto count = static_cast<std::size_t>(word(0));
  std::size_t at = (count + 1) * sizeof(std::int64_t);
  for (std::size_t i = 0; i < count; ++i) {
    const auto len = static_cast<std::size_t>(word(i + 1));
    if (at + len > n) throw accel::RuntimeError("gather_object: a rank's list arrived cut short");
    out.emplace_back(p + at, len);
    at += len;
  }
}

}  // namespace

std::vector<std::string> Accelerator::gather_object(const std::vector<std::string>& items) {
  if (num_processes() == 1) return items;
  const std::string mine = encode(items);
  at::Tensor len = at::full({1}, static_cast<std::int64_t>(mine.size()), at::kLong);
  at::Tensor lens = at::empty({num_processes()}, at::kLong);
  world_->all_gather(len, lens);
  const std::int64_t longest = lens.max().item<std::int64_t>();
  at::Tensor buf = at::zeros({longest}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({longest * num_processes()}, at::kByte);
  world_->all_gather(buf, all);
  std::vector<std::string> out;
  const char* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < num_processes(); ++r)
    decode(base + r * longest, static_cast<std::size_t>(lens[r].item<std::int64_t>()), out);
  return out;
}

std::vector<std::string> Accelerator::gather_for_metrics(const std::vector<std::string>& items) {
  std::vector<std::string> all = gather_object(items);
  const std::int64_t r = state_->remainder();  // the active loader's batch holds padding
  if (r >= 0 && r < static_cast<std::int64_t>(all.size())) all.resize(static_cast<std::size_t>(r));
  return all;
}

std::string Accelerator::broadcast_object(const std::string& object, int from) {
  if (from < 0 || from >= num_processes())
    throw accel::InvalidArgumentError(
        fmt::format("broadcast_object: from rank {} of {} processes", from, num_processes()));
  if (num_processes() == 1) return object;
  return comm::broadcast_text(*world_, object, from);
}

}  // namespace accel
