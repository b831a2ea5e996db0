// The safetensors reader/writer (see safetensors.h); the header parser is in safetensors_header.cpp.
#include "checkpoint/safetensors.h"
#include "base/error.h"

#include "base/files.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

namespace accel::checkpoint {

namespace {

struct TorchDtype {
  const char* name;
  c10::ScalarType type;
};
#define ACCEL_TORCH_DTYPE(name, size, torch_type) {#name, c10::torch_type},
const TorchDtype kTorchDtypes[] = {ACCEL_SAFETENSORS_DTYPES(ACCEL_TORCH_DTYPE)};
#undef ACCEL_TORCH_DTYPE

std::string errno_str() { return std::strerror(errno); }

void pwrite_all(int fd, const void* src, std::uint64_t n, std::uint64_t off, const std::string& file) {
  const char* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, std::min<std::uint64_t>(n, 1 << 30), static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw SafetensorsError(fmt::format("safetensors file '{}': write failed: {}", file, errno_str()));
    p += w;
    n -= static_cast<std::uint64_t>(w);
    off += static_cast<std::uint64_t>(w);
  }
}

}  // namespace

c10::ScalarType safetensors_to_scalar_type(const std::string& dtype) {
  for (const auto& d : kTorchDtypes)
    if (dtype == d.name) return d.type;
  throw SafetensorsError(
      fmt::format("safetensors dtype '{}' has no libtorch counterpart (known: {})", dtype, safetensors_dtype_names()));
}

std::string scalar_type_to_safetensors(c10::ScalarType t) {
  for (const auto& d : kTorchDtypes)
    if (t == d.type) return d.name;
  throw accel::InvalidArgumentError(std::string("safetensors: no safetensors dtype for torch dtype ") +
                                    c10::toString(t));
}

// --- reader --------------------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) safetensors_fail(path, "cannot open: " + errno_str());
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) safetensors_fail(path, "cannot stat: " + errno_str());
  if (!S_ISREG(st.st_mode)) safetensors_fail(path, "not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  unsigned char prefix[8] = {};
  if (file_size >= 8) f.pread_all(prefix, 8, 0, "the header length");
  const std::uint64_t n = parse_safetensors_prefix(prefix, file_size, path);
  std::string json(n, '\0');
  f.pread_all(json.data(), n, 8, "the header");
  f.header_ = parse_safetensors_header(json.data(), json.size(), file_size, path);
  f.bytes_read_ = 0;
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), header_(std::move(o.header_)), bytes_read_(o.bytes_read_) {
  o.fd_ = -1;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    header_ = std::move(o.header_);
    bytes_read_ = o.bytes_read_;
    o.fd_ = -1;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& e : header_.tensors) out.push_back(e.name);
  return out;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  if (const auto* e = header_.find(name)) return *e;
  safetensors_fail(path_,
                   fmt::format("no tensor named '{}' (the file holds {} tensors)", name, header_.tensors.size()));
}

c10::ScalarType SafetensorsFile::dtype(const std::string& name) const {
  return safetensors_to_scalar_type(entry(name).dtype);
}

void SafetensorsFile::pread_all(void* dst, std::uint64_t nbytes, std::uint64_t offset, const std::string& what) const {
  char* p = static_cast<char*>(dst);
  while (nbytes > 0) {
    ssize_t r = ::pread(fd_, p, std::min<std::uint64_t>(nbytes, 1 << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) safetensors_fail(path_, fmt::format("reading {} failed: {}", what, errno_str()));
    if (r == 0)
      safetensors_fail(path_,
                       fmt::format("the file ended while reading {} (was it truncated after it was opened?)", what));
    p += r;
    nbytes -= static_cast<std::uint64_t>(r);
    offset += static_cast<std::uint64_t>(r);
    bytes_read_ += static_cast<std::uint64_t>(r);
  }
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(safetensors_to_scalar_type(e.dtype)));
  if (e.end > e.begin)
    pread_all(out.data_ptr(), e.end - e.begin, header_.data_start + e.begin, fmt::format("tensor '{}'", name));
  return out;
}

at::Tensor SafetensorsFile::read_range(const std::string& name, std::int64_t elem_begin, std::int64_t elem_end) const {
  const SafetensorsEntry& e = entry(name);
  if (elem_begin < 0 || elem_end < elem_begin || elem_end > e.numel())
    safetensors_fail_tensor(
        path_, name,
        fmt::format("element range [{}, {}) is outside the tensor's {} elements", elem_begin, elem_end, e.numel()));
  at::Tensor out = at::empty({elem_end - elem_begin}, at::TensorOptions().dtype(safetensors_to_scalar_type(e.dtype)));
  read_range_into(name, elem_begin, elem_end, out);
  return out;
}

void SafetensorsFile::read_range_into(const std::string& name, std::int64_t elem_begin, std::int64_t elem_end,
                                      const at::Tensor& out) const {
  const SafetensorsEntry& e = entry(name);
  if (elem_begin < 0 || elem_end < elem_begin || elem_end > e.numel())
    safetensors_fail_tensor(
        path_, name,
        fmt::format("element range [{}, {}) is outside the tensor's {} elements", elem_begin, elem_end, e.numel()));
  const c10::ScalarType dt = safetensors_to_scalar_type(e.dtype);
  if (!out.defined() || out.device().type() != c10::kCPU || !out.is_contiguous() || out.scalar_type() != dt ||
      out.numel() != elem_end - elem_begin)
    throw accel::InvalidArgumentError(
        fmt::format("SafetensorsFile::read_range_into: '{}' of {} needs a contiguous CPU {} tensor of {} elements",
                    name, path_, c10::toString(dt), elem_end - elem_begin));
  const std::uint64_t esize = safetensors_dtype_size(e.dtype);
  const std::uint64_t nbytes = static_cast<std::uint64_t>(elem_end - elem_begin) * esize;
  if (nbytes > 0)
    pread_all(out.data_ptr(), nbytes, header_.data_start + e.begin + static_cast<std::uint64_t>(elem_begin) * esize,
              fmt::format("tensor '{}'", name));
}

