// accel::offload: the checks run on an offload directory before training starts
// (check_offload_dir), the scratch files made there (ScratchFile) and the disk's sequential
// bandwidth there (measure_disk).
#include "base/error.h"
#include "offload/async_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace accel::offload {

ScratchFile::ScratchFile(const std::string& dir, const std::string& name, std::uint64_t bytes,
                         const AioOptions& options, const std::string& what)
    : path_(dir + "/" + name) {
  check_offload_dir(dir, bytes, what);
  file_ = std::make_unique<AsyncFile>(path_, /*create=*/true, options);
  try {
    if (bytes > 0) file_->reserve(bytes);
  } catch (...) {
    file_.reset();
    std::remove(path_.c_str());
    throw;
  }
}

ScratchFile::~ScratchFile() {
  file_.reset();  // waits for what is in flight
  std::remove(path_.c_str());
}

void check_offload_dir(const std::string& path, std::uint64_t bytes, const std::string& what) {
  const std::string needs = "offload needs " + describe_bytes(bytes) + " there";
  auto fail = [&](const std::string& problem) { throw accel::RuntimeError(what + ": " + problem + "; " + needs); };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) fail("the directory " + path + " does not exist (create it, or point " + what + " elsewhere)");
    fail("cannot access " + path + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) fail(path + " is not a directory");
  // Writability is what the file system says when asked to create a file: permissions, a read-only
  // mount, ACLs and quotas all answer here (access(2) would miss some of them).
  const std::string probe = path + "/.accel_offload_probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    fail("the directory " + path + " is not writable (creating a file there failed: " + std::strerror(errno) + ")");
  ::close(fd);
  ::unlink(probe.c_str());
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0) fail("cannot read the free space of " + path + ": " + std::strerror(errno));
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < bytes)
    throw accel::RuntimeError(what + ": not enough room in " + path + ": offload needs " + describe_bytes(bytes) +
                              " there, the file system has " + describe_bytes(free_bytes) + " free");
}

DiskBandwidth measure_disk(const std::string& dir, std::uint64_t bytes, const AioOptions& options) {
  if (bytes == 0) throw accel::InvalidArgumentError("measure_disk: bytes must be > 0");
  const std::string path = dir + "/.accel_disk_probe." + std::to_string(::getpid()) + ".bin";
  struct Remove {
    const std::string& p;
    ~Remove() { ::unlink(p.c_str()); }
  } remove{path};
  AsyncFile file(path, /*create=*/true, options, /*direct=*/true);
  const std::uint64_t total = align_up(bytes);
  file.reserve(total);  // as offload does: a full disk fails here, and writes land in allocated blocks
  const std::size_t block = align_up(std::max<std::size_t>(options.block_size, 1));
  // Twice queue_depth requests outstanding keep queue_depth in flight while completions are reaped.
  const std::size_t window = 2 * static_cast<std::size_t>(std::max(options.queue_depth, 1));
  AlignedBuffer buffer(block * window);
  auto* words = static_cast<std::uint64_t*>(buffer.data());
  std::uint64_t x = 0x9E3779B97F4A7C15ull;  // not zeros: nothing below may store them for free
  for (std::size_t i = 0; i < buffer.size() / 8; ++i) words[i] = (x += 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;

  using clock = std::chrono::steady_clock;
  auto pass = [&](bool write) {
    std::vector<AsyncFile::Ticket> tickets(window, 0);
    const auto start = clock::now();
    std::size_t i = 0;
    for (std::uint64_t pos = 0; pos < total; pos += block, ++i) {
      const std::size_t s = i % window;
      if (tickets[s] != 0) file.wait(tickets[s]);
      char* at = static_cast<char*>(buffer.data()) + s * block;
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(block, total - pos));
      tickets[s] = write ? file.write_async(at, n, pos) : file.read_async(at, n, pos);
    }
    if (write) {
      file.sync();  // on the disk, not in the page cache
    } else {
      file.wait_all();
    }
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  DiskBandwidth out;
  out.direct = file.direct();
  const double write_s = pass(true);
  if (!file.direct()) {
    // Buffered: drop the file's (now clean) pages so that the read comes from the disk.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  const double read_s = pass(false);
  out.write_gbps = static_cast<double>(total) / write_s / 1e9;
  out.read_gbps = static_cast<double>(total) / read_s / 1e9;
  return out;
}

}  // namespace accel::offload
