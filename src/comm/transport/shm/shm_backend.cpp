// Shared-memory transport (see shm_backend.h): the Backend over one group, and setting up its segment.
// The segment's layout: segment.h; a group's collectives and their steps: group.{h,cpp}; the
// progress thread: progress.{h,cpp}.
#include "comm/transport/shm/shm_backend.h"

#include "base/env.h"
#include "comm/transport/mpi/mpi_backend.h"
#include "comm/transport/shm/group.h"
#include "comm/transport/shm/node_shared.h"
#include "comm/transport/shm/progress.h"
#include "comm/transport/shm/segment.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <new>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

namespace accel::comm {
namespace {

using shm::RankCtl;
using shm::Segment;
using shm::ShmGroup;
using shm::ShmOp;

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(std::shared_ptr<ShmGroup> g) : g_(std::move(g)) {}
  const char* name() const override { return "shm"; }
  int rank() const override { return g_->rank(); }
  int size() const override { return g_->size(); }

  void enqueue(Request r) override {
    auto op = std::make_unique<ShmOp>();
    const bool inline_progress = r.caller_waits && r.after.empty();
    WorkPtr work = r.work;
    std::weak_ptr<ShmGroup> weak = g_;
    // A waiter moves the group itself (the poll); finish() comes from whichever thread completes it.
    work->set_poll([weak] {
      if (auto g = weak.lock()) g->progress();
      return false;
    });
    work->set_diagnosis([weak] {
      auto g = weak.lock();
      return g ? g->peers_behind() : std::string();
    });
    op->req = std::move(r);
    g_->push(std::move(op));
    if (inline_progress)
      g_->progress();  // the caller is about to wait anyway: no thread hand-off for small messages
    else
      shm::activate(g_);
  }

 private:
  std::shared_ptr<ShmGroup> g_;
};

std::atomic<int> g_segments{0};

}  // namespace

std::uint64_t shm_bytes_read_in_place() { return shm::bytes_read_in_place(); }
std::uint64_t shm_bytes_read_from_peer_memory() { return shm::bytes_read_from_peer_memory(); }

std::unique_ptr<Backend> make_shm_backend(MpiBackend& group) {
  const int rank = group.rank(), size = group.size();
  if (size > 64) return nullptr;  // the reduction's source list is sized for 64 ranks per node
  struct Hello {
    char name[64];
    std::uint64_t chunk, bytes, check, single_copy_kb;
  } hello{};
  void* base = MAP_FAILED;
  if (rank == 0) {
    std::uint64_t chunk = static_cast<std::uint64_t>(std::max<long long>(1, env::get_int("ACCEL_COMM_SHM_CHUNK_KB")));
    hello.chunk = chunk * 1024;
    hello.check = env::get_int("ACCEL_COMM_CHECK") != 0;
    hello.single_copy_kb =
        static_cast<std::uint64_t>(std::max<long long>(0, env::get_int("ACCEL_COMM_SHM_SINGLE_COPY_KB")));
    hello.bytes = Segment::total_bytes(size, hello.chunk);
    std::snprintf(hello.name, sizeof hello.name, "%s", shm_object_name("seg", g_segments++).c_str());
    int fd = shm_open(hello.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      if (ftruncate(fd, static_cast<off_t>(hello.bytes)) == 0)
        base = mmap(nullptr, hello.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      close(fd);
    }
    if (base == MAP_FAILED) {
      if (fd >= 0) shm_unlink(hello.name);
      hello.name[0] = '\0';
    } else {
      for (int j = 0; j < size; ++j) new (static_cast<char*>(base) + j * sizeof(RankCtl)) RankCtl{};
    }
  }
  group.broadcast_bytes(&hello, sizeof hello, 0);
  if (hello.name[0] == '\0') return nullptr;
  if (rank != 0) {
    int fd = shm_open(hello.name, O_RDWR, 0);
    if (fd >= 0) {
      base = mmap(nullptr, hello.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      close(fd);
    }
  }
  int ok = base != MAP_FAILED, all_ok = 1;
  std::vector<int> oks(size);
  group.allgather_bytes(&ok, sizeof ok, oks.data());  // also: everyone has it open before the unlink
  for (int o : oks) all_ok &= o;
  if (rank == 0) shm_unlink(hello.name);
  if (!all_ok) {
    if (base != MAP_FAILED) munmap(base, hello.bytes);
    return nullptr;
  }
  auto seg = std::make_unique<Segment>(base, hello.bytes, size, hello.chunk);
  // Can this rank read its peers' memory (process_vm_readv: same user, no ptrace restriction)?
  // Each rank posts its pid and a probe word's address; every rank must read every other's.
  static const std::uint64_t probe_word = 0x61636365'6c736d21ULL;
  seg->ctl(rank).pid = getpid();
  seg->ctl(rank).world_rank = MpiBackend::world_rank();
  seg->ctl(rank).src_addr = reinterpret_cast<std::uint64_t>(&probe_word);
  int dummy = 0;
  std::vector<int> sync(size);
  group.allgather_bytes(&dummy, sizeof dummy, sync.data());  // everyone has posted
  int cma = 1;
  for (int j = 0; j < size && cma; ++j) {
    if (j == rank) continue;
    std::uint64_t v = 0;
    iovec local{&v, sizeof v};
    iovec remote{reinterpret_cast<void*>(seg->ctl(j).src_addr), sizeof v};
    cma = process_vm_readv(static_cast<pid_t>(seg->ctl(j).pid), &local, 1, &remote, 1, 0) ==
              static_cast<ssize_t>(sizeof v) &&
          v == probe_word;
  }
  // Only where every rank has a core: oversubscribed, the readers' extra round (the owner waits
  // for all of them) cost more than the copy it saves (measured at 4 ranks on 2 cores).
  // (The machine's CPUs, not this rank's affinity: a launcher may bind each rank to its own core.)
  if (static_cast<int>(std::thread::hardware_concurrency()) < size) cma = 0;
  std::vector<int> cmas(size);
  group.allgather_bytes(&cma, sizeof cma, cmas.data());
  const bool single_copy = std::find(cmas.begin(), cmas.end(), 0) == cmas.end();
  return std::make_unique<ShmBackend>(
      std::make_shared<ShmGroup>(std::move(seg), rank, size, hello.check != 0, single_copy,
                                 static_cast<std::int64_t>(hello.single_copy_kb) * 1024));
}

}  // namespace accel::comm
