// The CPU transport the communicator picks (shared memory within a node, hierarchical across simulated
// nodes, MPI when told so) and its collectives against closed forms: every reduce op and dtype at
// sizes spanning several chunks and not divisible by the world, in-place and aliasing forms, groups
// from split() (in rank orders that interleave the nodes), many collectives in flight on several
// groups at once, the time callers spend waiting, and reduce_scatter inputs in node-shared memory read
// in place by the peers, and the single-copy path (peers' memory read directly) against closed forms
// and the chunked path's bits. ctest runs it at np 1-4, under simulated nodes
// (ACCEL_RANKS_PER_NODE=2), with a 3 KiB chunk (ACCEL_COMM_SHM_CHUNK_KB=3) and with ACCEL_COMM_SHM=0.
#include "test_world.h"

#include "comm/dtype.h"
#include "comm/transport/backend.h"
#include "comm/transport/hierarchical.h"
#include "comm/transport/mpi/mpi_backend.h"
#include "comm/transport/shm/node_shared.h"
#include "comm/transport/shm/shm_backend.h"
#include "support/scoped_env.h"
#include "support/simulated_nodes.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <sys/uio.h>
#include <unistd.h>

using namespace accel::comm;
using accel::test::world;

namespace {

const std::vector<at::ScalarType> kShmReducible = {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf,
                                                   at::kInt,    at::kLong,  at::kByte};

// Element i's base value: small integers, exact in every dtype after the sums below.
at::Tensor pattern(int64_t k, int64_t shift = 0) { return at::arange(k, at::kLong).add(shift).remainder(5).add(1); }

void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  if (got.numel() == 0) return;
  at::Tensor g = got.to(at::kDouble).flatten(), w = want.to(at::kDouble).flatten();
  if (!at::equal(g, w)) {
    auto bad = (g != w).nonzero();
    int64_t i = bad[0].item<int64_t>();
    FAIL() << what << ": " << bad.size(0) << " of " << g.numel() << " elements differ; first at " << i << ": got "
           << g[i].item<double>() << ", want " << w[i].item<double>();
  }
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

// What the communicator must have picked for CPU tensors, from the topology alone.
// The transport of a group over nodes_spanned nodes with ranks_per_node of its ranks on each: shared
// memory within a node, MPI across nodes (hierarchical where each node holds as many of its ranks).
std::string expected_transport(Communicator& c, int nodes_spanned, int ranks_per_node) {
  if (c.size() == 1 || env_is("ACCEL_COMM_SHM", "0")) return "mpi";
  if (nodes_spanned == 1) return "shm";
  return ranks_per_node > 1 && accel::test::nodes_of_one_size(accel::test::simulated_node_sizes(world()->size()))
             ? "shm+mpi"
             : "mpi";
}

// Rank r's input (int64) and the result (fp64) of one collective over n ranks, k elements per rank:
// all_reduce: rank q holds p * (q+1); reduce_scatter: rank q holds p(j) * (q+1) + (j / k) at element j
// and rank r gets slice r; all_gather: rank q contributes p shifted by q, plus 10q; broadcast: rank q
// holds p shifted by q, plus q, and everyone gets root's.
struct ClosedForm {
  at::Tensor input, want;
};
ClosedForm closed_form(Collective kind, ReduceOp op, int n, int r, int64_t k, int root = 0) {
  switch (kind) {
    case Collective::AllReduce: {
      const double f = op == ReduceOp::Sum   ? n * (n + 1) / 2.0
                       : op == ReduceOp::Avg ? (n + 1) / 2.0
                       : op == ReduceOp::Max ? n
                                             : 1;
      return {pattern(k).mul(r + 1), pattern(k).to(at::kDouble).mul(f)};
    }
    case Collective::ReduceScatter: {
      at::Tensor in = pattern(n * k).mul(r + 1).add(at::arange(n * k, at::kLong).div(std::max<int64_t>(k, 1), "floor"));
      at::Tensor p = pattern(n * k).narrow(0, r * k, k).to(at::kDouble);
      at::Tensor want = op == ReduceOp::Sum   ? p.mul(n * (n + 1) / 2.0).add(n * r)
                        : op == ReduceOp::Max ? p.mul(n).add(r)
                                              : p.mul((n + 1) / 2.0).add(r);
      return {in, want};
    }
    case Collective::AllGather: {
      std::vector<at::Tensor> parts;
      for (int q = 0; q < n; ++q) parts.push_back(pattern(k, q).add(10 * q));
      return {pattern(k, r).add(10 * r), at::cat(parts).to(at::kDouble)};
    }
    default: return {pattern(k, r).add(r), pattern(k, root).add(root).to(at::kDouble)};
  }
}

// Every collective over `c` for one dtype and per-rank size k, against closed forms.
void check_collectives(Communicator& c, at::ScalarType d, int64_t k) {
  const int n = c.size(), r = c.rank();
  const auto o = at::TensorOptions().dtype(d);
  const bool integer = classify(d) == DtypeClass::Integer;
  const std::string tag = std::string(dtype_name(d)) + "[" + std::to_string(k) + "] n=" + std::to_string(n);
  for (bool in_place : {true, false}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      if (op == ReduceOp::Avg && integer) continue;
      const ClosedForm cf = closed_form(Collective::AllReduce, op, n, r, k);
      at::Tensor in = cf.input.to(d);
      at::Tensor out = in_place ? in : at::full({k}, 77, o);
      c.all_reduce(in, out, {op});
      expect_same(out, cf.want.to(d),
                  "all_reduce " + std::string(to_string(op)) + (in_place ? " in place " : " ") + tag);
      if (!in_place) expect_same(in, cf.input, "all_reduce input untouched " + tag);
    }
  }
  for (bool in_place : {true, false}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && integer) continue;
      const ClosedForm cf = closed_form(Collective::ReduceScatter, op, n, r, k);
      at::Tensor in = cf.input.to(d);
      at::Tensor out = in_place ? in.narrow(0, r * k, k) : at::full({k}, 77, o);
      c.reduce_scatter(in, out, {op});
      expect_same(out, cf.want.to(d),
                  "reduce_scatter " + std::string(to_string(op)) + (in_place ? " in place " : " ") + tag);
    }
  }
  // all_gather in place: the input is the output's own slice
  for (bool in_place : {true, false}) {
    const ClosedForm cf = closed_form(Collective::AllGather, ReduceOp::Sum, n, r, k);
    at::Tensor out = at::zeros({n * k}, o);
    at::Tensor in = in_place ? out.narrow(0, r * k, k) : at::empty({k}, o);
    in.copy_(cf.input.to(d));
    c.all_gather(in, out);
    expect_same(out, cf.want.to(d), std::string("all_gather") + (in_place ? " in place " : " ") + tag);
  }
  // broadcast from the last rank and from rank 0
  for (int root : {n - 1, 0}) {
    const ClosedForm cf = closed_form(Collective::Broadcast, ReduceOp::Sum, n, r, k, root);
    at::Tensor t = cf.input.to(d);
    c.broadcast(t, {root});
    expect_same(t, cf.want.to(d), "broadcast root " + std::to_string(root) + " " + tag);
  }
}

