// Communicator::node_shared_empty: one POSIX shared-memory object per call, created by the group's
// rank 0, named to the others over the group's MPI control channel, mapped by all, unlinked as soon as
// every rank has it mapped (the mappings keep it alive). Only a job killed in between leaves it in
// /dev/shm, under /accel-ns-<pid of rank 0>-<n>. Each mapping is recorded (node_shared.h) under a key
// made of the same two numbers, so a transport can find a peer's tensor in its own mapping.
#include "comm/transport/shm/node_shared.h"

#include "comm/communicator.h"

#include "base/log.h"
#include "comm/transport/backend.h"
#include "comm/transport/mpi/mpi_backend.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace accel::comm {
namespace {
std::atomic<int> g_objects{0};

struct Mapping {
  std::uint64_t key;
  char* base;
  std::size_t bytes;
};
// Never destroyed: a tensor freed during static destruction (an engine held by a static) still forgets
// its mapping here.
std::mutex& g_mu = *new std::mutex;
std::vector<Mapping>& g_mappings = *new std::vector<Mapping>;  // guarded by g_mu

void record(std::uint64_t key, void* base, std::size_t bytes) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_mappings.push_back({key, static_cast<char*>(base), bytes});
}

void forget(void* base) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_mappings.erase(
      std::remove_if(g_mappings.begin(), g_mappings.end(), [&](const Mapping& m) { return m.base == base; }),
      g_mappings.end());
}
}  // namespace

std::string shm_object_name(const char* kind, int n) {
  static const std::string token = [] {
    std::random_device rd;  // (a fresh token per process: pids repeat across PID namespaces)
    return fmt::format("{:08x}{:08x}", rd(), rd());
  }();
  return fmt::format("/accel-{}-{}-{}-{}", kind, static_cast<int>(getpid()), token, n);
}

SharedLocation find_node_shared(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lk(g_mu);
  for (const auto& m : g_mappings)
    if (c >= m.base && c + bytes <= m.base + m.bytes && bytes > 0)
      return {m.key, static_cast<std::uint64_t>(c - m.base)};
  return {};
}

char* node_shared_address(std::uint64_t key, std::uint64_t offset, std::size_t bytes) {
  std::lock_guard<std::mutex> lk(g_mu);
  for (const auto& m : g_mappings)
    if (m.key == key) return offset + bytes <= m.bytes ? m.base + offset : nullptr;
  return nullptr;
}

at::Tensor Communicator::node_shared_empty(std::int64_t numel, c10::ScalarType dtype, bool wanted) {
  if (numel < 0) throw InvalidArgument(fmt::format("node_shared_empty: numel must be >= 0, got {}", numel));
  if (broken_->load()) throw CommError("node_shared_empty: the communicator is broken by an earlier timeout");
  // Only where the group's CPU collectives go through one node's shared memory (the same answer on every rank).
  if (size_ == 1 || !cpu_ || std::strcmp(cpu_->name(), "shm") != 0) return {};
  const std::size_t bytes = std::max<std::size_t>(1, static_cast<std::size_t>(numel) * c10::elementSize(dtype));
  struct Hello {
    char name[64];
    char error[192];
    std::uint64_t key;
    int declined;
  } hello{};
  void* base = MAP_FAILED;
  if (rank_ == 0 && !wanted) {
    hello.declined = 1;
  } else if (rank_ == 0) {
    const int n = g_objects++;
    std::snprintf(hello.name, sizeof hello.name, "%s", shm_object_name("ns", n).c_str());
    hello.key = (static_cast<std::uint64_t>(getpid()) << 32) | static_cast<std::uint32_t>(n + 1);
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
    if (hello.declined) return {};
    log::warning(fmt::format("node-shared memory unavailable ({}); keeping private copies", hello.error));
    return {};
  }
  if (rank_ != 0 && wanted) {
    const int fd = shm_open(hello.name, O_RDWR, 0);
    if (fd >= 0) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
  }
  const int ok = !wanted ? -1 : base != MAP_FAILED ? 1 : 0;  // -1: this rank declines
  std::vector<int> oks(static_cast<std::size_t>(size_));
  mpi_->allgather_bytes(&ok, sizeof ok, oks.data());  // also: everyone has it open before the unlink
  if (rank_ == 0) shm_unlink(hello.name);
  if (std::find_if(oks.begin(), oks.end(), [](int o) { return o != 1; }) != oks.end()) {
    if (base != MAP_FAILED) munmap(base, bytes);
    if (std::find(oks.begin(), oks.end(), -1) != oks.end()) return {};  // declined, not failed: no warning
    log::warning(
        fmt::format("node-shared memory unavailable (a rank could not map {}); keeping private copies", hello.name));
    return {};
  }
  record(hello.key, base, bytes);
  return at::from_blob(
      base, {numel},
      [bytes](void* p) {
        forget(p);
        munmap(p, bytes);
      },
      at::TensorOptions().dtype(dtype).device(at::kCPU));
}

}  // namespace accel::comm
