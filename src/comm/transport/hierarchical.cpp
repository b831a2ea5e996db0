// Hierarchical collectives for groups spanning nodes, and the choice of a group's CPU transport.
// A collective becomes a chain of steps on the node group (shared memory) and the cross-node group
// (MPI), each started when the one before finished (Request::after); the whole group's arguments are
// checked once first (a check_only request on the group's MPI transport, which also waits for the
// caller's `ready`), so a mismatch still raises on every rank. Nothing is read or written at enqueue:
// staging copies run as their step starts, result copies in `then`s before the caller's own. Where
// each node's ranks are one run in group order (the usual placement), the chain works in the caller's
// tensors but for a block of 1/L of the data (L ranks per node) between the node and cross-node steps;
// otherwise reduce_scatter and all_gather stage the whole tensor in a node-major layout. 16-bit floats
// are summed in fp32 through the chain (the node sums written unrounded) and rounded once.
#include "comm/transport/hierarchical.h"

#include "base/env.h"
#include "comm/dtype.h"
#include "comm/transport/mpi/mpi_backend.h"
#include "comm/transport/shm/shm_backend.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace accel::comm {
namespace {

// An all_gather across nodes of at least this much output goes node by node, straight into the
// output; a smaller one through one node-major staging copy: one node collective instead of one per
// node. At 2 x 2 simulated ranks (4 ranks on 2 cores, fp32, µs per call, staged / node by node): 512 KiB
// 191-283 / 309-334, 1 MiB 569-652 / 409-419, 2 MiB 921-1927 / 433-725 (the measurements: docs/design.md,
// "Hierarchical"). reduce_scatter has no such crossover there (32 KiB 113-136 / 110-118), so it always
// goes node by node.
constexpr std::int64_t kPerNodeGatherBytes = 1 << 20;

class HierBackend final : public Backend {
 public:
  // l_of/m_of: each group rank's index within its node and its node's index.
  HierBackend(MpiBackend& group, std::unique_ptr<MpiBackend> node_mpi, std::unique_ptr<MpiBackend> cross_mpi,
              std::unique_ptr<Backend> node, std::vector<int> l_of, std::vector<int> m_of, int L, int M)
      : group_(group),
        node_mpi_(std::move(node_mpi)),
        cross_mpi_(std::move(cross_mpi)),
        node_(std::move(node)),
        l_of_(std::move(l_of)),
        m_of_(std::move(m_of)),
        L_(L),
        M_(M) {
    rank_ = group_.rank();
    size_ = group_.size();
    l_ = l_of_[rank_];
    m_ = m_of_[rank_];
    // Whether each node's ranks form one run in group order (the usual placement, and simulated
    // nodes): then a node's chunks lie side by side and need no staging copy.
    first_of_node_.assign(M_, -1);
    for (int q = 0; q < size_; ++q)
      if (first_of_node_[m_of_[q]] < 0) first_of_node_[m_of_[q]] = q;
    // Each group rank's place in the node-major staging layout: [index in node][node].
    for (int q = 0; q < size_; ++q) slot_of_.push_back(static_cast<std::int64_t>(l_of_[q]) * M_ + m_of_[q]);
    contiguous_nodes_ = true;
    for (int q = 0; q < size_; ++q) contiguous_nodes_ = contiguous_nodes_ && q == first_of_node_[m_of_[q]] + l_of_[q];
  }
  ~HierBackend() override {
    node_.reset();  // before the MPI group it was set up over
  }

