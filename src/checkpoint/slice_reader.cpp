// SliceReader: element ranges of a checkpoint's tensors, read from their slices (see slice_reader.h).
#include "checkpoint/slice_reader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace accel::checkpoint {

SliceReader::~SliceReader() {
  for (auto& [name, fd] : fds_) ::close(fd);
}

at::Tensor SliceReader::range(const std::string& key, const Entry& e, std::int64_t lo, std::int64_t hi) {
  // The slices' parts inside [lo, hi), checked first: they must cover it once (write_state writes
  // each element once; an index listing one twice, or not at all, is malformed).
  std::vector<std::pair<std::int64_t, std::int64_t>> parts;
  for (const Slice& s : e.slices) {
    const std::int64_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a < b) parts.emplace_back(a, b);
  }
  std::sort(parts.begin(), parts.end());
  std::int64_t covered = 0, end = lo;
  for (const auto& [a, b] : parts) {
    if (a < end)
      throw CheckpointError(fmt::format("{}/index.json: {} elements [{}, {}) are in more than one slice", dir_, key, a,
                                        std::min(b, end)));
    covered += b - a;
    end = b;
  }
  if (covered != hi - lo)
    throw CheckpointError(
        fmt::format("{}/index.json: {} elements [{}, {}) are not all in its slices (the checkpoint "
                    "is incomplete)",
                    dir_, key, lo, hi));
  at::Tensor out = at::empty({hi - lo}, at::TensorOptions().dtype(e.dtype));
  for (const Slice& s : e.slices) {
    const std::int64_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a >= b) continue;
    if (s.begin >= lo && s.end <= hi && !cache_.count(slice_id(s))) {  // wholly inside: read in place
      read_slice(key, e, s, out.narrow(0, s.begin - lo, s.end - s.begin).data_ptr());
      continue;
    }
    const at::Tensor& whole = slice_data(key, e, s);
    out.narrow(0, a - lo, b - a).copy_(whole.narrow(0, a - s.begin, b - a));
  }
  return out;
}

std::string SliceReader::slice_id(const Slice& s) { return s.file + "@" + std::to_string(s.offset); }

const at::Tensor& SliceReader::slice_data(const std::string& key, const Entry& e, const Slice& s) {
  const std::string id = slice_id(s);
  if (auto it = cache_.find(id); it != cache_.end()) return it->second;
  at::Tensor t = at::empty({s.end - s.begin}, at::TensorOptions().dtype(e.dtype));
  read_slice(key, e, s, t.data_ptr());
  return cache_.emplace(id, std::move(t)).first->second;
}

void SliceReader::read_slice(const std::string& key, const Entry& e, const Slice& s, void* dst) {
  const std::string path = dir_ + "/" + s.file;
  int& fd = fds_[s.file];
  if (fd == 0) {
    fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) {
      fd = 0;
      throw CheckpointError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    }
  }
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<std::uint64_t>(st.st_size) < s.offset + s.bytes)
    throw CheckpointError(fmt::format("{} is truncated: {} bytes, but {} needs bytes [{}, {})", path, st.st_size, key,
                                      s.offset, s.offset + s.bytes));
  const std::int64_t n = s.end - s.begin;
  const std::int64_t elem = c10::elementSize(e.dtype);
  if (static_cast<std::uint64_t>(n * elem) != s.bytes)
    throw CheckpointError(fmt::format("{}/index.json: {} slice [{}, {}) does not match its byte count {}", dir_, key,
                                      s.begin, s.end, s.bytes));
  char* p = static_cast<char*>(dst);
  std::uint64_t done = 0;
  while (done < s.bytes) {
    const ssize_t r = ::pread(fd, p + done, s.bytes - done, static_cast<off_t>(s.offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw CheckpointError(fmt::format("cannot read {}: {}", path, r < 0 ? std::strerror(errno) : "unexpected end"));
    done += static_cast<std::uint64_t>(r);
  }
  bytes_read_ += s.bytes;
  if (slice_crc32(p, s.bytes) != s.crc)
    throw CheckpointError(fmt::format("{}: {} bytes [{}, {}) fail their CRC32 check (the file is corrupted)", path, key,
                                      s.offset, s.offset + s.bytes));
}

}  // namespace accel::checkpoint
