// accel::comm::shm — one group's collectives on the shared-memory transport (shm_backend.h): the
// queue of collectives in issue order, and the steps each one takes (chunked through the segment, or
// reading the peers' memory straight for large ones). Moved by whichever thread holds the group's
// lock: a caller polling in Work::wait, or the process's progress thread (progress.h). Internal.
#pragma once

#include "comm/transport/backend.h"
#include "comm/transport/shm/segment.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace accel::comm::shm {

// Broadcasts from this size on are read straight from the root's memory (process_vm_readv: one copy
// instead of two through the segment) where the kernel allows it. So are all_gathers and
// reduce_scatters from ACCEL_COMM_SHM_SINGLE_COPY_KB per peer (1 MiB by default). Alone, the chunked
// path can move them faster (2 ranks on a Zen 5, busbw GB/s, all_gather chunked / single copy: 4 MiB
// 17.3-18.9 / 5.5-9.6, 256 MiB 5.9-6.0 / 4.0-4.1; on an Intel Xeon the two were even: 64 MiB 2.9 /
// 3.5), but only while both ranks poll it at once. Beside compute (ZeRO-3's prefetched gathers,
// backward's reduce-scatters) each rank's progress thread shares its core, and chunk-by-chunk
// lock-step stalls both ranks on either's descheduling (0.59B private ZeRO-3 at 2 ranks: wait 26% of
// the step chunked, 2% single copy).
constexpr std::int64_t kSingleCopyBytes = 1 << 20;
constexpr std::int64_t kDirectBytes = 64 << 10;  // all_reduce up to this size: one round (ShmOp::direct)

enum class Phase : std::uint8_t { In, Reduce, Out };

struct ShmOp {
  Request req;
  bool started = false;
  std::uint64_t seq = 0, g0 = 0;
  // count and unit (per chunk): elements for all_reduce and reduce_scatter (of the output), bytes
  // for all_gather (of the input) and broadcast.
  std::int64_t esize = 1, count = 0, unit = 1, nchunks = 0;
  // reduce_scatter: the output's element size (fp32 from 16-bit inputs for the hierarchical
  // transport's node sums, backend.h; the input's otherwise)
  std::int64_t oesize = 1;
  bool in_place = false;     // all_gather: the input is the output's own slice
  bool single_copy = false;  // read from the peers' memory (see plan: large broadcasts, all_gathers, reduce_scatters)
  bool direct = false;       // all_reduce in one round: every rank reduces whole chunks (see plan)
  // reduce_scatter: this rank's input lies in node-shared memory (at in_key/in_off; key 0: it does not):
  // it copies nothing in, and its last step waits until every peer is done reading it. peer_in: each
  // peer's input in this process's mapping, or null where that peer copies through its buffers (set at
  // the first read).
  std::uint64_t in_key = 0, in_off = 0;
  bool zero_copy() const { return in_key != 0; }
  std::vector<const char*> peer_in;
  std::vector<std::pair<Phase, std::int64_t>> steps;
  std::size_t pos = 0;
};

class ShmGroup {
 public:
  // check: compare signatures before each collective (rank 0's ACCEL_COMM_CHECK, so ranks agree).
  ShmGroup(std::unique_ptr<Segment> seg, int rank, int size, bool check, bool single_copy,
           std::int64_t single_copy_bytes)
      : seg_(std::move(seg)),
        rank_(rank),
        size_(size),
        check_(check),
        single_copy_(single_copy),
        single_copy_bytes_(single_copy_bytes) {}

  void push(std::unique_ptr<ShmOp> op) {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(op));
  }
  // Nothing queued (false while another thread holds the group: it may be queueing).
  bool idle() {
    std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
    return lk.owns_lock() && q_.empty();
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Moves the queued collectives as far as the peers allow, in issue order; true when anything
  // moved. Never waits for a peer; skips (false) when another thread is moving this group.
  bool progress();
  // For a timeout's message (Work::set_diagnosis): the peers whose progress is behind the group's
  // furthest (they have not joined the collective the others wait in), named by world rank and pid,
  // with their process's state (stopped: SIGSTOP or a debugger; gone). "" when nobody is behind and
  // every peer's process runs (the rank missing is elsewhere: another node).
  std::string peers_behind();

 private:
  bool all_at_least(Counter RankCtl::*c, std::uint64_t v);
  void plan(ShmOp& op);
  // True when the collective is finished; false when it waits for a peer (or a dependency).
  bool run(ShmOp& op, bool& moved);
  // A large broadcast, all_gather or reduce_scatter, one copy: each rank pulls its peers' bytes
  // itself, at its own pace (no chunk-by-chunk lock-step with them), and returns once its peers are
  // done reading its own.
  bool single_copy_step(ShmOp& op, Phase ph, std::uint64_t g, char* out);
  // reduce_scatter, single copy: my slice of every rank's input, reduced in rank order (the chunked
  // path's order, so the same bits) a chunk at a time: my own input where it lies, each peer's read
  // where it lies in node-shared memory, or else into scratch from the peer's memory.
  void reduce_scatter_from_peers(ShmOp& op, char* out);
  // process_vm_readv of n bytes at peer j's posted address (plus `at`) into dst.
  void read_peer(int j, char* dst, std::int64_t n, std::uint64_t at = 0);
  // Once every rank has posted its first chunk: compare the signatures (unless unchecked). On a
  // mismatch, every rank marks that one chunk consumed and raises, so the group stays usable.
  void verify_first_chunk(ShmOp& op, std::uint64_t g);
  // reduce_scatter, at its first read (every peer's first chunk is posted): where each peer's input
  // lies in this process when that peer reads it in place from node-shared memory.
  void find_peer_inputs(ShmOp& op);
  // One step of one chunk; false when a peer is not there yet.
  bool step(ShmOp& op, Phase ph, std::int64_t t);

  std::mutex mu_;
  std::deque<std::unique_ptr<ShmOp>> q_;  // issue order; guarded by mu_
  std::unique_ptr<Segment> seg_;
  const int rank_, size_;
  const bool check_;
  const bool single_copy_;  // process_vm_readv works between every pair (probed at setup)
  // all_gathers and reduce_scatters moving at least this much per peer read the peers' memory; 0: none
  const std::int64_t single_copy_bytes_;
  std::uint64_t seq_ = 0, chunks_ = 0;  // guarded by mu_
  std::vector<char> scratch_;           // single-copy reduce_scatter's peer chunks; guarded by mu_
};

// Bytes read in place / from peers' memory, process-wide (shm_backend.h's counters).
std::uint64_t bytes_read_in_place();
std::uint64_t bytes_read_from_peer_memory();

}  // namespace accel::comm::shm