TEST(Shm, TransportInUse) {
  auto comm = world();
  const Topology& t = comm->topology();
  at::Tensor cpu = at::ones({1});
  EXPECT_EQ(comm->backend_name(cpu), expected_transport(*comm, t.num_nodes, t.local_world_size));
  // node-local groups are one node; cross-node groups hold one rank per node
  EXPECT_EQ(comm->node_local()->backend_name(cpu), expected_transport(*comm->node_local(), 1, t.local_world_size));
  EXPECT_EQ(comm->cross_node()->backend_name(cpu), expected_transport(*comm->cross_node(), t.num_nodes, 1));
}

// Shared-memory objects are named by rank 0 with its pid, a counter and a token random per process:
// pids repeat across PID namespaces that share one /dev/shm (containers), so the token is what keeps
// two jobs apart. Every rank's token differs from every other's, and the names have the form users
// see in /dev/shm.
TEST(ShmNames, CarryAPidAndATokenRandomPerProcess) {
  auto comm = world();
  const std::string name = shm_object_name("seg", 7);
  const std::string prefix = "/accel-seg-" + std::to_string(::getpid()) + "-";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  const std::string token = name.substr(prefix.size(), name.size() - prefix.size() - 2);
  EXPECT_EQ(name.substr(name.size() - 2), "-7") << name;
  ASSERT_EQ(token.size(), 16u) << name;
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << name;
  EXPECT_EQ(shm_object_name("ns", 0), "/accel-ns-" + std::to_string(::getpid()) + "-" + token + "-0");
  at::Tensor mine = at::from_blob(const_cast<char*>(token.data()), {16}, at::kByte).clone();
  at::Tensor all = at::empty({16 * comm->size()}, at::kByte);
  comm->all_gather(mine, all);
  for (int a = 0; a < comm->size(); ++a)
    for (int b = a + 1; b < comm->size(); ++b)
      EXPECT_FALSE(at::equal(all.narrow(0, 16 * a, 16), all.narrow(0, 16 * b, 16))) << "ranks " << a << ", " << b;
}

