// ShmGroup (group.h): planning a collective into steps, and each step, chunked or single copy.
#include "comm/transport/shm/group.h"

#include "comm/signature.h"
#include "comm/transport/shm/node_shared.h"
#include "comm/transport/shm/shm_reduce.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <sys/uio.h>

namespace accel::comm::shm {
namespace {

std::atomic<std::uint64_t> g_read_in_place{0};
std::atomic<std::uint64_t> g_read_from_peer_memory{0};

// memcpy that accepts empty copies from empty (null) tensors.
inline void copy_bytes(void* dst, const void* src, std::int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n));
}

}  // namespace

std::uint64_t bytes_read_in_place() { return g_read_in_place.load(std::memory_order_relaxed); }
std::uint64_t bytes_read_from_peer_memory() { return g_read_from_peer_memory.load(std::memory_order_relaxed); }

// Moves the queued collectives as far as the peers allow, in issue order; true when anything
// moved. Never waits for a peer; skips (false) when another thread is moving this group.
bool ShmGroup::progress() {
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

namespace {
// A process's state from /proc/PID/stat: "stopped" (SIGSTOP, a debugger), "gone", or "" (running, sleeping).
std::string process_state(std::int64_t pid) {
  std::FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (!f) return "gone";
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close = static_cast<const char*>(std::memchr(buf, ')', n));  // after "PID (comm)"
  const char state = close && close + 2 < buf + n ? close[2] : '?';
  if (state == 'T' || state == 't') return "stopped (SIGSTOP or a debugger)";
  if (state == 'Z' || state == 'X') return "gone";
  return "";
}
}  // namespace

std::string ShmGroup::peers_behind() {
  auto progress_of = [&](int j) {
    const RankCtl& c = seg_->ctl(j);
    return c.in_step.load(std::memory_order_acquire) + c.red_step.load(std::memory_order_acquire) +
           c.out_step.load(std::memory_order_acquire);
  };
  std::uint64_t furthest = 0;
  for (int j = 0; j < size_; ++j) furthest = std::max(furthest, progress_of(j));
  std::string behind, odd;
  int n_behind = 0, n_odd = 0;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    const RankCtl& c = seg_->ctl(j);
    const std::string state = process_state(c.pid);
    const std::string who = fmt::format("rank {} (pid {}{}{})", c.world_rank, c.pid, state.empty() ? "" : ", ", state);
    if (progress_of(j) < furthest) {
      behind += (n_behind++ ? ", " : "") + who;
    } else if (!state.empty()) {
      odd += (n_odd++ ? ", " : "") + who;
    }
  }
  if (n_behind) return behind + (n_behind > 1 ? " have" : " has") + " not joined it (the ranks waiting are further on)";
  if (n_odd) return odd + (n_odd > 1 ? " are" : " is") + " not running";
  return "";
}

bool ShmGroup::all_at_least(Counter RankCtl::*c, std::uint64_t v) {
  for (int j = 0; j < size_; ++j)
    if ((seg_->ctl(j).*c).load(std::memory_order_acquire) < v) return false;
  return true;
}

void ShmGroup::plan(ShmOp& op) {
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
      op.oesize = static_cast<std::int64_t>(r.output.element_size());
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
bool ShmGroup::run(ShmOp& op, bool& moved) {
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
bool ShmGroup::single_copy_step(ShmOp& op, Phase ph, std::uint64_t g, char* out) {
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
void ShmGroup::reduce_scatter_from_peers(ShmOp& op, char* out) {
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
    reduce_into(out + off * op.oesize, nullptr, srcs, size_, c, r.input.scalar_type(), r.op,
                r.op == ReduceOp::Avg ? size_ : 0, r.output.scalar_type());
  }
  if (in_place) g_read_in_place.fetch_add(in_place, std::memory_order_relaxed);
}

// process_vm_readv of n bytes at peer j's posted address (plus `at`) into dst.
void ShmGroup::read_peer(int j, char* dst, std::int64_t n, std::uint64_t at) {
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
void ShmGroup::verify_first_chunk(ShmOp& op, std::uint64_t g) {
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
void ShmGroup::find_peer_inputs(ShmOp& op) {
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
bool ShmGroup::step(ShmOp& op, Phase ph, std::int64_t t) {
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
        reduce_into(out + off * op.oesize, nullptr, srcs, n, c, r.input.scalar_type(), r.op,
                    r.op == ReduceOp::Avg ? n : 0, r.output.scalar_type());
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

}  // namespace accel::comm::shm
