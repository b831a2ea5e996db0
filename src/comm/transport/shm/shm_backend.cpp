// Shared-memory transport (see shm_backend.h): the segment, the per-collective step lists, and the
// process's progress thread for collectives nobody is waiting on yet.
#include "comm/transport/shm/shm_backend.h"

#include "base/env.h"
#include "comm/transport/mpi/mpi_backend.h"
#include "comm/transport/shm/node_shared.h"
#include "comm/transport/shm/shm_reduce.h"
#include "comm/signature.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

namespace accel::comm {
namespace {

using Counter = std::atomic<std::uint64_t>;
static_assert(Counter::is_always_lock_free, "shared-memory counters must be lock-free (address-free)");

// One rank's control block, on cache lines of its own; only that rank writes it. The counters count
// chunks over the group's whole life, so they never need resetting between collectives.
struct alignas(128) RankCtl {
  Counter in_step;   // chunks this rank has copied into its buffer
  Counter red_step;  // chunks whose reduced slice this rank has written to its buffer (all_reduce)
  Counter out_step;  // chunks this rank has finished reading from its peers' buffers
  // The signature of a collective, posted with its first chunk (by collective parity: a rank writes
  // the next-but-one only once every peer is done with this one's first chunk, so with it).
  long long sig[2][kNumSig];
  // Single copy (cross-memory attach): this rank's pid, and where the tensor its peers read in the
  // current single-copy collective lies in its own address space (a broadcast's root tensor, an
  // all_gather's or reduce_scatter's input; published by in_step).
  std::int64_t pid;
  std::uint64_t src_addr;
  // A reduce_scatter whose input lies in node-shared memory (node_shared.h): where, as (key, offset),
  // so the peers read it in place; key 0 when it goes through this rank's buffers. By collective
  // parity, like sig, and published with the first chunk.
  std::uint64_t in_key[2], in_off[2];
};

std::atomic<std::uint64_t> g_read_in_place{0};
std::atomic<std::uint64_t> g_read_from_peer_memory{0};

constexpr int kBuffers = 2;
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

// The mapping: `size` control blocks, then each rank's two chunk buffers.
class Segment {
 public:
  Segment(void* base, std::size_t bytes, int size, std::size_t chunk)
      : base_(static_cast<char*>(base)), bytes_(bytes), size_(size), chunk_(chunk) {}
  ~Segment() { munmap(base_, bytes_); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  static std::size_t ctl_bytes(int size) { return (size * sizeof(RankCtl) + 4095) / 4096 * 4096; }
  static std::size_t total_bytes(int size, std::size_t chunk) {
    return ctl_bytes(size) + static_cast<std::size_t>(size) * kBuffers * chunk;
  }
  RankCtl& ctl(int r) { return reinterpret_cast<RankCtl*>(base_)[r]; }
  char* buf(int r, int b) { return base_ + ctl_bytes(size_) + (static_cast<std::size_t>(r) * kBuffers + b) * chunk_; }
  std::size_t chunk() const { return chunk_; }

 private:
  char* base_;
  std::size_t bytes_;
  int size_;
  std::size_t chunk_;
};

enum class Phase : std::uint8_t { In, Reduce, Out };

// memcpy that accepts empty copies from empty (null) tensors.
inline void copy_bytes(void* dst, const void* src, std::int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n));
}

struct ShmOp {
  Request req;
  bool started = false;
  std::uint64_t seq = 0, g0 = 0;
  // count and unit (per chunk): elements for all_reduce and reduce_scatter (of the output), bytes
  // for all_gather (of the input) and broadcast.
  std::int64_t esize = 1, count = 0, unit = 1, nchunks = 0;
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
  bool progress() {
    std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
    if (!lk.owns_lock()) return false;
    bool moved = false;
    while (!q_.empty()) {
      ShmOp& op = *q_.front();
      bool done = false;
      std::exception_ptr err;
      try {
        done = run(op, moved);
      } catch (...) {
        err = std::current_exception();
        done = true;
      }
      if (!done) break;
      std::unique_ptr<ShmOp> owned = std::move(q_.front());
      q_.pop_front();
      // Drop every tensor reference before the Work wakes its waiter (see Work::finish).
      WorkPtr work = std::move(owned->req.work);
      owned.reset();
      work->finish(err);
      moved = true;
    }
    if (moved) detail::note_progress();
    return moved;
  }