TEST(Shm, EveryDtypeAcrossChunks) {
  auto comm = world();
  // 300007 float32 = 1.2 MB per rank: several 256 KiB chunks, divisible by neither 2, 3 nor 4; 4100,
  // divisible by 2 and 4: across simulated nodes, the all_reduce the hierarchical transport runs in
  // place in the output (the others stage a padded copy)
  for (at::ScalarType d : kShmReducible)
    for (int64_t k : {int64_t(0), int64_t(1), int64_t(3), int64_t(4099), int64_t(4100), int64_t(300007)}) {
      check_collectives(*comm, d, k);
      if (::testing::Test::HasFailure()) return;
    }
}

TEST(Shm, SixteenBitSumsRoundOnce) {
  // 1 and 1 + ulp(1) alternating over ranks: the partial sums need more bits than the dtype has; the
  // exact total rounded once is what fp32 accumulation gives (and what the MPI path gives).
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (at::ScalarType d : {at::kBFloat16, at::kHalf}) {
    const double eps = d == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
    at::Tensor t = at::full({4099}, 1.0 + eps * (r % 2), at::kDouble).to(d);
    at::Tensor exact = at::zeros({4099}, at::kDouble);
    for (int q = 0; q < n; ++q) exact.add_(at::full({4099}, 1.0 + eps * (q % 2), at::kDouble).to(d).to(at::kDouble));
    comm->all_reduce(t);
    expect_same(t, exact.to(at::kFloat).to(d), std::string("sum rounded once ") + dtype_name(d));
  }
}

TEST(Shm, AliasedViewsOfOneBuffer) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  // all_reduce from one half of a buffer into the other half (an odd and an even size: across
  // simulated nodes, staged and in place in the output)
  for (const int64_t k : {int64_t(70001), int64_t(70000)}) {
    at::Tensor buf = at::zeros({2 * k}, at::kFloat);
    buf.narrow(0, 0, k).copy_(pattern(k).mul(r + 1));
    comm->all_reduce(buf.narrow(0, 0, k), buf.narrow(0, k, k));
    expect_same(buf.narrow(0, k, k), pattern(k).mul(n * (n + 1) / 2), "all_reduce into the buffer's other half");
    expect_same(buf.narrow(0, 0, k), pattern(k).mul(r + 1), "all_reduce input half untouched");
  }
  // a 2-D tensor in place
  at::Tensor m = pattern(3 * 1001).mul(r + 1).to(at::kDouble).view({3, 1001});
  comm->all_reduce(m);
  expect_same(m, pattern(3 * 1001).mul(n * (n + 1) / 2), "all_reduce 2-D");
}

