// The safetensors reader/writer (see safetensors.h). The header parser at the top uses no torch: the
// fuzz harness compiles this file alone with -DACCEL_SAFETENSORS_PARSER_ONLY.
#include "checkpoint/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#ifndef ACCEL_SAFETENSORS_PARSER_ONLY
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

namespace accel::checkpoint {

namespace {

struct DtypeInfo {
  const char* name;
  std::size_t size;
};
// Sub-byte dtypes (F4, F6_*) are not supported: libtorch has no tensor type for them.
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1},        {"U8", 1},  {"I8", 1},           {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E4M3FNUZ", 1},
    {"F8_E5M2FNUZ", 1}, {"F8_E8M0", 1}, {"I16", 2},      {"U16", 2},     {"F16", 2},     {"BF16", 2},
    {"I32", 4},         {"U32", 4}, {"F32", 4},          {"I64", 8},     {"U64", 8},     {"F64", 8},
    {"C64", 8},
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw SafetensorsError("safetensors file '" + file + "': " + what);
}
[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor, const std::string& what) {
  fail(file, "tensor '" + tensor + "': " + what);
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A short, printable excerpt of a JSON value for messages.
std::string excerpt(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

const char* type_name(const nlohmann::json& j) { return j.type_name(); }

}  // namespace

std::size_t safetensors_dtype_size(const std::string& dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return d.size;
  return 0;
}

std::string safetensors_dtype_names() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

std::int64_t SafetensorsEntry::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

std::uint64_t parse_safetensors_prefix(const unsigned char* first8, std::uint64_t file_size, const std::string& file) {
  if (file_size < 8)
    fail(file, "the file is " + std::to_string(file_size) +
                   " bytes, shorter than the 8-byte header length that starts every safetensors file (truncated?)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  if (n > kSafetensorsMaxHeader)
    fail(file, "header length " + std::to_string(n) + " bytes exceeds the limit of " +
                   std::to_string(kSafetensorsMaxHeader) + " bytes (not a safetensors file, or corrupted)");
  if (n > file_size - 8)
    fail(file, "header length " + std::to_string(n) + " bytes runs past the end of the file (" +
                   std::to_string(file_size) + " bytes; truncated?)");
  if (n < 2) fail(file, "header length " + std::to_string(n) + " bytes is too short for a JSON object");
  return n;
}

SafetensorsHeader parse_safetensors_header(const char* text, std::size_t size, std::uint64_t file_size,
                                           const std::string& file) {
  using nlohmann::json;
  SafetensorsHeader h;
  h.header_size = size;
  if (size > kSafetensorsMaxHeader || file_size < 8 || size > file_size - 8)
    fail(file, "header length " + std::to_string(size) + " does not fit in a file of " + std::to_string(file_size) +
                   " bytes");
  h.data_start = 8 + size;
  h.data_size = file_size - h.data_start;
  if (size == 0 || text[0] != '{')
    fail(file, "the header does not start with '{' (not a safetensors file, or corrupted)");

  // Parse, rejecting duplicate keys (nlohmann would keep the last one silently) and deep nesting.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool too_deep = false;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > 4) too_deep = true;
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    else if (ev == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.empty() && duplicate.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second) duplicate = k;
    }
    return !too_deep;  // discard what is too deep (the error is reported below)
  };
  json root;
  try {
    root = json::parse(text, text + size, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail(file, std::string("the header is not valid JSON: ") + e.what());
  }
  if (too_deep) fail(file, "the header nests deeper than a safetensors header can");
  if (!duplicate.empty())
    fail(file, "the header has the key '" + duplicate + "' twice (a duplicate tensor name or field)");
  if (!root.is_object()) fail(file, std::string("the header is a JSON ") + type_name(root) + ", not an object");

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        fail(file, std::string("__metadata__ must be an object of strings, got a ") + type_name(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(file, "__metadata__ entry '" + m.key() + "' must be a string, got a " + type_name(m.value()) + " (" +
                         excerpt(m.value()) + ")");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object())
      fail_tensor(file, name, std::string("expected an object with dtype, shape and data_offsets, got a ") +
                                  type_name(v) + " (" + excerpt(v) + ")");
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        fail_tensor(file, name, "unknown field '" + f.key() + "' (expected dtype, shape, data_offsets)");
    SafetensorsEntry e;
    e.name = name;
    auto d = v.find("dtype");
    if (d == v.end()) fail_tensor(file, name, "no dtype");
    if (!d->is_string()) fail_tensor(file, name, std::string("dtype must be a string, got a ") + type_name(*d));
    e.dtype = d->get<std::string>();
    const std::size_t esize = safetensors_dtype_size(e.dtype);
    if (esize == 0)
      fail_tensor(file, name, "unknown or unsupported dtype '" + e.dtype + "' (known: " + safetensors_dtype_names() + ")");
    auto s = v.find("shape");
    if (s == v.end()) fail_tensor(file, name, "no shape");
    if (!s->is_array()) fail_tensor(file, name, std::string("shape must be an array, got a ") + type_name(*s));
    std::uint64_t nbytes = esize;
    bool overflow = false;
    for (const auto& dim : *s) {
      if (!dim.is_number_unsigned() ||
          dim.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail_tensor(file, name, "shape " + excerpt(*s) + " has an entry that is not a non-negative integer (" +
                                    excerpt(dim) + ")");
      const auto n = dim.get<std::uint64_t>();
      e.shape.push_back(static_cast<std::int64_t>(n));
      overflow = overflow || __builtin_mul_overflow(nbytes, n, &nbytes);
    }
    auto o = v.find("data_offsets");
    if (o == v.end()) fail_tensor(file, name, "no data_offsets");
    if (!o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() || !(*o)[1].is_number_unsigned())
      fail_tensor(file, name, "data_offsets must be [begin, end], two non-negative integers, got " + excerpt(*o));
    e.begin = (*o)[0].get<std::uint64_t>();
    e.end = (*o)[1].get<std::uint64_t>();
    if (e.end < e.begin)
      fail_tensor(file, name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                  "] end before they begin");
    if (e.end > h.data_size)
      fail_tensor(file, name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                  "] run past the end of the data (" + std::to_string(h.data_size) +
                                  " bytes after the header; truncated?)");
    std::int64_t numel = 1;
    for (auto dim : e.shape) overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
    if (overflow || nbytes != e.end - e.begin)
      fail_tensor(file, name, "shape " + shape_str(e.shape) + " of " + e.dtype + " needs " +
                                  (overflow ? std::string("more bytes than fit in 64 bits")
                                            : std::to_string(nbytes) + " bytes") +
                                  ", but data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                  "] hold " + std::to_string(e.end - e.begin));
    h.tensors.push_back(std::move(e));
  }
  // nlohmann's object is a std::map: the tensors come sorted by name already.

  // The data must be covered exactly: sorted by offsets, each tensor starts where the previous ended
  // and the last ends at the end of the file.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : h.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t pos = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto* e : by_offset) {
    if (e->begin < pos)
      fail_tensor(file, e->name, "data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                                     "] overlap tensor '" + prev->name + "' [" + std::to_string(prev->begin) + ", " +
                                     std::to_string(prev->end) + "]");
    if (e->begin > pos)
      fail_tensor(file, e->name, "data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                                     "] leave a hole: bytes [" + std::to_string(pos) + ", " + std::to_string(e->begin) +
                                     ") of the data belong to no tensor");
    pos = e->end;
    prev = e;
  }
  if (pos != h.data_size)
    fail(file, "the tensors cover " + std::to_string(pos) + " bytes of data but the file holds " +
                   std::to_string(h.data_size) + " after the header (trailing bytes, or a header that lies)");
  return h;
}

SafetensorsHeader parse_safetensors_bytes(const char* bytes, std::size_t size, std::uint64_t file_size,
                                          const std::string& file) {
  if (size < 8 || file_size < size) fail(file, "the file is " + std::to_string(size) + " bytes, shorter than 8");
  const std::uint64_t n = parse_safetensors_prefix(reinterpret_cast<const unsigned char*>(bytes), file_size, file);
  if (n > size - 8) fail(file, "the header runs past the bytes given");
  return parse_safetensors_header(bytes + 8, n, file_size, file);
}

#ifndef ACCEL_SAFETENSORS_PARSER_ONLY

namespace {

struct TorchDtype {
  const char* name;
  c10::ScalarType type;
};
const TorchDtype kTorchDtypes[] = {
    {"BOOL", c10::kBool},
    {"U8", c10::kByte},
    {"I8", c10::kChar},
    {"F8_E4M3", c10::kFloat8_e4m3fn},
    {"F8_E5M2", c10::kFloat8_e5m2},
    {"F8_E4M3FNUZ", c10::kFloat8_e4m3fnuz},
    {"F8_E5M2FNUZ", c10::kFloat8_e5m2fnuz},
    {"F8_E8M0", c10::kFloat8_e8m0fnu},
    {"I16", c10::kShort},
    {"U16", c10::kUInt16},
    {"F16", c10::kHalf},
    {"BF16", c10::kBFloat16},
    {"I32", c10::kInt},
    {"U32", c10::kUInt32},
    {"F32", c10::kFloat},
    {"I64", c10::kLong},
    {"U64", c10::kUInt64},
    {"F64", c10::kDouble},
    {"C64", c10::kComplexFloat},
};

std::string errno_str() { return std::strerror(errno); }

void pwrite_all(int fd, const void* src, std::uint64_t n, std::uint64_t off, const std::string& file) {
  const char* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, std::min<std::uint64_t>(n, 1 << 30), static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw SafetensorsError("safetensors file '" + file + "': write failed: " + errno_str());
    p += w;
    n -= static_cast<std::uint64_t>(w);
    off += static_cast<std::uint64_t>(w);
  }
}

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

c10::ScalarType safetensors_to_scalar_type(const std::string& dtype) {
  for (const auto& d : kTorchDtypes)
    if (dtype == d.name) return d.type;
  throw SafetensorsError("safetensors dtype '" + dtype + "' has no libtorch counterpart (known: " +
                         safetensors_dtype_names() + ")");
}

std::string scalar_type_to_safetensors(c10::ScalarType t) {
  for (const auto& d : kTorchDtypes)
    if (t == d.type) return d.name;
  throw std::invalid_argument(std::string("safetensors: no safetensors dtype for torch dtype ") + c10::toString(t));
}

// --- reader --------------------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) fail(path, "cannot open: " + errno_str());
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) fail(path, "cannot stat: " + errno_str());
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
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
  fail(path_, "no tensor named '" + name + "' (the file holds " + std::to_string(header_.tensors.size()) + " tensors)");
}

