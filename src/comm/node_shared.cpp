// Communicator::node_shared_empty: one POSIX shared-memory object per call, created by the group's
// rank 0, named to the others over the group's MPI control channel, mapped by all, unlinked as soon as
// every rank has it mapped (the mappings keep it alive). Only a job killed in between leaves it in
// /dev/shm, under /accel-ns-<pid of rank 0>-<n>.
#include "comm/communicator.h"

#include "base/log.h"
#include "comm/backend.h"
#include "comm/mpi_backend.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace accel::comm {
namespace {
std::atomic<int> g_objects{0};
}  // namespace

at::Tensor Communicator::node_shared_empty(std::int64_t numel, c10::ScalarType dtype) {
  if (numel < 0) throw InvalidArgument(fmt::format("node_shared_empty: numel must be >= 0, got {}", numel));
  if (broken_->load()) throw CommError("node_shared_empty: the communicator is broken by an earlier timeout");
  // Only where the group's CPU collectives go through one node's shared memory (the same answer on every rank).
  if (size_ == 1 || !cpu_ || std::strcmp(cpu_->name(), "shm") != 0) return {};
  const std::size_t bytes = std::max<std::size_t>(1, static_cast<std::size_t>(numel) * c10::elementSize(dtype));
  struct Hello {
    char name[64];
    char error[192];
  } hello{};
  void* base = MAP_FAILED;
  if (rank_ == 0) {
    std::snprintf(hello.name, sizeof hello.name, "/accel-ns-%d-%d", static_cast<int>(getpid()), g_objects++);
    const int fd = shm_open(hello.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    int err = fd < 0 ? errno : 0;
    const char* what = "shm_open";
    if (fd >= 0) {
      // Reserve every page now (tmpfs zero-fills them): a /dev/shm too small fails here, not as a
      // SIGBUS on some later write.
      if ((err = posix_fallocate(fd, 0, static_cast<off_t>(bytes))) != 0) {
        what = "posix_fallocate";
      } else {
        base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) {
          err = errno;
          what = "mmap";
        }
      }
      close(fd);
    }
    if (base == MAP_FAILED) {
      if (fd >= 0) shm_unlink(hello.name);
      std::snprintf(hello.error, sizeof hello.error, "%s of %zu bytes failed: %s", what, bytes, std::strerror(err));
      hello.name[0] = '\0';
    }
  }
  mpi_->broadcast_bytes(&hello, sizeof hello, 0);
  if (hello.name[0] == '\0') {
    log::warning(fmt::format("node-shared memory unavailable ({}); keeping private copies", hello.error));
    return {};
  }
  if (rank_ != 0) {
    const int fd = shm_open(hello.name, O_RDWR, 0);
    if (fd >= 0) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
  }
  const int ok = base != MAP_FAILED;
  std::vector<int> oks(static_cast<std::size_t>(size_));
  mpi_->allgather_bytes(&ok, sizeof ok, oks.data());  // also: everyone has it open before the unlink
  if (rank_ == 0) shm_unlink(hello.name);
  if (std::find(oks.begin(), oks.end(), 0) != oks.end()) {
    if (base != MAP_FAILED) munmap(base, bytes);
    log::warning(
        fmt::format("node-shared memory unavailable (a rank could not map {}); keeping private copies", hello.name));
    return {};
  }
  return at::from_blob(
      base, {numel}, [bytes](void* p) { munmap(p, bytes); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

}  // namespace accel::comm