TEST(Shm, SplitGroups) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  // parity groups, a group in reversed order, and one whose order interleaves the (simulated) nodes
  std::vector<std::shared_ptr<Communicator>> groups = {comm->split(r % 2, r), comm->split(0, n - 1 - r),
                                                       comm->split(0, (r * 3) % n)};
  for (auto& g : groups) {
    ASSERT_NE(g, nullptr);
    for (at::ScalarType d : {at::kFloat, at::kBFloat16, at::kLong})
      for (int64_t k : {int64_t(1), int64_t(5003), int64_t(140001)}) {
        check_collectives(*g, d, k);
        if (::testing::Test::HasFailure()) return;
      }
  }
}

TEST(Shm, ManyInFlightAcrossGroups) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  auto sub = comm->split(r % 2, r);
  const int m = sub->size();
  const int64_t k = 100003;
  std::vector<at::Tensor> ts, ss;
  std::vector<WorkPtr> ws;
  for (int i = 0; i < 6; ++i) {
    ts.push_back(pattern(k, i).mul(r + 1).to(at::kFloat));
    ss.push_back(pattern(k, i).mul(r + 1).to(at::kFloat));
    ws.push_back(comm->all_reduce_async(ts.back()));
    ws.push_back(sub->all_reduce_async(ss.back()));
  }
  int msum = 0;
  for (int q = r % 2; q < n; q += 2) msum += q + 1;
  (void)m;
  for (auto it = ws.rbegin(); it != ws.rend(); ++it) (*it)->wait();  // waited in reverse order
  for (int i = 0; i < 6; ++i) {
    expect_same(ts[i], pattern(k, i).mul(n * (n + 1) / 2), "world all_reduce " + std::to_string(i));
    expect_same(ss[i], pattern(k, i).mul(msum), "group all_reduce " + std::to_string(i));
  }
}

TEST(Shm, WaitTimeIsCounted) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  comm->barrier();
  comm->reset_counters();
  EXPECT_EQ(comm->counters().wait_seconds, 0.0);
  // rank 0 arrives 200 ms late: everyone else waits at least most of that in the all_reduce
  if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  at::Tensor t = at::ones({8});
  auto w = comm->all_reduce_async(t);
  w->wait();
  const double waited = comm->counters().wait_seconds;
  if (r != 0) EXPECT_GT(waited, 0.15) << "rank " << r;
  EXPECT_LT(waited, 60.0);
  EXPECT_TRUE(at::equal(t, at::full({8}, n, at::kFloat)));
  comm->reset_counters();
  EXPECT_EQ(comm->counters().wait_seconds, 0.0);
}

// reduce_scatter inputs in node-shared memory (ZeRO-2/3's gradient buffers): the peers read them in
// place instead of through the transport's buffers. Every rank's input shared, and only rank 0's (the
// others copy theirs in as usual): the same sums, bytes read in place exactly where a peer's input is
// shared, and each input written again the moment the call returns (a peer still reading it would sum
// the new values: the call must not return before the peers are done with it).
TEST(Shm, ReduceScatterReadsNodeSharedInputsInPlace) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const int64_t k = 70001;  // several chunks (and many under the 3 KiB chunk), not a chunk multiple
  at::Tensor probe = comm->node_shared_empty(1, at::kFloat);
  if (n == 1 || std::string(comm->backend_name(at::ones({1}))) != "shm") {
    EXPECT_FALSE(probe.defined()) << "no node-shared memory without the shm transport";
    return;
  }
  ASSERT_TRUE(probe.defined());
  for (at::ScalarType d : {at::kFloat, at::kBFloat16, at::kDouble})
    for (bool all_shared : {true, false})
      for (bool in_place : {false, true}) {
        const std::string tag = std::string(dtype_name(d)) +
                                (all_shared ? ", every input shared" : ", rank 0's shared") +
                                (in_place ? ", output in place" : "");
        at::Tensor pool = comm->node_shared_empty(n * n * k, d);  // each rank's input side by side
        ASSERT_TRUE(pool.defined()) << tag;
        const bool mine = all_shared || r == 0;
        at::Tensor in = mine ? pool.narrow(0, r * n * k, n * k) : at::empty({n * k}, d);
        std::uint64_t expect_in_place = 0;  // what this rank reads from shared peers' inputs
        for (int j = 0; j < n; ++j)
          if (j != r && (all_shared || j == 0)) expect_in_place += static_cast<std::uint64_t>(k) * at::elementSize(d);
        const std::uint64_t before = shm_bytes_read_in_place();
        for (int it = 0; it < 4; ++it) {
          in.copy_(pattern(n * k, 7 * r + it).to(d));
          at::Tensor out = in_place ? in.narrow(0, r * k, k) : at::empty({k}, d);
          const ReduceOp op = it % 2 ? ReduceOp::Max : ReduceOp::Sum;
          comm->reduce_scatter(in, out, {op});
          at::Tensor want = pattern(n * k, 7 * 0 + it).narrow(0, r * k, k);
          for (int j = 1; j < n; ++j) {
            at::Tensor pj = pattern(n * k, 7 * j + it).narrow(0, r * k, k);
            want = op == ReduceOp::Sum ? want.add(pj) : at::maximum(want, pj);
          }
          const at::Tensor got = out.clone();
          in.fill_(-100);  // at once: no peer may still be reading it
          expect_same(got, want.to(d), tag + ", call " + std::to_string(it));
          if (::testing::Test::HasFailure()) return;
        }
        EXPECT_EQ(shm_bytes_read_in_place() - before, 4 * expect_in_place) << tag;
        comm->barrier();  // nobody frees its pool while a peer may map it for the next call
      }
}