c10::ScalarType SafetensorsFile::dtype(const std::string& name) const {
  return safetensors_to_scalar_type(entry(name).dtype);
}

void SafetensorsFile::pread_all(void* dst, std::uint64_t nbytes, std::uint64_t offset, const std::string& what) const {
  char* p = static_cast<char*>(dst);
  while (nbytes > 0) {
    ssize_t r = ::pread(fd_, p, std::min<std::uint64_t>(nbytes, 1 << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(path_, "reading " + what + " failed: " + errno_str());
    if (r == 0) fail(path_, "the file ended while reading " + what + " (was it truncated after it was opened?)");
    p += r;
    nbytes -= static_cast<std::uint64_t>(r);
    offset += static_cast<std::uint64_t>(r);
    bytes_read_ += static_cast<std::uint64_t>(r);
  }
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(safetensors_to_scalar_type(e.dtype)));
  if (e.end > e.begin) pread_all(out.data_ptr(), e.end - e.begin, header_.data_start + e.begin, "tensor '" + name + "'");
  return out;
}

at::Tensor SafetensorsFile::read_range(const std::string& name, std::int64_t elem_begin, std::int64_t elem_end) const {
  const SafetensorsEntry& e = entry(name);
  if (elem_begin < 0 || elem_end < elem_begin || elem_end > e.numel())
    fail_tensor(path_, name, "element range [" + std::to_string(elem_begin) + ", " + std::to_string(elem_end) +
                                 ") is outside the tensor's " + std::to_string(e.numel()) + " elements");
  at::Tensor out = at::empty({elem_end - elem_begin}, at::TensorOptions().dtype(safetensors_to_scalar_type(e.dtype)));
  read_range_into(name, elem_begin, elem_end, out);
  return out;
}

void SafetensorsFile::read_range_into(const std::string& name, std::int64_t elem_begin, std::int64_t elem_end,
                                      const at::Tensor& out) const {
  const SafetensorsEntry& e = entry(name);
  if (elem_begin < 0 || elem_end < elem_begin || elem_end > e.numel())
    fail_tensor(path_, name, "element range [" + std::to_string(elem_begin) + ", " + std::to_string(elem_end) +
                                 ") is outside the tensor's " + std::to_string(e.numel()) + " elements");
  const c10::ScalarType dt = safetensors_to_scalar_type(e.dtype);
  if (!out.defined() || out.device().type() != c10::kCPU || !out.is_contiguous() || out.scalar_type() != dt ||
      out.numel() != elem_end - elem_begin)
    throw std::invalid_argument("SafetensorsFile::read_range_into: '" + name + "' of " + path_ +
                                " needs a contiguous CPU " + c10::toString(dt) + " tensor of " +
                                std::to_string(elem_end - elem_begin) + " elements");
  const std::uint64_t esize = safetensors_dtype_size(e.dtype);
  const std::uint64_t nbytes = static_cast<std::uint64_t>(elem_end - elem_begin) * esize;
  if (nbytes > 0)
    pread_all(out.data_ptr(), nbytes, header_.data_start + e.begin + static_cast<std::uint64_t>(elem_begin) * esize,
              "tensor '" + name + "'");
}

// --- writer --------------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  std::vector<Slot*> order;
  for (auto& t : tensors) {
    if (t.name.empty()) throw std::invalid_argument("safetensors writer (" + path_ + "): a tensor has an empty name");
    if (t.name == "__metadata__")
      throw std::invalid_argument("safetensors writer (" + path_ + "): '__metadata__' is reserved, not a tensor name");
    for (auto d : t.shape)
      if (d < 0)
        throw std::invalid_argument("safetensors writer (" + path_ + "): tensor '" + t.name + "' has shape " +
                                    shape_str(t.shape));
    scalar_type_to_safetensors(t.dtype);  // throws for an unsupported dtype
    std::string name = t.name;
    auto [it, inserted] = slots_.emplace(name, Slot{std::move(t), 0, 0, false});
    if (!inserted)
      throw std::invalid_argument("safetensors writer (" + path_ + "): tensor '" + name + "' is declared twice");
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
  if (fd_ < 0) fail(tmp_, "cannot create: " + errno_str());
  try {
    unsigned char prefix[8];
    std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(n >> (8 * i));
    pwrite_all(fd_, prefix, 8, 0, tmp_);
    pwrite_all(fd_, text.data(), text.size(), 8, tmp_);
    if (::ftruncate(fd_, static_cast<off_t>(data_start_ + data_size_)) != 0) fail(tmp_, "cannot size: " + errno_str());
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
  if (it == slots_.end()) throw std::invalid_argument("safetensors writer (" + path_ + "): no tensor '" + name + "'");
  return {it->second.begin, it->second.end};
}

void SafetensorsWriter::write(const std::string& name, const at::Tensor& t) {
  if (finished_ || fd_ < 0) throw std::logic_error("safetensors writer (" + path_ + "): already finished or failed");
  auto it = slots_.find(name);
  if (it == slots_.end())
    throw std::invalid_argument("safetensors writer (" + path_ + "): tensor '" + name + "' was not declared");
  Slot& s = it->second;
  if (s.written) throw std::invalid_argument("safetensors writer (" + path_ + "): tensor '" + name + "' written twice");
  if (!t.defined() || t.scalar_type() != s.spec.dtype || t.sizes().vec() != s.spec.shape)
    throw std::invalid_argument("safetensors writer (" + path_ + "): tensor '" + name + "' was declared " +
                                c10::toString(s.spec.dtype) + shape_str(s.spec.shape) + ", got " +
                                (t.defined() ? std::string(c10::toString(t.scalar_type())) + shape_str(t.sizes().vec())
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
  if (fd_ < 0) throw std::logic_error("safetensors writer (" + path_ + "): a previous write failed");
  for (const auto& [name, s] : slots_)
    if (!s.written)
      throw std::logic_error("safetensors writer (" + path_ + "): tensor '" + name + "' was declared but never written");
  if (::fsync(fd_) != 0) {
    std::string e = errno_str();
    abandon();
    fail(tmp_, "fsync failed: " + e);
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::string e = errno_str();
    ::unlink(tmp_.c_str());
    fail(path_, "cannot rename " + tmp_ + " into place: " + e);
  }
  finished_ = true;
  int dfd = ::open(dir_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw std::invalid_argument("write_safetensors(" + path + "): tensor '" + name + "' is undefined");
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsWriter w(path, std::move(specs), metadata);
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
}

#endif  // ACCEL_SAFETENSORS_PARSER_ONLY

}  // namespace accel::checkpoint
