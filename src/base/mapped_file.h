// accel::files::MappedFile — a whole file mapped privately into memory (MAP_PRIVATE, read and
// write: a stray write lands in a private copy instead of faulting), and the page-level advice that
// pages disk-offloaded weights (src/dispatch/) and token files (src/data/) in and out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace accel::files {

class MappedFile {
 public:
  // Throws std::runtime_error naming the file.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t size() const { return size_; }
  char* data() const { return data_; }

  // Page-aligned (outward) advice over bytes [offset, offset + n) of the file.
  void will_need(std::uint64_t offset, std::uint64_t n) const;   // start reading ahead
  void dont_need(std::uint64_t offset, std::uint64_t n) const;   // drop this process's pages
  void drop_cache(std::uint64_t offset, std::uint64_t n) const;  // and the page cache's clean copy

 private:
  MappedFile() = default;
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  char* data_ = nullptr;
};

}  // namespace accel::files