 private:
  bool all_at_least(Counter RankCtl::*c, std::uint64_t v) {
    for (int j = 0; j < size_; ++j)
      if ((seg_->ctl(j).*c).load(std::memory_order_acquire) < v) return false;
    return true;
  }

  void plan(ShmOp& op) {
    const Request& r = op.req;
    const auto chunk = static_cast<std::int64_t>(seg_->chunk());
    bool two_phase_reduce = false;
    switch (r.kind) {
      case Collective::AllReduce:
        op.esize = static_cast<std::int64_t>(r.input.element_size());
        op.count = r.input.numel();
        op.unit = std::max<std::int64_t>(1, chunk / op.esize);
        // Two ranks, or a small message: each rank copies whole chunks in and reduces them all
        // itself (in rank order, so every rank gets the same bits). One round of peers instead of
        // two, and for two ranks no more traffic than slicing. Otherwise each rank reduces 1/N.
        op.direct = size_ == 2 || op.count * op.esize <= kDirectBytes;
        two_phase_reduce = !op.direct;
        break;
      case Collective::ReduceScatter:
        op.esize = static_cast<std::int64_t>(r.input.element_size());
        op.count = r.output.numel();
        op.unit = std::max<std::int64_t>(1, chunk / (op.esize * size_));
        if (!r.check_only) {
          const SharedLocation at = find_node_shared(r.input.data_ptr(), r.input.nbytes());
          op.in_key = at.key;
          op.in_off = at.offset;
        }
        break;
      case Collective::AllGather:
        op.count = static_cast<std::int64_t>(r.input.nbytes());
        op.unit = chunk;
        op.in_place = op.count > 0 && static_cast<const char*>(r.input.data_ptr()) ==
                                          static_cast<const char*>(r.output.data_ptr()) + rank_ * op.count;
        break;
      case Collective::Broadcast:
        op.count = static_cast<std::int64_t>(r.output.nbytes());
        op.unit = chunk;
        break;
      case Collective::Barrier: op.count = 0; break;
    }
    if (r.check_only) op.count = 0;
    // Bytes each rank reads from each peer (the same on every rank unless the collective mismatches,
    // which the first read's signature check catches on every rank whatever the path).
    const std::int64_t per_peer = r.kind == Collective::ReduceScatter ? op.count * op.esize : op.count;
    if (single_copy_ && !r.check_only &&
        ((r.kind == Collective::Broadcast && op.count >= kSingleCopyBytes) ||
         ((r.kind == Collective::AllGather || r.kind == Collective::ReduceScatter) && single_copy_bytes_ > 0 &&
          per_peer >= single_copy_bytes_))) {
      // One pseudo-chunk: post the address (In), read the peers' memory (Out), then wait until
      // every peer is done reading mine (Reduce) before the caller gets its tensor back.
      op.single_copy = true;
      op.nchunks = 1;
      op.steps = {{Phase::In, 0}, {Phase::Out, 0}, {Phase::Reduce, 0}};
      return;
    }
    // At least one chunk, even empty: the first chunk carries the signature (and makes a barrier).
    op.nchunks = std::max<std::int64_t>(1, (op.count + op.unit - 1) / op.unit);
    // Chunk t+1 is copied in before chunk t is finished, so peers reduce or read t meanwhile; but not
    // before the first chunk's signatures are compared, which leaves the counters alike on every rank
    // whatever the others' sizes (a mismatch consumes exactly one chunk everywhere).
    const Phase second = r.kind == Collective::ReduceScatter || op.direct ? Phase::Reduce : Phase::Out;
    op.steps.reserve(3 * op.nchunks + 2);
    op.steps.emplace_back(Phase::In, 0);
    if (two_phase_reduce) op.steps.emplace_back(Phase::Reduce, 0);  // compares the signatures
    for (std::int64_t t = 0; t < op.nchunks; ++t) {
      if (t + 1 < op.nchunks && (two_phase_reduce || t > 0)) op.steps.emplace_back(Phase::In, t + 1);
      op.steps.emplace_back(second, t);  // (t = 0, not all_reduce: compares the signatures)
      if (!two_phase_reduce && t == 0 && op.nchunks > 1) op.steps.emplace_back(Phase::In, 1);
      if (two_phase_reduce && t + 1 < op.nchunks) op.steps.emplace_back(Phase::Reduce, t + 1);
    }
    if (op.zero_copy()) {
      // Nothing to copy in: chunk 0's In posts the signature, the first Reduce posts every chunk at
      // once (see step), and a last step waits until the peers are done reading my input.
      op.steps.clear();
      op.steps.emplace_back(Phase::In, 0);
      for (std::int64_t t = 0; t < op.nchunks; ++t) op.steps.emplace_back(Phase::Reduce, t);
      op.steps.emplace_back(Phase::Out, op.nchunks - 1);
    }
  }

