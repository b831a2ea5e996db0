// Collectives on CUDA tensors through accel::comm::Communicator, checked against closed forms, over
// the transport ACCEL_CUDA_COMM picks (comm/cuda_comm.h): NCCL with one GPU per rank, staged through
// host memory where ranks share a GPU (or ACCEL_CUDA_COMM=host). Run under mpirun with 1-4 ranks;
// main() (elsewhere) initializes MPI through accel::test::world(). Every test skips without a CUDA
// device, and where ACCEL_CUDA_COMM=nccl is asked for ranks that share a GPU; each rank uses
// cuda:(local rank % device count). Skip decisions depend only on values every rank agrees on, so no
// rank is left alone in a collective.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/cuda_comm.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "test_world.h"

#if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<cuda_runtime_api.h>)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define ACCEL_TEST_HAS_CUDA_STREAMS 1
#endif

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

using accel::comm::Collective;
using accel::comm::Communicator;
using accel::comm::ReduceOp;

struct Ctx {
  std::shared_ptr<Communicator> comm;
  int rank = 0, world = 1, device = 0;
  accel::comm::CudaCommChoice choice{accel::comm::CudaComm::Nccl, ""};  // what the communicator picks
  std::string skip;                                                     // non-empty: why the test cannot run here

  at::TensorOptions opts(at::ScalarType t) const {
    return at::TensorOptions().dtype(t).device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
  }
};

// Returns false (with ctx.skip set) when collectives on CUDA tensors cannot run on this machine.
bool setup(Ctx& ctx) {
  const int ndev = accel::comm::cuda_device_count();
  ctx.comm = accel::test::world();
  ctx.rank = ctx.comm->rank();
  ctx.world = ctx.comm->size();
  const auto& topo = ctx.comm->topology();
  // A simulated topology (ACCEL_RANKS_PER_NODE) says nothing about machines: assume one machine.
  const int ranks_here = topo.simulated ? topo.world_size : topo.local_world_size;
  ctx.device = (topo.simulated ? topo.rank : topo.local_rank) % ndev;
  try {
    ctx.choice = accel::comm::choose_cuda_comm(accel::comm::cuda_comm_requested(), accel::comm::nccl_compiled(),
                                               ranks_here > ndev ? ranks_here : 0);
  } catch (const accel::comm::InvalidArgument& e) {
    ctx.skip = e.what();
    return false;
  }
  return true;
}

// Compares on the host in float64 (exact for every value these tests produce).
void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const at::Tensor g = got.to(at::kCPU).to(at::kDouble).reshape({-1});
  const at::Tensor w = want.to(at::kCPU).to(at::kDouble).reshape({-1});
  ASSERT_EQ(g.numel(), w.numel()) << what;
  if (at::equal(g, w)) return;
  const at::Tensor bad = (g != w).nonzero();
  const int64_t i = bad[0][0].item<int64_t>();
  ADD_FAILURE() << what << ": " << bad.size(0) << " of " << g.numel() << " elements differ; first at " << i << ": got "
                << g[i].item<double>() << ", want " << w[i].item<double>();
}

void expect_all(const at::Tensor& got, double v, const std::string& what) {
  expect_equal(got, at::full({got.numel()}, v, at::kDouble), what);
}

std::string name(at::ScalarType t) { return c10::toString(t); }

}  // namespace

TEST(NcclComm_CUDA, VersionAndBackend) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  if (accel::comm::nccl_compiled())
    EXPECT_EQ(accel::comm::nccl_version().rfind("2.", 0), 0u) << accel::comm::nccl_version();
  const at::Tensor t = at::zeros({4}, ctx.opts(at::kFloat));
  const std::string name = ctx.comm->backend_name(t);
  if (ctx.choice.comm == accel::comm::CudaComm::Nccl)
    EXPECT_EQ(name, "nccl");
  else  // staged over the group's CPU transport ("mpi" at one rank, "shm" on one node)
    EXPECT_EQ(name, std::string("host+") + ctx.comm->backend_name(t.cpu())) << ctx.choice.why;
  if (ctx.world == 1) EXPECT_STREQ(ctx.comm->backend_name(t.cpu()), "mpi");
}

TEST(NcclComm_CUDA, AllReduceSumEveryDtype) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const double n = ctx.world;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kLong, at::kInt, at::kByte}) {
    for (int64_t len : {1, 1031}) {
      at::Tensor t = at::full({len}, ctx.rank + 1, ctx.opts(dt));
      ctx.comm->all_reduce(t);
      expect_all(t, n * (n + 1) / 2, "sum " + name(dt) + "[" + std::to_string(len) + "]");
    }
  }
}

