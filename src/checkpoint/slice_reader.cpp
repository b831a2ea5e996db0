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

namespace accel::checkpoint {

SliceReader::~SliceReader() {
  for (auto& [name, fd] : fds_) ::close(fd);
}

at::Tensor SliceReader::range(const std::string& key, const Entry& e, std::int64_t lo, std::int64_t hi) {
  at::Tensor out = at::empty({hi - lo}, at::TensorOptions().dtype(e.dtype));
  std::int64_t covered = 0;
  for (const Slice& s : e.slices) {
    const std::int64_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a >= b) continue;
    const at::Tensor& whole = slice_data(key, e, s);
    out.narrow(0, a - lo, b - a).copy_(whole.narrow(0, a - s.begin, b - a));
    covered += b - a;
  }
  if (covered != hi - lo)
    throw CheckpointError(
        fmt::format("{}/index.json: {} elements [{}, {}) are not all in its slices (the checkpoint "
                    "is incomplete)",
                    dir_, key, lo, hi));
  return out;
}

const at::Tensor& SliceReader::slice_data(const std::string& key, const Entry& e, const Slice& s) {
  const std::string id = s.file + "@" + std::to_string(s.offset);
  if (auto it = cache_.find(id); it != cache_.end()) return it->second;
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
  at::Tensor t = at::empty({n}, at::TensorOptions().dtype(e.dtype));
  char* p = static_cast<char*>(t.data_ptr());
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
  return cache_.emplace(id, std::move(t)).first->second;
}

}  // namespace accel::checkpoint