  // True when the collective is finished; false when it waits for a peer (or a dependency).
  bool run(ShmOp& op, bool& moved) {
    if (!op.started) {
      bool ready = true;
      if (auto e = dependency_error(op.req, ready)) std::rethrow_exception(e);
      if (!ready) return false;
      plan(op);
      op.seq = ++seq_;
      op.g0 = chunks_;
      op.started = true;
    }
    while (op.pos < op.steps.size()) {
      if (!step(op, op.steps[op.pos].first, op.steps[op.pos].second)) return false;
      ++op.pos;
      moved = true;
    }
    chunks_ = op.g0 + static_cast<std::uint64_t>(op.nchunks);
    if (op.req.then) op.req.then();
    return true;
  }

  // A large broadcast, all_gather or reduce_scatter, one copy: each rank pulls its peers' bytes
  // itself, at its own pace (no chunk-by-chunk lock-step with them), and returns once its peers are
  // done reading its own.
  bool single_copy_step(ShmOp& op, Phase ph, std::uint64_t g, char* out) {
    const Request& r = op.req;
    RankCtl& ctl = seg_->ctl(rank_);
    const bool bcast = r.kind == Collective::Broadcast;
    if (ph == Phase::In) {
      const char* in = bcast ? out : static_cast<const char*>(r.input.data_ptr());
      ctl.src_addr = reinterpret_cast<std::uint64_t>(in);
      if (r.kind == Collective::ReduceScatter) {  // (a node-shared input is read where it lies)
        ctl.in_key[op.seq & 1] = op.in_key;
        ctl.in_off[op.seq & 1] = op.in_off;
      }
      if (r.kind == Collective::AllGather && !op.in_place) copy_bytes(out + rank_ * op.count, in, op.count);
      ctl.in_step.store(g, std::memory_order_release);
    } else if (ph == Phase::Out) {  // (after the signatures were compared)
      if (r.kind == Collective::AllGather) {
        for (int j = 0; j < size_; ++j)
          if (j != rank_) read_peer(j, out + j * op.count, op.count);
      } else if (r.kind == Collective::ReduceScatter) {
        reduce_scatter_from_peers(op, out);
      } else if (rank_ != r.root) {
        read_peer(r.root, out, op.count);
      }
      ctl.out_step.store(g, std::memory_order_release);
    } else {
      if (!all_at_least(&RankCtl::out_step, g)) return false;  // nobody reads my tensor any more
    }
    return true;
  }

  // reduce_scatter, single copy: my slice of every rank's input, reduced in rank order (the chunked
  // path's order, so the same bits) a chunk at a time: my own input where it lies, each peer's read
  // where it lies in node-shared memory, or else into scratch from the peer's memory.
  void reduce_scatter_from_peers(ShmOp& op, char* out) {
    const Request& r = op.req;
    find_peer_inputs(op);
    const std::int64_t es = op.esize, k = op.count, me = rank_;
    const std::int64_t unit = std::max<std::int64_t>(1, static_cast<std::int64_t>(seg_->chunk()) / es);
    scratch_.resize(static_cast<std::size_t>(size_ * unit * es));
    const char* in = static_cast<const char*>(r.input.data_ptr());
    const void* srcs[64];
    std::uint64_t in_place = 0;
    for (std::int64_t off = 0; off < k; off += unit) {
      const std::int64_t c = std::min(unit, k - off), at = (me * k + off) * es;
      for (int j = 0; j < size_; ++j) {
        if (j == me) {
          srcs[j] = in + at;
        } else if (op.peer_in[j]) {
          srcs[j] = op.peer_in[j] + at;
          in_place += static_cast<std::uint64_t>(c * es);
        } else {
          char* dst = scratch_.data() + j * unit * es;
          read_peer(j, dst, c * es, static_cast<std::uint64_t>(at));
          srcs[j] = dst;
        }
      }
      reduce_into(out + off * es, nullptr, srcs, size_, c, r.input.scalar_type(), r.op,
                  r.op == ReduceOp::Avg ? size_ : 0);
    }
    if (in_place) g_read_in_place.fetch_add(in_place, std::memory_order_relaxed);
  }

