// MappedFile (mapped_file.h): mmap, madvise and posix_fadvise.
#include "base/mapped_file.h"
#include "base/error.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace accel::files {
namespace {
std::uint64_t page() {
  static const std::uint64_t p = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) throw accel::RuntimeError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0)
    throw accel::RuntimeError(fmt::format("cannot stat '{}': {}", path, std::strerror(errno)));
  f->size_ = static_cast<std::uint64_t>(st.st_size);
  if (f->size_ == 0) return f;
  void* p = ::mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd_, 0);
  if (p == MAP_FAILED) throw accel::RuntimeError(fmt::format("cannot map '{}': {}", path, std::strerror(errno)));
  f->data_ = static_cast<char*>(p);
  return f;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

namespace {
// [offset, offset + n) widened to whole pages and clipped to the file.
std::pair<std::uint64_t, std::uint64_t> pages(std::uint64_t offset, std::uint64_t n, std::uint64_t size) {
  const std::uint64_t b = offset / page() * page();
  std::uint64_t e = (offset + n + page() - 1) / page() * page();
  const std::uint64_t end = (size + page() - 1) / page() * page();
  return {b, std::min(e, end) - b};
}
}  // namespace

void MappedFile::will_need(std::uint64_t offset, std::uint64_t n) const {
  if (!data_ || n == 0) return;
  auto [b, len] = pages(offset, n, size_);
  ::madvise(data_ + b, len, MADV_WILLNEED);  // advice: a failure only costs speed
}

void MappedFile::dont_need(std::uint64_t offset, std::uint64_t n) const {
  if (!data_ || n == 0) return;
  auto [b, len] = pages(offset, n, size_);
  ::madvise(data_ + b, len, MADV_DONTNEED);
}

void MappedFile::drop_cache(std::uint64_t offset, std::uint64_t n) const {
  if (fd_ < 0 || n == 0) return;
  auto [b, len] = pages(offset, n, size_);
  ::posix_fadvise(fd_, static_cast<off_t>(b), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
}

}  // namespace accel::files
