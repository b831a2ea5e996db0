// The safetensors header parser (see safetensors_header.h). No torch.
#include "checkpoint/safetensors_header.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <set>

namespace accel::checkpoint {

namespace {

struct DtypeInfo {
  const char* name;
  std::size_t size;
};
#define ACCEL_DTYPE_INFO(name, size, torch_type) {#name, size},
constexpr DtypeInfo kDtypes[] = {ACCEL_SAFETENSORS_DTYPES(ACCEL_DTYPE_INFO)};
#undef ACCEL_DTYPE_INFO

std::string header_shape(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
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

void safetensors_fail(const std::string& file, const std::string& what) {
  throw SafetensorsError(fmt::format("safetensors file '{}': {}", file, what));
}

void safetensors_fail_tensor(const std::string& file, const std::string& tensor, const std::string& what) {
  safetensors_fail(file, fmt::format("tensor '{}': {}", tensor, what));
}

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
    safetensors_fail(file, fmt::format("the file is {} bytes, shorter than the 8-byte header length that starts every "
                                       "safetensors file (truncated?)",
                                       file_size));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  if (n > kSafetensorsMaxHeader)
    safetensors_fail(file, fmt::format("header length {} bytes exceeds the limit of {} bytes (not a safetensors file, "
                                       "or corrupted)",
                                       n, kSafetensorsMaxHeader));
  if (n > file_size - 8)
    safetensors_fail(
        file, fmt::format("header length {} bytes runs past the end of the file ({} bytes; truncated?)", n, file_size));
  if (n < 2) safetensors_fail(file, fmt::format("header length {} bytes is too short for a JSON object", n));
  return n;
}

SafetensorsHeader parse_safetensors_header(const char* text, std::size_t size, std::uint64_t file_size,
                                           const std::string& file) {
  using nlohmann::json;
  SafetensorsHeader h;
  h.header_size = size;
  if (size > kSafetensorsMaxHeader || file_size < 8 || size > file_size - 8)
    safetensors_fail(file, fmt::format("header length {} does not fit in a file of {} bytes", size, file_size));
  h.data_start = 8 + size;
  h.data_size = file_size - h.data_start;
  if (size == 0 || text[0] != '{')
    safetensors_fail(file, "the header does not start with '{' (not a safetensors file, or corrupted)");

  // Parse, rejecting duplicate keys (nlohmann would keep the last one silently) and deep nesting.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool too_deep = false;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > 4) too_deep = true;
    if (ev == json::parse_event_t::object_start)
      keys.emplace_back();
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
    safetensors_fail(file, std::string("the header is not valid JSON: ") + e.what());
  }
  if (too_deep) safetensors_fail(file, "the header nests deeper than a safetensors header can");
  if (!duplicate.empty())
    safetensors_fail(file,
                     fmt::format("the header has the key '{}' twice (a duplicate tensor name or field)", duplicate));
  if (!root.is_object()) safetensors_fail(file, fmt::format("the header is a JSON {}, not an object", type_name(root)));

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        safetensors_fail(file, std::string("__metadata__ must be an object of strings, got a ") + type_name(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          safetensors_fail(file, fmt::format("__metadata__ entry '{}' must be a string, got a {} ({})", m.key(),
                                             type_name(m.value()), excerpt(m.value())));
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object())
      safetensors_fail_tensor(file, name,
                              fmt::format("expected an object with dtype, shape and data_offsets, got a {} ({})",
                                          type_name(v), excerpt(v)));
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        safetensors_fail_tensor(file, name,
                                fmt::format("unknown field '{}' (expected dtype, shape, data_offsets)", f.key()));
    SafetensorsEntry e;
    e.name = name;
    auto d = v.find("dtype");
    if (d == v.end()) safetensors_fail_tensor(file, name, "no dtype");
    if (!d->is_string())
      safetensors_fail_tensor(file, name, std::string("dtype must be a string, got a ") + type_name(*d));
    e.dtype = d->get<std::string>();
    const std::size_t esize = safetensors_dtype_size(e.dtype);
    if (esize == 0)
      safetensors_fail_tensor(
          file, name, fmt::format("unknown or unsupported dtype '{}' (known: {})", e.dtype, safetensors_dtype_names()));
    auto s = v.find("shape");
    if (s == v.end()) safetensors_fail_tensor(file, name, "no shape");
    if (!s->is_array())
      safetensors_fail_tensor(file, name, std::string("shape must be an array, got a ") + type_name(*s));
    std::uint64_t nbytes = esize;
    bool overflow = false;
    for (const auto& dim : *s) {
      if (!dim.is_number_unsigned() ||
          dim.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        safetensors_fail_tensor(
            file, name,
            fmt::format("shape {} has an entry that is not a non-negative integer ({})", excerpt(*s), excerpt(dim)));
      const auto n = dim.get<std::uint64_t>();
      e.shape.push_back(static_cast<std::int64_t>(n));
      overflow = overflow || __builtin_mul_overflow(nbytes, n, &nbytes);
    }
    auto o = v.find("data_offsets");
    if (o == v.end()) safetensors_fail_tensor(file, name, "no data_offsets");
    if (!o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() || !(*o)[1].is_number_unsigned())
      safetensors_fail_tensor(
          file, name, fmt::format("data_offsets must be [begin, end], two non-negative integers, got {}", excerpt(*o)));
    e.begin = (*o)[0].get<std::uint64_t>();
    e.end = (*o)[1].get<std::uint64_t>();
    if (e.end < e.begin)
      safetensors_fail_tensor(file, name, fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
    if (e.end > h.data_size)
      safetensors_fail_tensor(file, name,
                              fmt::format("data_offsets [{}, {}] run past the end of the data ({} bytes after the "
                                          "header; truncated?)",
                                          e.begin, e.end, h.data_size));
    std::int64_t numel = 1;
    for (auto dim : e.shape) overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
    if (overflow || nbytes != e.end - e.begin)
      safetensors_fail_tensor(
          file, name,
          fmt::format("shape {} of {} needs {}, but data_offsets [{}, {}] hold {}", header_shape(e.shape), e.dtype,
                      overflow ? std::string("more bytes than fit in 64 bits") : fmt::format("{} bytes", nbytes),
                      e.begin, e.end, e.end - e.begin));
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
      safetensors_fail_tensor(file, e->name,
                              fmt::format("data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", e->begin, e->end,
                                          prev->name, prev->begin, prev->end));
    if (e->begin > pos)
      safetensors_fail_tensor(file, e->name,
                              fmt::format("data_offsets [{}, {}] leave a hole: bytes [{}, {}) of the data belong to "
                                          "no tensor",
                                          e->begin, e->end, pos, e->begin));
    pos = e->end;
    prev = e;
  }
  if (pos != h.data_size)
    safetensors_fail(file, fmt::format("the tensors cover {} bytes of data but the file holds {} after the header "
                                       "(trailing bytes, or a header that lies)",
                                       pos, h.data_size));
  return h;
}

SafetensorsHeader parse_safetensors_bytes(const char* bytes, std::size_t size, std::uint64_t file_size,
                                          const std::string& file) {
  if (size < 8 || file_size < size) safetensors_fail(file, fmt::format("the file is {} bytes, shorter than 8", size));
  const std::uint64_t n = parse_safetensors_prefix(reinterpret_cast<const unsigned char*>(bytes), file_size, file);
  if (n > size - 8) safetensors_fail(file, "the header runs past the bytes given");
  return parse_safetensors_header(bytes + 8, n, file_size, file);
}

}  // namespace accel::checkpoint