// Whether this rank can read every peer's memory (process_vm_readv): what the transport probes at
// setup before it takes the single-copy path.
bool can_read_peers(Communicator& c) {
  static const std::int64_t word = 0x5a5a1234;
  at::Tensor mine = at::tensor({static_cast<std::int64_t>(getpid()), reinterpret_cast<std::int64_t>(&word)}, at::kLong);
  at::Tensor all = at::empty({2 * c.size()}, at::kLong);
  c.all_gather(mine, all);
  int ok = 1;
  for (int j = 0; j < c.size(); ++j) {
    std::int64_t v = 0;
    iovec local{&v, sizeof v};
    iovec remote{reinterpret_cast<void*>(all[2 * j + 1].item<std::int64_t>()), sizeof v};
    ok &= process_vm_readv(static_cast<pid_t>(all[2 * j].item<std::int64_t>()), &local, 1, &remote, 1, 0) ==
              static_cast<ssize_t>(sizeof v) &&
          v == word;
  }
  at::Tensor t = at::full({1}, ok, at::kInt);
  c.all_reduce(t, t, {ReduceOp::Min});
  return t.item<int>() == 1;
}

// all_gather and reduce_scatter over one group that reads its peers' memory from 1 KiB per peer and
// one that never does (ACCEL_COMM_SHM_SINGLE_COPY_KB, read when a group is made): the closed forms
// on both, the same bits (bf16 and float sums and averages), and the bytes read from peers' memory:
// (N-1) times what each rank gets from each peer on the first, none on the second.
TEST(Shm, SingleCopyGathersAndReduceScattersMatchTheChunkedPath) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1 || std::string(comm->backend_name(at::ones({1}))) != "shm") GTEST_SKIP() << "no shm transport";
  std::shared_ptr<Communicator> single, chunked;
  {
    accel::test::ScopedEnv on("ACCEL_COMM_SHM_SINGLE_COPY_KB", "1");
    single = comm->split(0, r);
  }
  {
    accel::test::ScopedEnv off("ACCEL_COMM_SHM_SINGLE_COPY_KB", "0");
    chunked = comm->split(0, r);
  }
  const bool reads = can_read_peers(*comm) && static_cast<int>(std::thread::hardware_concurrency()) >= n;
  const int64_t k = 70001;  // 273 KiB of floats per peer: many chunks, not a chunk multiple
  for (at::ScalarType d : {at::kFloat, at::kBFloat16, at::kDouble, at::kInt}) {
    const std::uint64_t before = shm_bytes_read_from_peer_memory();
    check_collectives(*single, d, k);  // (broadcasts of this size take the chunks on both)
    const std::uint64_t read = shm_bytes_read_from_peer_memory() - before;
    // 2 all_gathers and, per reduce op (Sum, Max and Avg but for ints), 2 reduce_scatters.
    const std::uint64_t calls = 2 + 2 * (classify(d) == DtypeClass::Integer ? 2 : 3);
    EXPECT_EQ(read, reads ? calls * (n - 1) * k * at::elementSize(d) : 0) << dtype_name(d);
    const std::uint64_t before_chunked = shm_bytes_read_from_peer_memory();
    check_collectives(*chunked, d, k);
    EXPECT_EQ(shm_bytes_read_from_peer_memory() - before_chunked, 0u) << dtype_name(d);
  }
  for (at::ScalarType d : {at::kFloat, at::kBFloat16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      at::Tensor in = at::randn({n * k}, at::TensorOptions().dtype(d)).mul(r + 1);
      at::Tensor a = at::empty({k}, in.options()), b = at::empty({k}, in.options());
      single->reduce_scatter(in, a, {op});
      chunked->reduce_scatter(in, b, {op});
      EXPECT_TRUE(at::equal(a, b)) << dtype_name(d) << " " << to_string(op) << ": the same bits on both paths";
    }
  // reduce_scatter inputs in node-shared memory (every rank's, or rank 0's only beside private ones)
  // on the single-copy path: the shared ones read where they lie, the private ones from the peers'
  // memory, the closed form either way.
  for (bool all_shared : {true, false}) {
    at::Tensor pool = single->node_shared_empty(n * n * k, at::kFloat);
    ASSERT_TRUE(pool.defined());
    const bool mine = all_shared || r == 0;
    at::Tensor in = mine ? pool.narrow(0, r * n * k, n * k) : at::empty({n * k}, at::kFloat);
    in.copy_(pattern(n * k, 3 * r).to(at::kFloat));
    std::uint64_t shared_peers = 0, private_peers = 0;
    for (int j = 0; j < n; ++j)
      if (j != r) ++((all_shared || j == 0) ? shared_peers : private_peers);
    const std::uint64_t in_place0 = shm_bytes_read_in_place(), peer0 = shm_bytes_read_from_peer_memory();
    at::Tensor out = at::empty({k}, at::kFloat);
    single->reduce_scatter(in, out, {ReduceOp::Sum});
    at::Tensor want = at::zeros({k}, at::kLong);
    for (int j = 0; j < n; ++j) want.add_(pattern(n * k, 3 * j).narrow(0, r * k, k));
    expect_same(out, want.to(at::kFloat), all_shared ? "every input shared" : "rank 0's input shared");
    if (reads) {
      EXPECT_EQ(shm_bytes_read_in_place() - in_place0, shared_peers * k * 4) << all_shared;
      EXPECT_EQ(shm_bytes_read_from_peer_memory() - peer0, private_peers * k * 4) << all_shared;
    }
    single->barrier();  // nobody unmaps its pool while a peer still reads it
  }
  EXPECT_EQ(std::string(single->backend_name(at::ones({1}))), "shm");
  // (Where ranks outnumber cores or the kernel forbids reading a peer's memory, both groups took the
  // chunked path: the closed forms above held, the single-copy path did not run.)
  if (!reads) GTEST_SKIP() << "single copy is off here (ranks outnumber cores, or process_vm_readv is refused)";
}

