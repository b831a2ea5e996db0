// accel::offload — files for offloaded state, read and written asynchronously through the kernel's
// asynchronous I/O, with O_DIRECT where the file system allows it (see docs/offload.md, "Disk I/O:
// why liburing"). Offload files are scratch: the checkpoint is the durable state.
//
// Engine: io_uring (liburing), one ring and one completion thread per file, which keeps up to
// queue_depth requests in flight while the caller computes. Where io_uring cannot be set up
// (seccomp-filtered containers, kernel.io_uring_disabled, old kernels) a pool of queue_depth threads
// doing pread/pwrite takes its place, said once in the log.
//
// Errors name the file, the offset and the byte count; a full disk says so ("no space left on
// device") and never leaves a short write unnoticed.
//
// Layering: below zero/ (the offloaded optimizer and parameter shards use it); depends on nothing of
// accel but base/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace accel::offload {

// O_DIRECT transfers need buffer address, file offset and length aligned to this many bytes.
constexpr std::size_t kAlignment = 4096;
constexpr std::uint64_t align_up(std::uint64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// Heap memory aligned to kAlignment (zero-filled), for O_DIRECT transfers. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// DeepSpeed's `aio` block, with its defaults.
struct AioOptions {
  std::size_t block_size = 1 << 20;  // a request larger than this is split into requests of this size
                                     // (rounded up to kAlignment under O_DIRECT; at most 1 GiB)
  int queue_depth = 8;               // requests in flight per file
  bool single_submit = false;        // io_uring: submit each request on its own instead of in batches
  bool overlap_events = true;        // io_uring: refill the queue as each request completes (false:
                                     // only once all in flight have completed)
  // Not DeepSpeed's: false uses the thread pool even where io_uring works (tests, comparisons).
  bool kernel_aio = true;
};

// One file opened for reading and writing. Not thread-safe: one thread queues and waits.
class AsyncFile {
 public:
  using Ticket = std::uint64_t;
  // create: create or truncate; else open an existing file. direct: try O_DIRECT, falling back to
  // buffered I/O where the file system refuses it (direct() says which).
  AsyncFile(std::string path, bool create, const AioOptions& options = {}, bool direct = true);
  ~AsyncFile();  // waits for requests in flight (errors then are logged, not thrown), closes
  AsyncFile(const AsyncFile&) = delete;
  AsyncFile& operator=(const AsyncFile&) = delete;

  // Queue a transfer of `bytes` at `offset`. Under O_DIRECT, buffer, offset and bytes must be
  // multiples of kAlignment (std::invalid_argument otherwise). The buffer must stay alive and, for a
  // read, untouched until wait() returns for the ticket.
  Ticket read_async(void* buffer, std::size_t bytes, std::uint64_t offset);
  Ticket write_async(const void* buffer, std::size_t bytes, std::uint64_t offset);
  // Blocks until the transfer is complete; throws std::runtime_error naming the file, offset, bytes
  // and the system's reason (a short transfer is an error too). Waiting twice is a no-op.
  void wait(Ticket ticket);
  void wait_all();
  // Synchronous forms.
  void read(void* buffer, std::size_t bytes, std::uint64_t offset) { wait(read_async(buffer, bytes, offset)); }
  void write(const void* buffer, std::size_t bytes, std::uint64_t offset) { wait(write_async(buffer, bytes, offset)); }

  // Reserves `bytes` on disk now (fallocate), so that a full disk is an error here, at setup, rather
  // than in the middle of a step. The file's size becomes at least `bytes`. Where the file system has
  // no fallocate, posix_fallocate writes the blocks instead. Throws naming the file and the bytes.
  void reserve(std::uint64_t bytes);

  // fdatasync after every request queued so far has completed (wait_all): the bytes are on the disk,
  // not in the page cache (measure_disk times writes this way). Throws naming the file.
  void sync();

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  // "io_uring" or "thread pool" (the fallback).
  const char* engine() const;
  std::uint64_t bytes_read() const { return bytes_read_; }
  std::uint64_t bytes_written() const { return bytes_written_; }

 private:
  Ticket queue(bool write, void* buffer, std::size_t bytes, std::uint64_t offset);

  struct Impl;
  Impl* impl_ = nullptr;
  std::string path_;
  bool direct_ = false;
  std::uint64_t bytes_read_ = 0, bytes_written_ = 0;
};

// "48.0 GB (48000000000 bytes)"; "512 bytes" below 1 kB. Decimal units, as disks are sold.
std::string describe_bytes(std::uint64_t bytes);

// An offload file that exists only as long as this object: check_offload_dir on `dir` (naming
// `what`), then `dir`/`name` created and `bytes` reserved; closed (in-flight requests waited for) and
// removed on destruction, or when the constructor throws.
class ScratchFile {
 public:
  ScratchFile(const std::string& dir, const std::string& name, std::uint64_t bytes, const AioOptions& options,
              const std::string& what);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  AsyncFile& file() { return *file_; }
  const AsyncFile& file() const { return *file_; }

 private:
  std::string path_;
  std::unique_ptr<AsyncFile> file_;
};

// Checks a directory offload will write `bytes` into, before training starts: it exists, is a
// directory, is writable (a probe file is created and removed) and has room for the bytes (statvfs).
// Throws std::runtime_error naming `what` (the config key, "offload_optimizer.nvme_path"), the path,
// the bytes needed and, for room, the bytes free.
void check_offload_dir(const std::string& path, std::uint64_t bytes, const std::string& what);

// The disk's sequential bandwidth under `dir`: writes then reads `bytes` through AsyncFile (O_DIRECT
// where allowed) in block_size requests, queue_depth in flight; removes its file. GB/s = 1e9 bytes/s.
// The file is reserved first (a disk without room fails there, as offload would). The write time
// includes the final fdatasync. Without O_DIRECT (direct false) the file's pages are
// dropped from the page cache (posix_fadvise) before reading, so both figures are the disk's.
struct DiskBandwidth {
  double write_gbps = 0, read_gbps = 0;
  bool direct = false;  // O_DIRECT was used
};
DiskBandwidth measure_disk(const std::string& dir, std::uint64_t bytes, const AioOptions& options = {});

}  // namespace accel::offload