TEST(NcclComm_CUDA, AllReduceOutOfPlace) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const double n = ctx.world;
  const at::Tensor in = at::full({2, 513}, ctx.rank + 1, ctx.opts(at::kFloat));
  at::Tensor out = at::zeros({2, 513}, ctx.opts(at::kFloat));
  ctx.comm->all_reduce(in, out);
  expect_all(out, n * (n + 1) / 2, "out-of-place sum output");
  expect_all(in, ctx.rank + 1, "out-of-place sum input (untouched)");
}

TEST(NcclComm_CUDA, AllReduceAvg) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const double n = ctx.world;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    at::Tensor t = at::full({777}, ctx.rank + 1, ctx.opts(dt));
    ctx.comm->all_reduce(t, {.op = ReduceOp::Avg});
    expect_all(t, (n + 1) / 2, "avg " + name(dt));
  }
}

TEST(NcclComm_CUDA, AllReduceMaxMin) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const int64_t len = 1000;
  // Rank r holds v_i * (r + 1) with v_i = i - 500: the extremes over ranks are v_i and n * v_i.
  const at::Tensor v = at::arange(len, at::kDouble) - 500;
  const at::Tensor want_max = at::maximum(v, v * ctx.world), want_min = at::minimum(v, v * ctx.world);
  for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kLong, at::kInt, at::kHalf}) {
    const at::Tensor mine = (v * (ctx.rank + 1)).to(ctx.opts(dt));
    at::Tensor mx = mine.clone(), mn = mine.clone();
    ctx.comm->all_reduce(mx, {.op = ReduceOp::Max});
    ctx.comm->all_reduce(mn, {.op = ReduceOp::Min});
    expect_equal(mx, want_max, "max " + name(dt));
    expect_equal(mn, want_min, "min " + name(dt));
  }
}

TEST(NcclComm_CUDA, ReduceScatter) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const int n = ctx.world, r = ctx.rank;
  const double tri = n * (n + 1) / 2.0;
  for (int64_t k : {0, 1, 7, 1000}) {
    for (at::ScalarType dt : {at::kFloat, at::kLong}) {
      const std::string what = "reduce_scatter " + name(dt) + " k=" + std::to_string(k);
      // Element j of rank r's input is (r + 1) * (j + 1); this rank's slice starts at j = r * k.
      const at::Tensor j1 = at::arange(1, n * k + 1, at::kDouble);
      const at::Tensor input = (j1 * (r + 1)).to(ctx.opts(dt));
      const at::Tensor own = j1.narrow(0, r * k, k);

      at::Tensor out = at::full({k}, -1, ctx.opts(dt));
      ctx.comm->reduce_scatter(input, out);
      expect_equal(out, own * tri, what + " sum");

      ctx.comm->reduce_scatter(input, out, {.op = ReduceOp::Max});
      expect_equal(out, own * n, what + " max");

      // In place: the output is this rank's own slice of the input.
      at::Tensor inplace = input.clone();
      ctx.comm->reduce_scatter(inplace, inplace.narrow(0, r * k, k));
      expect_equal(inplace.narrow(0, r * k, k), own * tri, what + " in place");
    }
  }
  // A length that world does not divide: the caller pads to world * ceil(len / world) with zeros.
  const int64_t len = 1001, k = (len + n - 1) / n;
  at::Tensor padded = at::zeros({n * k}, ctx.opts(at::kFloat));
  padded.narrow(0, 0, len).fill_(r + 1);
  at::Tensor out = at::empty({k}, ctx.opts(at::kFloat));
  ctx.comm->reduce_scatter(padded, out);
  const at::Tensor idx = at::arange(r * k, (r + 1) * k, at::kDouble);
  expect_equal(out, at::where(idx < len, tri, 0.0), "reduce_scatter of a padded length");
}