  // process_vm_readv of n bytes at peer j's posted address (plus `at`) into dst.
  void read_peer(int j, char* dst, std::int64_t n, std::uint64_t at = 0) {
    const RankCtl& peer = seg_->ctl(j);
    std::int64_t done = 0;
    while (done < n) {
      iovec local{dst + done, static_cast<std::size_t>(n - done)};
      iovec remote{reinterpret_cast<void*>(peer.src_addr + at + static_cast<std::uint64_t>(done)),
                   static_cast<std::size_t>(n - done)};
      const ssize_t got = process_vm_readv(static_cast<pid_t>(peer.pid), &local, 1, &remote, 1, 0);
      if (got <= 0)
        throw CommError(
            fmt::format("shm: reading rank {}'s memory (process_vm_readv) failed: {}", j, std::strerror(errno)));
      done += got;
    }
    g_read_from_peer_memory.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
  }

  // Once every rank has posted its first chunk: compare the signatures (unless unchecked). On a
  // mismatch, every rank marks that one chunk consumed and raises, so the group stays usable.
  void verify_first_chunk(ShmOp& op, std::uint64_t g) {
    if (!check_ || op.req.skip_check) return;
    const int slot = static_cast<int>(op.seq & 1);
    const long long* mine = seg_->ctl(rank_).sig[slot];
    long long lo[kNumSig], hi[kNumSig];
    std::copy(mine, mine + kNumSig, lo);
    std::copy(mine, mine + kNumSig, hi);
    for (int j = 0; j < size_; ++j) {
      const long long* s = seg_->ctl(j).sig[slot];
      for (int f = 0; f < kNumSig; ++f) {
        lo[f] = std::min(lo[f], s[f]);
        hi[f] = std::max(hi[f], s[f]);
      }
    }
    try {
      verify_signature(mine, lo, hi, op.req.work->what(), rank_, size_);  // alike on every rank
    } catch (...) {
      RankCtl& me = seg_->ctl(rank_);
      me.red_step.store(g, std::memory_order_release);
      me.out_step.store(g, std::memory_order_release);
      chunks_ = g;
      throw;
    }
  }

  // reduce_scatter, at its first read (every peer's first chunk is posted): where each peer's input
  // lies in this process when that peer reads it in place from node-shared memory.
  void find_peer_inputs(ShmOp& op) {
    op.peer_in.assign(static_cast<std::size_t>(size_), nullptr);
    const int slot = static_cast<int>(op.seq & 1);
    for (int j = 0; j < size_; ++j) {
      const RankCtl& peer = seg_->ctl(j);
      if (j == rank_ || peer.in_key[slot] == 0) continue;
      op.peer_in[j] = node_shared_address(peer.in_key[slot], peer.in_off[slot], op.req.input.nbytes());
      if (!op.peer_in[j])
        throw CommError(fmt::format(
            "shm: rank {}'s reduce_scatter input lies in node-shared memory that rank {} does not map (create it "
            "with node_shared_empty on a group holding both, and keep it alive on every rank while it is used)",
            j, rank_));
    }
  }