  const char* name() const override { return "shm+mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void enqueue(Request r) override {
    if (r.kind == Collective::Barrier) {
      group_.enqueue(std::move(r));
      return;
    }
    // The whole group's check first; every step after it skips its own. It also waits for the
    // caller's `ready` (a staging copy from a GPU landing), so that no step reads the input sooner.
    Request c;
    c.kind = r.kind;
    c.input = r.input;
    c.output = r.output;
    c.op = r.op;
    c.root = r.root;
    c.check_only = true;
    c.ready = std::move(r.ready);  // (polled there only, on one thread; every step comes after it)
    r.ready = nullptr;
    c.work = step_work(r);
    WorkPtr prev = c.work;
    group_.enqueue(std::move(c));

    const bool half = classify(r.input.scalar_type()) == DtypeClass::HalfFloat;
    const bool avg = r.op == ReduceOp::Avg;
    const ReduceOp step_op = avg ? ReduceOp::Sum : r.op;
    const at::ScalarType acc = half ? at::kFloat : r.input.scalar_type();
    const int N = size_;
    at::Tensor in = r.input.reshape({-1}), out = r.output.reshape({-1});
    // Runs f once the last step moved its data, before the caller's own `then` (a copy back to a GPU).
    auto finally = [&r](std::function<void()> f) {
      r.then = [f = std::move(f), user = std::move(r.then)] {
        f();
        if (user) user();
      };
    };
    // Nothing is read or written at enqueue: every copy is a step's or a `then`, after the ones before.
    switch (r.kind) {
      case Collective::AllReduce: {
        const std::int64_t n = in.numel(), k = (n + L_ - 1) / L_;
        if (k * L_ == n) {
          // The output's own slice is this rank's part, which the node all-gather spreads in place.
          // fp32 and wider: the node reduce-scatter reads the input into that slice; 16-bit floats:
          // into an fp32 one (the node sums unrounded), rounded once into the output's.
          at::Tensor mine = out.narrow(0, l_ * k, k);
          if (!half) {
            prev = step(*node_, Collective::ReduceScatter, in, mine, step_op, 0, prev, r);
            prev = step(*cross_mpi_, Collective::AllReduce, mine, mine, step_op, 0, prev, r,
                        avg ? std::function<void()>([mine, N] { mine.div_(N); }) : nullptr);
          } else {
            at::Tensor wide = at::empty({k}, in.options().dtype(acc));
            prev = step(*node_, Collective::ReduceScatter, in, wide, step_op, 0, prev, r);
            prev = step(*cross_mpi_, Collective::AllReduce, wide, wide, step_op, 0, prev, r,
                        [wide, mine, avg, N] { mine.copy_(avg ? wide.div(N) : wide); });
          }
          last(*node_, Collective::AllGather, mine, out, step_op, 0, prev, std::move(r));
          break;
        }
        // Padded to a multiple of L, staged (fp32 for 16-bit floats), copied out at the end.
        at::Tensor tmp = at::zeros({L_ * k}, in.options().dtype(acc));
        at::Tensor mine = tmp.narrow(0, l_ * k, k);
        prev = step(*node_, Collective::ReduceScatter, tmp, mine, step_op, 0, prev, r, nullptr,
                    [tmp, in, n] { tmp.narrow(0, 0, n).copy_(in); });
        prev = step(*cross_mpi_, Collective::AllReduce, mine, mine, step_op, 0, prev, r);
        finally([tmp, out, n, avg, N] {
          at::Tensor v = tmp.narrow(0, 0, n);
          out.copy_(avg ? v.div(N) : v);
        });
        last(*node_, Collective::AllGather, mine, tmp, step_op, 0, prev, std::move(r));
        break;
      }
      case Collective::ReduceScatter: {
        const std::int64_t k = out.numel();
        if (contiguous_nodes_) {
          // Each node's ranks hold one run of chunks: one node reduce-scatter per node, read where
          // the input lies, into that node's place in `block` (fp32 for 16-bit floats, unrounded):
          // the node sums of this rank's index in every node, the cross-node reduce-scatter's input.
          at::Tensor block = at::empty({M_ * k}, in.options().dtype(acc));
          for (int m = 0; m < M_; ++m)
            prev = step(*node_, Collective::ReduceScatter, in.narrow(0, first_of_node_[m] * k, L_ * k),
                        block.narrow(0, m * k, k), step_op, 0, prev, r);
          if (!half) {
            if (avg) finally([out, N] { out.div_(N); });
            last(*cross_mpi_, Collective::ReduceScatter, block, out, step_op, 0, prev, std::move(r));
          } else {
            at::Tensor mine = block.narrow(0, m_ * k, k);
            finally([block, mine, out, avg, N] { out.copy_(avg ? mine.div(N) : mine); });
            last(*cross_mpi_, Collective::ReduceScatter, block, mine, step_op, 0, prev, std::move(r));
          }
          break;
        }
        // Staged in the layout [index in node][node] (fp32 for 16-bit floats): this rank's block is
        // where the node reduce-scatter puts it.
        at::Tensor tmp = at::empty({N * k}, in.options().dtype(acc));
        at::Tensor block = tmp.narrow(0, l_ * M_ * k, M_ * k), mine = block.narrow(0, m_ * k, k);
        prev = step(*node_, Collective::ReduceScatter, tmp, block, step_op, 0, prev, r, nullptr,
                    [tmp, in, k, slots = slot_of_] {
                      for (std::size_t q = 0; q < slots.size(); ++q)
                        tmp.narrow(0, slots[q] * k, k).copy_(in.narrow(0, static_cast<std::int64_t>(q) * k, k));
                    });
        finally([mine, out, avg, N] { out.copy_(avg ? mine.div(N) : mine); });
        last(*cross_mpi_, Collective::ReduceScatter, block, mine, step_op, 0, prev, std::move(r));
        break;
      }
      case Collective::AllGather: {
        const std::int64_t k = in.numel();
        // (Below kPerNodeGatherBytes of output, one node all-gather and a staging copy are faster than
        // one node all-gather per node: see the constant.)
        if (contiguous_nodes_ && static_cast<std::int64_t>(out.nbytes()) >= kPerNodeGatherBytes) {
          // block: the input of this rank's index in every node, node by node; then one node
          // all-gather per node, straight into that node's run of the output.
          at::Tensor block = at::empty({M_ * k}, in.options());
          prev = step(*cross_mpi_, Collective::AllGather, in, block, ReduceOp::Sum, 0, prev, r);
          for (int m = 0; m + 1 < M_; ++m)
            prev = step(*node_, Collective::AllGather, block.narrow(0, m * k, k),
                        out.narrow(0, first_of_node_[m] * k, L_ * k), ReduceOp::Sum, 0, prev, r);
          last(*node_, Collective::AllGather, block.narrow(0, (M_ - 1) * k, k),
               out.narrow(0, first_of_node_[M_ - 1] * k, L_ * k), ReduceOp::Sum, 0, prev, std::move(r));
          break;
        }
        // Staged in the layout [index in node][node], then copied out in rank order.
        at::Tensor tmp = at::empty({N * k}, in.options());
        at::Tensor block = tmp.narrow(0, l_ * M_ * k, M_ * k);
        prev = step(*cross_mpi_, Collective::AllGather, in, block, ReduceOp::Sum, 0, prev, r);
        finally([tmp, out, k, slots = slot_of_] {
          for (std::size_t q = 0; q < slots.size(); ++q)
            out.narrow(0, static_cast<std::int64_t>(q) * k, k).copy_(tmp.narrow(0, slots[q] * k, k));
        });
        last(*node_, Collective::AllGather, block, tmp, ReduceOp::Sum, 0, prev, std::move(r));
        break;
      }
      case Collective::Broadcast: {
        const int lr = l_of_[r.root], mr = m_of_[r.root];
        if (l_ == lr) prev = step(*cross_mpi_, Collective::Broadcast, out, out, ReduceOp::Sum, mr, prev, r);
        last(*node_, Collective::Broadcast, out, out, ReduceOp::Sum, lr, prev, std::move(r));
        break;
      }
      case Collective::Barrier: break;
    }
  }