TEST(NcclComm_CUDA, AllGather) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const int n = ctx.world, r = ctx.rank;
  for (int64_t k : {0, 1, 7, 1000}) {
    // Rank q's block is filled with q: element j of the output is j / k.
    const at::Tensor want = k == 0 ? at::zeros({0}, at::kDouble) : at::arange(n * k, at::kLong).div(k, "floor");
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kInt}) {
      const std::string what = "all_gather " + name(dt) + " k=" + std::to_string(k);
      const at::Tensor in = at::full({k}, r, ctx.opts(dt));
      at::Tensor out = at::full({n * k}, -1, ctx.opts(dt));
      ctx.comm->all_gather(in, out);
      expect_equal(out, want, what);
      expect_all(in, r, what + " (input untouched)");

      // In place: the input is this rank's own slice of the output.
      at::Tensor buf = at::full({n * k}, -1, ctx.opts(dt));
      buf.narrow(0, r * k, k).fill_(r);
      ctx.comm->all_gather(buf.narrow(0, r * k, k), buf);
      expect_equal(buf, want, what + " in place");
    }
  }
}

TEST(NcclComm_CUDA, BroadcastFromLastRank) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const int root = ctx.world - 1;
  const at::Tensor want = at::arange(100, at::kDouble) + 42;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kLong, at::kDouble}) {
    at::Tensor t = ctx.rank == root ? want.to(ctx.opts(dt)) : at::zeros({100}, ctx.opts(dt));
    ctx.comm->broadcast(t, {.root = root});
    expect_equal(t, want, "broadcast " + name(dt) + " from rank " + std::to_string(root));
  }
}

TEST(NcclComm_CUDA, Fp8AllGatherIsByteExact) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const int n = ctx.world;
  const int64_t k = 257;
  // Every byte value occurs (NaN and negative-zero patterns included): nothing may be converted.
  auto bytes_of = [k](int q) { return ((at::arange(k, at::kLong) * 11 + q * 37 + 3) % 256).to(at::kByte); };
  std::vector<at::Tensor> blocks;
  for (int q = 0; q < n; ++q) blocks.push_back(bytes_of(q));
  const at::Tensor want = at::cat(blocks);
  for (at::ScalarType dt : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    const at::Tensor in = bytes_of(ctx.rank).view(dt).to(ctx.opts(dt));
    at::Tensor out = at::empty({n * k}, ctx.opts(dt));
    ctx.comm->all_gather(in, out);
    const at::Tensor got = out.to(at::kCPU).view(at::kByte);
    EXPECT_TRUE(at::equal(got, want)) << "fp8 " << name(dt) << " all_gather changed bytes";

    // Broadcast moves fp8 as bytes too.
    at::Tensor b = bytes_of(ctx.rank).view(dt).to(ctx.opts(dt));
    ctx.comm->broadcast(b, {.root = 0});
    EXPECT_TRUE(at::equal(b.to(at::kCPU).view(at::kByte), bytes_of(0))) << "fp8 " << name(dt) << " broadcast";
  }
}

TEST(NcclComm_CUDA, Fp8AndIntegerAvgReductionsAreRejected) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  at::Tensor f8 = at::zeros({8}, ctx.opts(at::kByte)).view(at::kFloat8_e4m3fn);
  EXPECT_THROW(ctx.comm->all_reduce(f8), accel::comm::InvalidArgument);
  at::Tensor i32 = at::zeros({8}, ctx.opts(at::kInt));
  EXPECT_THROW(ctx.comm->all_reduce(i32, {.op = ReduceOp::Avg}), accel::comm::InvalidArgument);
  // The communicator still works afterwards.
  at::Tensor t = at::ones({8}, ctx.opts(at::kFloat));
  ctx.comm->all_reduce(t);
  expect_all(t, ctx.world, "sum after rejected calls");
}

TEST(NcclComm_CUDA, Barrier) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  at::Tensor t = at::ones({16}, ctx.opts(at::kFloat));  // creates the NCCL backend first
  ctx.comm->all_reduce(t);
  ctx.comm->barrier();
  auto w = ctx.comm->barrier_async();
  w->wait();
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(w->exception(), nullptr);
}