  // One step of one chunk; false when a peer is not there yet.
  bool step(ShmOp& op, Phase ph, std::int64_t t) {
    const Request& r = op.req;
    const std::uint64_t g = op.g0 + static_cast<std::uint64_t>(t) + 1;  // this chunk's number in the group
    const int b = static_cast<int>(g % kBuffers);
    const std::int64_t off = t * op.unit, c = std::min(op.unit, op.count - off);
    const std::int64_t es = op.esize;
    const int n = size_, me = rank_;
    RankCtl& ctl = seg_->ctl(me);
    // Writing my buffer b again: every peer must be done reading it (the chunk before last).
    if (ph == Phase::In && g > kBuffers && !all_at_least(&RankCtl::out_step, g - kBuffers)) return false;
    if (ph == Phase::In && t == 0) make_signature(r, ctl.sig[op.seq & 1]);  // published by in_step
    // The first step reading peers' data: everyone's first chunk is in, so their signatures are.
    const bool first_read = t == 0 && ph != Phase::In && (ph == Phase::Reduce || r.kind != Collective::AllReduce);
    if (first_read) {
      if (!all_at_least(&RankCtl::in_step, g)) return false;
      verify_first_chunk(op, g);
    }
    const char* in = r.input.defined() ? static_cast<const char*>(r.input.data_ptr()) : nullptr;
    char* out = r.output.defined() ? static_cast<char*>(r.output.data_ptr()) : nullptr;
    const void* srcs[64];
    if (op.single_copy) return single_copy_step(op, ph, g, out);
    switch (r.kind) {
      case Collective::AllReduce: {
        auto lo = [&](int j) { return c * j / n; };
        in += off * es;
        out += off * es;
        if (op.direct) {
          if (ph == Phase::In) {
            copy_bytes(seg_->buf(me, b), in, c * es);
            ctl.in_step.store(g, std::memory_order_release);
          } else {
            if (!all_at_least(&RankCtl::in_step, g)) return false;
            for (int j = 0; j < n; ++j) srcs[j] = j == me ? in : seg_->buf(j, b);
            reduce_into(out, nullptr, srcs, n, c, r.input.scalar_type(), r.op, r.op == ReduceOp::Avg ? n : 0);
            ctl.out_step.store(g, std::memory_order_release);
          }
          return true;
        }
        if (ph == Phase::In) {
          char* mine = seg_->buf(me, b);
          for (int j = 0; j < n; ++j)
            if (j != me) copy_bytes(mine + lo(j) * es, in + lo(j) * es, (lo(j + 1) - lo(j)) * es);
          ctl.in_step.store(g, std::memory_order_release);
        } else if (ph == Phase::Reduce) {
          if (!all_at_least(&RankCtl::in_step, g)) return false;
          for (int j = 0; j < n; ++j) srcs[j] = j == me ? in + lo(me) * es : seg_->buf(j, b) + lo(me) * es;
          // the reduced slice goes to the peers (my buffer) and to my output at once
          reduce_into(seg_->buf(me, b) + lo(me) * es, out + lo(me) * es, srcs, n, lo(me + 1) - lo(me),
                      r.input.scalar_type(), r.op, r.op == ReduceOp::Avg ? n : 0);
          ctl.red_step.store(g, std::memory_order_release);
        } else {
          if (!all_at_least(&RankCtl::red_step, g)) return false;
          for (int j = 0; j < n; ++j)
            if (j != me) copy_bytes(out + lo(j) * es, seg_->buf(j, b) + lo(j) * es, (lo(j + 1) - lo(j)) * es);
          ctl.out_step.store(g, std::memory_order_release);
        }
        return true;
      }
      case Collective::ReduceScatter: {
        const std::int64_t k = op.count;
        if (ph == Phase::In) {
          if (t == 0) {
            ctl.in_key[op.seq & 1] = op.in_key;
            ctl.in_off[op.seq & 1] = op.in_off;
          }
          char* mine = seg_->buf(me, b);
          if (!op.zero_copy())
            for (int j = 0; j < n; ++j)
              if (j != me) copy_bytes(mine + j * op.unit * es, in + (j * k + off) * es, c * es);
          ctl.in_step.store(g, std::memory_order_release);
        } else if (ph == Phase::Reduce) {
          if (!all_at_least(&RankCtl::in_step, g)) return false;
          if (t == 0) {
            find_peer_inputs(op);
            // Every rank's first chunk is posted and the signatures agree (checked above), so no rank
            // will treat this collective as a mismatch: my whole input can be posted now, and the
            // peers read it at their own pace instead of in lock-step with my progress.
            if (op.zero_copy())
              ctl.in_step.store(op.g0 + static_cast<std::uint64_t>(op.nchunks), std::memory_order_release);
          }
          std::uint64_t in_place = 0;
          for (int j = 0; j < n; ++j) {
            if (j == me)
              srcs[j] = in + (me * k + off) * es;
            else if (op.peer_in[j])
              srcs[j] = op.peer_in[j] + (me * k + off) * es;
            else
              srcs[j] = seg_->buf(j, b) + me * op.unit * es;
            if (j != me && op.peer_in[j]) in_place += static_cast<std::uint64_t>(c * es);
          }
          reduce_into(out + off * es, nullptr, srcs, n, c, r.input.scalar_type(), r.op, r.op == ReduceOp::Avg ? n : 0);
          ctl.out_step.store(g, std::memory_order_release);
          if (in_place) g_read_in_place.fetch_add(in_place, std::memory_order_relaxed);
        } else {  // (zero-copy input) every peer has reduced its last chunk: my input is mine again
          if (!all_at_least(&RankCtl::out_step, g)) return false;
        }
        return true;
      }
      case Collective::AllGather: {
        const std::int64_t k = op.count;
        if (ph == Phase::In) {
          copy_bytes(seg_->buf(me, b), in + off, c);
          if (!op.in_place) copy_bytes(out + me * k + off, in + off, c);
          ctl.in_step.store(g, std::memory_order_release);
        } else {
          if (!all_at_least(&RankCtl::in_step, g)) return false;
          for (int j = 0; j < n; ++j)
            if (j != me) copy_bytes(out + j * k + off, seg_->buf(j, b), c);
          ctl.out_step.store(g, std::memory_order_release);
        }
        return true;
      }
      case Collective::Broadcast: {
        const int root = r.root;
        if (ph == Phase::In) {
          if (me == root) copy_bytes(seg_->buf(root, b), out + off, c);
          ctl.in_step.store(g, std::memory_order_release);
        } else {
          if (seg_->ctl(root).in_step.load(std::memory_order_acquire) < g) return false;
          if (me != root) copy_bytes(out + off, seg_->buf(root, b), c);
          ctl.out_step.store(g, std::memory_order_release);
        }
        return true;
      }
      case Collective::Barrier:
        if (ph == Phase::In) {
          ctl.in_step.store(g, std::memory_order_release);
        } else {
          ctl.out_step.store(g, std::memory_order_release);  // everyone arrived (first_read above)
        }
        return true;
    }
    return true;
  }

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

// The process's shm progress thread: moves the groups that have collectives queued while their
// callers compute. Spins briefly, then yields, then sleeps between polls (ranks may outnumber cores).
class ShmEngine {
 public:
  static ShmEngine& get() {
    static ShmEngine engine;
    return engine;
  }

