// accel::offload::AsyncFile and AlignedBuffer: opening (O_DIRECT or the buffered fallback), checking
// and splitting requests, and turning a failed request into a message that names the file, the offset,
// the bytes and the reason. The queue itself is offload/request_queue.
#include "offload/async_file.h"
#include "base/error.h"

#include "base/log.h"
#include "offload/request_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>

namespace accel::offload {

// ---- AlignedBuffer -------------------------------------------------------------------------------

AlignedBuffer::AlignedBuffer(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const std::size_t n = align_up(bytes);
  if (::posix_memalign(&data_, kAlignment, n) != 0) throw std::bad_alloc();
  std::memset(data_, 0, n);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

// ---- messages --------------------------------------------------------------------------------------

namespace {

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// strerror, plus what it means for offload where the system's words are terse.
std::string reason(int err, const std::string& path) {
  if (err == detail::kEndOfFile) return "the file ends there (short read)";
  std::string r = std::strerror(err);
  if (err == ENOSPC) r += ": the disk is full (the file system holding " + dir_of(path) + " has no free space left)";
  if (err == EDQUOT) r += ": the disk quota for " + dir_of(path) + " is used up";
  if (err == EFBIG)
    r += ": the file would pass the largest size allowed (the file system's limit, or this process's RLIMIT_FSIZE, "
         "`ulimit -f`)";
  return r;
}

const std::uint64_t kMaxBlock = std::uint64_t(1) << 30;  // io_uring's byte count is 32-bit; the kernel caps a
                                                         // transfer just under 2 GiB anyway

}  // namespace

std::string describe_bytes(std::uint64_t bytes) {
  if (bytes < 1000) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  static const char* units[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(bytes) / 1000.0;
  int u = 0;
  while (v >= 999.95 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  char head[32];
  std::snprintf(head, sizeof head, "%.1f %s", v, units[u]);
  return std::string(head) + " (" + std::to_string(bytes) + " bytes)";
}

// ---- AsyncFile -------------------------------------------------------------------------------------

struct AsyncFile::Impl {
  struct Request {
    bool write;
    std::uint64_t offset;
    std::size_t bytes;
  };
  int fd = -1;
  std::size_t block = 0;
  Ticket next = 1;
  std::map<Ticket, Request> requests;  // queued and not yet waited for
  std::unique_ptr<detail::RequestQueue> queue;
};

AsyncFile::AsyncFile(std::string path, bool create, const AioOptions& options, bool direct) : path_(std::move(path)) {
  if (options.block_size == 0)
    throw accel::InvalidArgumentError("AsyncFile " + path_ + ": aio.block_size must be at least 1 byte");
  if (options.queue_depth < 1)
    throw accel::InvalidArgumentError("AsyncFile " + path_ + ": aio.queue_depth must be at least 1 (got " +
                                      std::to_string(options.queue_depth) + ")");
  const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  int fd = -1;
  if (direct) {
    fd = ::open(path_.c_str(), flags | O_DIRECT, 0644);
    if (fd >= 0) {
      direct_ = true;
    } else if (errno == EINVAL) {  // the file system refuses O_DIRECT (ramfs, some FUSE and network ones)
      static std::once_flag once;
      std::call_once(once, [&] {
        log::warning("offload: the file system holding " + path_ +
                     " refuses O_DIRECT; offload files there go through the page cache (buffered I/O)");
      });
    } else {
      throw accel::RuntimeError("accel offload: cannot open " + path_ + ": " + reason(errno, path_));
    }
  }
  if (fd < 0) {
    fd = ::open(path_.c_str(), flags, 0644);
    if (fd < 0) throw accel::RuntimeError("accel offload: cannot open " + path_ + ": " + reason(errno, path_));
  }
  impl_ = new Impl;
  impl_->fd = fd;
  std::uint64_t block = std::min<std::uint64_t>(options.block_size, kMaxBlock);
  if (direct_) block = align_up(block);  // every piece of an aligned request stays aligned
  impl_->block = static_cast<std::size_t>(block);
  try {
    impl_->queue = std::make_unique<detail::RequestQueue>(fd, direct_, options, path_);
  } catch (...) {
    ::close(fd);
    delete impl_;
    throw;
  }
}

AsyncFile::~AsyncFile() {
  try {
    wait_all();
  } catch (const std::exception& e) {
    log::error(std::string("offload: a request still in flight when its file was closed failed: ") + e.what());
  }
  impl_->queue.reset();
  ::close(impl_->fd);
  delete impl_;
}

const char* AsyncFile::engine() const { return impl_->queue->engine(); }

namespace {

// Under O_DIRECT the kernel refuses (EINVAL) transfers whose buffer, offset or length is not aligned to
// the device's block; the check here names which one, before anything is queued.
void check_alignment(const std::string& path, const char* op, const void* buffer, std::size_t bytes,
                     std::uint64_t offset) {
  auto fail = [&](const std::string& what) {
    throw accel::InvalidArgumentError("AsyncFile::" + std::string(op) + " on " + path +
                                      ": the file is open with O_DIRECT, so " + what);
  };
  const auto address = reinterpret_cast<std::uintptr_t>(buffer);
  if (address % kAlignment != 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(address));
    fail("the buffer address must be a multiple of " + std::to_string(kAlignment) + " bytes (got " + hex +
         "; allocate it with AlignedBuffer)");
  }
  if (offset % kAlignment != 0)
    fail("the offset must be a multiple of " + std::to_string(kAlignment) + " bytes (got " + std::to_string(offset) +
         ")");
  if (bytes % kAlignment != 0)
    fail("the byte count must be a multiple of " + std::to_string(kAlignment) + " bytes (got " + std::to_string(bytes) +
         "; round it up with align_up)");
}

}  // namespace

AsyncFile::Ticket AsyncFile::read_async(void* buffer, std::size_t bytes, std::uint64_t offset) {
  return queue(false, buffer, bytes, offset);
}

AsyncFile::Ticket AsyncFile::write_async(const void* buffer, std::size_t bytes, std::uint64_t offset) {
  return queue(true, const_cast<void*>(buffer), bytes, offset);  // only read from, for a write
}

AsyncFile::Ticket AsyncFile::queue(bool write, void* buffer, std::size_t bytes, std::uint64_t offset) {
  const char* op = write ? "write_async" : "read_async";
  if (buffer == nullptr && bytes > 0)
    throw accel::InvalidArgumentError("AsyncFile::" + std::string(op) + " on " + path_ + ": null buffer for " +
                                      std::to_string(bytes) + " bytes");
  if (direct_) check_alignment(path_, op, buffer, bytes, offset);
  const Ticket ticket = impl_->next++;
  impl_->requests[ticket] = {write, offset, bytes};
  std::vector<detail::Chunk> chunks;
  chunks.reserve((bytes + impl_->block - 1) / impl_->block);
  for (std::size_t pos = 0; pos < bytes; pos += impl_->block) {
    detail::Chunk c;
    c.ticket = ticket;
    c.write = write;
    c.buffer = static_cast<char*>(buffer) + pos;
    c.bytes = std::min(impl_->block, bytes - pos);
    c.offset = offset + pos;
    chunks.push_back(c);
  }
  impl_->queue->enqueue(ticket, std::move(chunks));
  return ticket;
}

void AsyncFile::wait(Ticket ticket) {
  if (ticket == 0 || ticket >= impl_->next)
    throw accel::InvalidArgumentError("AsyncFile::wait on " + path_ + ": ticket " + std::to_string(ticket) +
                                      " was never issued by this file");
  auto it = impl_->requests.find(ticket);
  if (it == impl_->requests.end()) return;  // waited for already
  const Impl::Request r = it->second;
  impl_->requests.erase(it);
  const detail::Outcome outcome = impl_->queue->wait(ticket);
  if (outcome.err != 0) {
    std::string msg = "accel offload: " + std::string(r.write ? "writing " : "reading ") + describe_bytes(r.bytes) +
                      " at offset " + std::to_string(r.offset) + " of " + path_;
    if (outcome.err == detail::kEndOfFile)
      throw accel::RuntimeError(msg + ": the file ends before offset " + std::to_string(outcome.at) +
                                " (short read; the request runs to offset " + std::to_string(r.offset + r.bytes) + ")");
    if (outcome.at != r.offset) msg += " failed at offset " + std::to_string(outcome.at);
    throw accel::RuntimeError(msg + ": " + reason(outcome.err, path_));
  }
  (r.write ? bytes_written_ : bytes_read_) += r.bytes;
}

void AsyncFile::wait_all() {
  // Every request is waited for, even after one fails, so that no buffer is still in use on return.
  std::exception_ptr first;
  while (!impl_->requests.empty()) {
    try {
      wait(impl_->requests.begin()->first);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void AsyncFile::sync() {
  wait_all();
  while (::fdatasync(impl_->fd) != 0) {
    if (errno == EINTR) continue;
    throw accel::RuntimeError("accel offload: cannot flush " + path_ + " to disk (fdatasync): " + reason(errno, path_));
  }
}

void AsyncFile::reserve(std::uint64_t bytes) {
  if (bytes == 0) return;
  auto fail = [&](int err) {
    throw accel::RuntimeError("accel offload: cannot reserve " + describe_bytes(bytes) + " on disk for " + path_ +
                              ": " + reason(err, path_));
  };
  int rc;
  while ((rc = ::fallocate(impl_->fd, 0, 0, static_cast<off_t>(bytes))) != 0 && errno == EINTR) {
  }
  if (rc == 0) return;
  const int err = errno;
  if (err != EOPNOTSUPP && err != ENOSYS) fail(err);
  // No fallocate on this file system: posix_fallocate writes a byte into every block instead. glibc
  // does that with ordinary writes, which an O_DIRECT descriptor refuses, hence a buffered one.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(errno);
  const int perr = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  ::close(fd);
  if (perr != 0) fail(perr);
}

}  // namespace accel::offload