TEST(NcclComm_CUDA, AsyncCollectivesOverlap) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const double n = ctx.world;
  at::Tensor a = at::full({1 << 22}, ctx.rank + 1, ctx.opts(at::kFloat));
  at::Tensor b = at::full({4096}, 2 * (ctx.rank + 1), ctx.opts(at::kBFloat16));
  at::Tensor c = at::full({33}, 3 * (ctx.rank + 1), ctx.opts(at::kDouble));
  std::vector<accel::comm::WorkPtr> works;
  works.push_back(ctx.comm->all_reduce_async(a));
  works.push_back(ctx.comm->all_reduce_async(b, {.op = ReduceOp::Max}));
  works.push_back(ctx.comm->all_reduce_async(c, {.op = ReduceOp::Avg}));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();  // any order
  for (const auto& w : works) {
    EXPECT_TRUE(w->is_completed()) << w->what();
    EXPECT_EQ(w->exception(), nullptr) << w->what();
  }
  expect_all(a, n * (n + 1) / 2, "async sum");
  expect_all(b, 2 * n, "async max");
  expect_all(c, 3 * (n + 1) / 2, "async avg");

  // The collective sees what was queued on the current stream just before it (no host sync here).
  at::Tensor d = at::zeros({1 << 22}, ctx.opts(at::kFloat));
  for (int i = 0; i < 10; ++i) d.add_(1);
  d.mul_(ctx.rank + 1);
  auto w = ctx.comm->all_reduce_async(d);
  w->wait();
  expect_all(d, 10 * n * (n + 1) / 2, "sum of a tensor written just before on the current stream");
}

TEST(NcclComm_CUDA, CountersCountBytes) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const std::uint64_t n = ctx.world, k = 1000;
  ctx.comm->reset_counters();
  const at::Tensor in = at::full({static_cast<int64_t>(k)}, ctx.rank, ctx.opts(at::kFloat));
  at::Tensor out = at::empty({static_cast<int64_t>(n * k)}, ctx.opts(at::kFloat));
  ctx.comm->all_gather(in, out);
  const auto ag = ctx.comm->counters()[Collective::AllGather];
  EXPECT_EQ(ag.calls, 1u);
  EXPECT_EQ(ag.bytes_sent, 4 * k);
  EXPECT_EQ(ag.bytes_received, 4 * k * n);

  at::Tensor t = at::ones({static_cast<int64_t>(k)}, ctx.opts(at::kBFloat16));
  ctx.comm->all_reduce(t);
  const auto ar = ctx.comm->counters()[Collective::AllReduce];
  EXPECT_EQ(ar.calls, 1u);
  EXPECT_EQ(ar.bytes_sent, 2 * k);
  EXPECT_EQ(ar.bytes_received, 2 * k);
  EXPECT_EQ(ctx.comm->counters().total().calls, 2u);

  ctx.comm->reset_counters();
  EXPECT_EQ(ctx.comm->counters().total().calls, 0u);
}

#ifdef ACCEL_TEST_HAS_CUDA_STREAMS
// The caller's stream does not wait for a collective at launch: work queued after it overlaps it, and
// only Work::wait() (or is_completed()) hands the result over. The collective is made slow by queueing
// it behind an earlier one that waits for ~0.3 s of matmuls on a side stream; a kernel queued on the
// current stream after the launch must finish while the collective is still pending.
TEST(NcclComm_CUDA, ComputeStreamDoesNotWaitForTheCollective) {
  if (accel::comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  if (!setup(ctx)) GTEST_SKIP() << ctx.skip;
  const auto dev = static_cast<c10::DeviceIndex>(ctx.device);
  c10::cuda::CUDAGuard guard(dev);
  const int64_t n = ctx.world;
  at::Tensor w = at::randn({4096, 4096}, ctx.opts(at::kFloat)) * (1.0 / 64);
  at::Tensor first = at::ones({1 << 20}, ctx.opts(at::kFloat)), second = at::ones({1 << 20}, ctx.opts(at::kFloat));
  c10::cuda::getCurrentCUDAStream(dev).synchronize();  // the side stream reads w
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, dev);
  accel::comm::WorkPtr w1;
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    at::Tensor acc = w;
    for (int i = 0; i < 100; ++i) acc = at::mm(acc, w);
    w1 = ctx.comm->all_reduce_async(first);  // its stream waits for the matmuls
  }
  accel::comm::WorkPtr w2 = ctx.comm->all_reduce_async(second);  // queued behind w1
  at::Tensor small = at::ones({16}, ctx.opts(at::kFloat)) * 2;   // on the current stream
  c10::cuda::getCurrentCUDAStream(dev).synchronize();
  EXPECT_FALSE(w2->is_completed()) << "the current stream waited for the collective launched before it";
  EXPECT_TRUE(at::equal(small.cpu(), at::full({16}, 2.0f)));
  w2->wait();
  w1->wait();
  expect_all(second, n, "all_reduce after the overlapped kernel");
  expect_all(first, n, "all_reduce behind the side stream");
}
#endif