  void activate(const std::shared_ptr<ShmGroup>& g) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (std::find(active_.begin(), active_.end(), g) == active_.end()) active_.push_back(g);
      ++generation_;
    }
    cv_.notify_one();
  }

 private:
  ShmEngine() : thread_([this] { loop(); }) {}
  ~ShmEngine() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  static constexpr int kYieldPolls = 2000;

  void loop() {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    using Clock = std::chrono::steady_clock;
    Clock::time_point stop_deadline{};
    std::vector<std::shared_ptr<ShmGroup>> groups;
    int empty_polls = 0;
    unsigned turns = 0;
    Clock::time_point idle_since = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        active_.erase(std::remove_if(active_.begin(), active_.end(), [](const auto& g) { return g->idle(); }),
                      active_.end());
        if (stop_) {
          // At exit: finish what peers may be waiting for, but never longer than one timeout.
          if (stop_deadline == Clock::time_point{}) stop_deadline = Clock::now() + default_timeout();
          if (active_.empty() || MpiBackend::is_broken()) return;
          if (Clock::now() > stop_deadline) {
            MpiBackend::mark_broken();  // MPI aborts the job instead of finalizing
            return;
          }
        } else if (active_.empty()) {
          cv_.wait(lk, [&] { return stop_ || !active_.empty(); });
          empty_polls = 0;
          idle_since = Clock::now();
          continue;
        }
        groups = active_;
      }
      bool moved = false;
      for (auto& g : groups) moved |= g->progress();
      groups.clear();
      if (moved) {
        empty_polls = 0;
        idle_since = Clock::now();
      } else if (Clock::now() - idle_since < detail::spin_before_yield()) {
        detail::spin_turn(turns);  // hot
      } else if (++empty_polls > kYieldPolls) {
        std::unique_lock<std::mutex> lk(mu_);
        const std::uint64_t gen = generation_;
        if (cv_.wait_for(lk, std::chrono::microseconds(20), [&] { return stop_ || generation_ != gen; })) {
          empty_polls = 0;  // a new collective: poll hot again
          idle_since = Clock::now();
        }
      } else {
        sched_yield();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::uint64_t generation_ = 0;  // bumped by every activate(), so a new collective cuts a sleep short
  std::vector<std::shared_ptr<ShmGroup>> active_;
  std::thread thread_;
};

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
    op->req = std::move(r);
    g_->push(std::move(op));
    if (inline_progress)
      g_->progress();  // the caller is about to wait anyway: no thread hand-off for small messages
    else
      ShmEngine::get().activate(g_);
  }

 private:
  std::shared_ptr<ShmGroup> g_;
};

std::atomic<int> g_segments{0};

}  // namespace

std::uint64_t shm_bytes_read_in_place() { return g_read_in_place.load(std::memory_order_relaxed); }
std::uint64_t shm_bytes_read_from_peer_memory() { return g_read_from_peer_memory.load(std::memory_order_relaxed); }

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