 private:
  WorkPtr step_work(const Request& r) const {
    return std::make_shared<Work>(r.work->what(), rank_, size_, Duration(0));
  }

  // `then`: runs once this step's data moved, before the next step starts. `first`: runs once the
  // step before has finished, before this one moves anything (a staging copy of the caller's input),
  // on the thread that moves this step: for a node step, the shm progress thread, which moves no
  // other group meanwhile (a copy of memory already allocated; should it throw, this rank's step
  // fails and its node peers wait for it until their timeout).
  WorkPtr step(Backend& b, Collective kind, const at::Tensor& in, const at::Tensor& out, ReduceOp op, int root,
               const WorkPtr& after, const Request& user, std::function<void()> then = nullptr,
               std::function<void()> first = nullptr) {
    Request q;
    q.work = step_work(user);
    q.then = std::move(then);
    if (first)
      q.ready = [after, first = std::move(first), done = std::make_shared<bool>(false)] {
        if (!*done) {
          if (!after->finished()) return false;
          if (!after->exception()) first();  // (a failed one fails this step: nothing to stage)
          *done = true;
        }
        return true;
      };
    WorkPtr w = q.work;
    last(b, kind, in, out, op, root, after, std::move(q));
    return w;
  }

  // The chain's last step finishes the caller's Work (and runs its `then`); step() makes the others.
  void last(Backend& b, Collective kind, const at::Tensor& in, const at::Tensor& out, ReduceOp op, int root,
            const WorkPtr& after, Request user) {
    user.kind = kind;
    user.input = in;
    user.output = out;
    user.op = op;
    user.root = root;
    user.skip_check = true;
    user.caller_waits = false;
    user.after = {after};
    b.enqueue(std::move(user));
  }