// Every CPU transport driven as the GPU staging backend drives its host transport (staged_backend.cpp):
// the input written only after enqueue, before `ready` turns true (the device-to-host copy landing),
// and a `then` of the caller's (the copy back to the device) that must see the final output. No step
// reads the input before `ready`, and the caller's `then` runs after the transport's own, on every
// path: MPI (16-bit sums staged in fp32), shared memory, and across simulated nodes the hierarchical
// transport over the world (each node's ranks one run) and over a group whose order interleaves the
// nodes (staged through a node-major copy); all_reduce in place and not, of a size divisible by the
// node's ranks and not, fp32 and bf16, sums and averages; reduce_scatter, all_gather and broadcast.
void expect_staged_requests_wait(Backend& t, const std::string& name) {
  const int n = t.size(), r = t.rank();
  struct Case {
    Collective kind;
    at::ScalarType d;
    ReduceOp op;
    int64_t k;
    bool in_place;
  };
  std::vector<Case> cases;
  for (at::ScalarType d : {at::kFloat, at::kBFloat16})
    for (int64_t k : {int64_t(4100), int64_t(4099)})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        cases.push_back({Collective::AllReduce, d, op, k, false});
        cases.push_back({Collective::AllReduce, d, op, k, true});
        cases.push_back({Collective::ReduceScatter, d, op, k, false});
      }
  cases.push_back({Collective::AllGather, at::kFloat, ReduceOp::Sum, 4099, false});
  cases.push_back({Collective::AllGather, at::kFloat, ReduceOp::Sum, 70001, false});  // (over 1 MiB at 4 ranks)
  cases.push_back({Collective::Broadcast, at::kFloat, ReduceOp::Sum, 4099, true});
  for (const Case& c : cases) {
    const std::string tag = name + ": " + to_string(c.kind) + " " + to_string(c.op) + " " + dtype_name(c.d) + "[" +
                            std::to_string(c.k) + "]" + (c.in_place ? " in place" : "");
    const int64_t k = c.k;
    const auto o = at::TensorOptions().dtype(c.d);
    const ClosedForm cf = closed_form(c.kind, c.op, n, r, k, n - 1);  // (cf.input: once it has landed)
    const at::Tensor &values = cf.input, &want = cf.want;
    at::Tensor in = at::full({values.numel()}, -1000, o);
    at::Tensor out = c.in_place ? in : at::full({want.numel()}, 77, o);
    auto landed = std::make_shared<std::atomic<bool>>(false);
    auto seen = std::make_shared<at::Tensor>();
    Request q;
    q.kind = c.kind;
    q.input = in;
    q.output = out;
    q.op = c.op;
    q.root = n - 1;
    q.ready = [landed] { return landed->load(std::memory_order_acquire); };
    q.then = [seen, out] { *seen = out.clone(); };
    q.work = std::make_shared<Work>(tag, r, n, std::chrono::seconds(60));
    WorkPtr w = q.work;
    t.enqueue(std::move(q));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // (the transport's threads run meanwhile)
    in.copy_(values.to(c.d));
    landed->store(true, std::memory_order_release);
    w->wait();
    expect_same(out, want.to(c.d), tag);
    ASSERT_TRUE(seen->defined()) << tag << ": the caller's then did not run";
    expect_same(*seen, want.to(c.d), tag + ", as the caller's then saw it");
  }
}

TEST(ShmAndMpi, StagedRequestsWaitForReadyAndKeepTheCallersThen) {
  auto comm = world();
  if (comm->size() == 1) GTEST_SKIP() << "needs 2 ranks";
  const int n = comm->size(), r = comm->rank();
  auto mpi = MpiBackend::world();
  // (keys that interleave the simulated nodes: 0, 3, 2, 1 at 4 ranks)
  auto interleaved = mpi->split(0, (r * 3) % n);
  std::unique_ptr<Backend> cpu = make_cpu_transport(*mpi, comm->topology());
  std::unique_ptr<Backend> cpu_interleaved = make_cpu_transport(*interleaved, comm->topology());
  EXPECT_STREQ(cpu ? cpu->name() : "mpi", comm->backend_name(at::ones({1})));
  expect_staged_requests_wait(*mpi, "mpi");
  if (cpu) expect_staged_requests_wait(*cpu, cpu->name());
  if (cpu_interleaved)
    expect_staged_requests_wait(*cpu_interleaved, std::string(cpu_interleaved->name()) + " interleaved");
  if (std::string(comm->backend_name(at::ones({1}))) == "shm+mpi") EXPECT_NE(cpu_interleaved, nullptr);
}

}  // namespace