// --- writer --------------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  std::vector<Slot*> order;
  for (auto& t : tensors) {
    if (t.name.empty())
      throw accel::InvalidArgumentError(fmt::format("safetensors writer ({}): a tensor has an empty name", path_));
    if (t.name == "__metadata__")
      throw accel::InvalidArgumentError(
          fmt::format("safetensors writer ({}): '__metadata__' is reserved, not a tensor name", path_));
    for (auto d : t.shape)
      if (d < 0)
        throw accel::InvalidArgumentError(fmt::format("safetensors writer ({}): tensor '{}' has shape {}", path_,
                                                      t.name, c10::str(at::IntArrayRef(t.shape))));
    scalar_type_to_safetensors(t.dtype);  // throws for an unsupported dtype
    std::string name = t.name;
    auto [it, inserted] = slots_.emplace(name, Slot{std::move(t), 0, 0, false});
    if (!inserted)
      throw accel::InvalidArgumentError(
          fmt::format("safetensors writer ({}): tensor '{}' is declared twice", path_, name));
    order.push_back(&it->second);
  }
  // As the Python writer: larger elements first (keeps every tensor aligned), then by name.
  std::stable_sort(order.begin(), order.end(), [](const Slot* a, const Slot* b) {
    const auto sa = c10::elementSize(a->spec.dtype), sb = c10::elementSize(b->spec.dtype);
    return sa != sb ? sa > sb : a->spec.name < b->spec.name;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t pos = 0;
  for (Slot* s : order) {
    std::uint64_t n = c10::elementSize(s->spec.dtype);
    for (auto d : s->spec.shape) n *= static_cast<std::uint64_t>(d);
    s->begin = pos;
    s->end = pos + n;
    pos += n;
    header[s->spec.name] = {{"dtype", scalar_type_to_safetensors(s->spec.dtype)},
                            {"shape", s->spec.shape},
                            {"data_offsets", {s->begin, s->end}}};
  }
  data_size_ = pos;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  data_start_ = 8 + text.size();

  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) safetensors_fail(tmp_, "cannot create: " + errno_str());
  try {
    unsigned char prefix[8];
    std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(n >> (8 * i));
    pwrite_all(fd_, prefix, 8, 0, tmp_);
    pwrite_all(fd_, text.data(), text.size(), 8, tmp_);
    if (::ftruncate(fd_, static_cast<off_t>(data_start_ + data_size_)) != 0)
      safetensors_fail(tmp_, "cannot size: " + errno_str());
  } catch (...) {
    abandon();
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!finished_) abandon();
}

void SafetensorsWriter::abandon() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
  }
}

std::pair<std::uint64_t, std::uint64_t> SafetensorsWriter::offsets(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end())
    throw accel::InvalidArgumentError(fmt::format("safetensors writer ({}): no tensor '{}'", path_, name));
  return {it->second.begin, it->second.end};
}

void SafetensorsWriter::write(const std::string& name, const at::Tensor& t) {
  if (finished_ || fd_ < 0)
    throw accel::LogicError(fmt::format("safetensors writer ({}): already finished or failed", path_));
  auto it = slots_.find(name);
  if (it == slots_.end())
    throw accel::InvalidArgumentError(
        fmt::format("safetensors writer ({}): tensor '{}' was not declared", path_, name));
  Slot& s = it->second;
  if (s.written)
    throw accel::InvalidArgumentError(fmt::format("safetensors writer ({}): tensor '{}' written twice", path_, name));
  if (!t.defined() || t.scalar_type() != s.spec.dtype || t.sizes().vec() != s.spec.shape)
    throw accel::InvalidArgumentError(
        fmt::format("safetensors writer ({}): tensor '{}' was declared {}{}, got {}", path_, name,
                    c10::toString(s.spec.dtype), c10::str(at::IntArrayRef(s.spec.shape)),
                    t.defined() ? fmt::format("{}{}", c10::toString(t.scalar_type()), c10::str(t.sizes()))
                                : std::string("an undefined tensor")));
  if (s.end > s.begin) {
    at::Tensor c = t.detach().to(c10::kCPU).contiguous();
    try {
      pwrite_all(fd_, c.data_ptr(), s.end - s.begin, data_start_ + s.begin, tmp_);
    } catch (...) {
      abandon();
      throw;
    }
  }
  s.written = true;
}

void SafetensorsWriter::finish() {
  if (finished_) return;
  if (fd_ < 0) throw accel::LogicError(fmt::format("safetensors writer ({}): a previous write failed", path_));
  for (const auto& [name, s] : slots_)
    if (!s.written)
      throw accel::LogicError(
          fmt::format("safetensors writer ({}): tensor '{}' was declared but never written", path_, name));
  if (::fsync(fd_) != 0) {
    std::string e = errno_str();
    abandon();
    safetensors_fail(tmp_, "fsync failed: " + e);
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::string e = errno_str();
    ::unlink(tmp_.c_str());
    safetensors_fail(path_, fmt::format("cannot rename {} into place: {}", tmp_, e));
  }
  finished_ = true;
  files::sync_dir(files::parent_dir(path_));
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      throw accel::InvalidArgumentError(fmt::format("write_safetensors({}): tensor '{}' is undefined", path, name));
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsWriter w(path, std::move(specs), metadata);
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
}

}  // namespace accel::checkpoint