  MpiBackend& group_;
  std::unique_ptr<MpiBackend> node_mpi_, cross_mpi_;
  std::unique_ptr<Backend> node_;
  std::vector<int> l_of_, m_of_;
  int L_, M_, l_ = 0, m_ = 0, rank_ = 0, size_ = 1;
  std::vector<std::int64_t> first_of_node_;  // each node's first group rank
  std::vector<std::int64_t> slot_of_;        // each group rank's chunk in the node-major staging layout
  bool contiguous_nodes_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_transport(MpiBackend& group, const Topology& topo) {
  const int n = group.size(), rank = group.rank();
  if (n == topo.world_size) {
    // Ranks on this machine against the cores this process may run on: with a core each, waiters
    // poll hot for a while (peers answer within microseconds); oversubscribed, they yield at once.
    // (The machine's CPUs, not this rank's affinity: a launcher may bind each rank to its own core.)
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const int here = topo.ranks_on_this_machine();
    detail::set_spin_before_yield(std::chrono::microseconds(here <= cores ? 50 : 5), here <= cores);
  }
  if (n == 1) return nullptr;
  // Every rank's node and wish, so that all ranks decide alike.
  int mine[2] = {topo.node_rank, env::get_int("ACCEL_COMM_SHM") != 0 ? 1 : 0};
  std::vector<int> all(2 * n);
  group.allgather_bytes(mine, sizeof mine, all.data());
  std::vector<int> nodes;
  bool wanted = true;
  for (int q = 0; q < n; ++q) {
    nodes.push_back(all[2 * q]);
    wanted = wanted && all[2 * q + 1] != 0;
  }
  if (!wanted) return nullptr;
  std::vector<int> distinct = nodes;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const int M = static_cast<int>(distinct.size());
  if (M == 1) return make_shm_backend(group);
  std::vector<int> l_of(n), m_of(n), per_node(M, 0);
  for (int q = 0; q < n; ++q) {
    m_of[q] = static_cast<int>(std::lower_bound(distinct.begin(), distinct.end(), nodes[q]) - distinct.begin());
    l_of[q] = per_node[m_of[q]]++;
  }
  const int L = per_node[0];
  if (L == 1 || std::any_of(per_node.begin(), per_node.end(), [&](int c) { return c != L; })) return nullptr;
  auto node_mpi = group.split(m_of[rank], rank);
  auto cross_mpi = group.split(l_of[rank], m_of[rank]);
  auto node = make_shm_backend(*node_mpi);
  // Shared memory may fail on one node only: the group takes the hierarchical path on all or none.
  int ok = node != nullptr;
  std::vector<int> oks(n);
  group.allgather_bytes(&ok, sizeof ok, oks.data());
  if (std::find(oks.begin(), oks.end(), 0) != oks.end()) return nullptr;
  return std::make_unique<HierBackend>(group, std::move(node_mpi), std::move(cross_mpi), std::move(node),
                                       std::move(l_of), std::move(m_of), L, M);
}

}  // namespace accel::comm
