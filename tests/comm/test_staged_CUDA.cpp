// Collectives on CUDA tensors staged through pinned host memory (comm/transport/staged/staged_backend.h), the path for
// ranks that share a GPU or a build without NCCL: every collective, dtype and op gives the CPU path's
// bits on the same inputs; CPU and CUDA collectives interleave in issue order; a mismatch raises on
// every rank and leaves the group usable. And which transport ACCEL_CUDA_COMM picks (comm/cuda_comm.h),
// which runs everywhere (no device needed). Run under mpirun with 1-4 ranks, any number per GPU.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/cuda_comm.h"
#include "comm/topology.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "support/scoped_env.h"
#include "test_world.h"

#include <memory>
#include <string>

namespace accel::test {
namespace {

using comm::CudaComm;

TEST(CudaCommChoice, AutoTakesNcclWithOneGpuPerRankAndHostOtherwise) {
  EXPECT_EQ(comm::choose_cuda_comm(CudaComm::Auto, true, 0).comm, CudaComm::Nccl);
  const auto shared = comm::choose_cuda_comm(CudaComm::Auto, true, 2);
  EXPECT_EQ(shared.comm, CudaComm::Host);
  EXPECT_NE(shared.why.find("2 ranks share a GPU"), std::string::npos) << shared.why;
  const auto no_nccl = comm::choose_cuda_comm(CudaComm::Auto, false, 0);
  EXPECT_EQ(no_nccl.comm, CudaComm::Host);
  EXPECT_NE(no_nccl.why.find("no NCCL"), std::string::npos) << no_nccl.why;
  EXPECT_EQ(comm::choose_cuda_comm(CudaComm::Host, true, 0).comm, CudaComm::Host);
  EXPECT_EQ(comm::choose_cuda_comm(CudaComm::Nccl, true, 0).comm, CudaComm::Nccl);
}

TEST(CudaCommChoice, NcclWhereItCannotServeIsRefusedWithTheWayOut) {
  try {
    comm::choose_cuda_comm(CudaComm::Nccl, true, 4);
    FAIL() << "nccl with 4 ranks on one GPU was accepted";
  } catch (const comm::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("use auto or host"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm::choose_cuda_comm(CudaComm::Nccl, false, 0), comm::InvalidArgument);
}

// Who shares a GPU goes by the GPUs' UUIDs (each rank's own cuda_device_uuid), gathered over the group
// so that every rank gets the same count; an unknown UUID (empty) shares with no one.
TEST(CudaCommChoice, RanksSharingAGpuGoByTheirUuids) {
  auto uuid = [](int gpu) {
    std::string u(16, 'g');
    u[0] = static_cast<char>('A' + gpu);
    return u;
  };
  const std::string unknown(16, '\0');
  EXPECT_EQ(comm::ranks_sharing_a_gpu(uuid(0) + uuid(1) + uuid(0) + unknown), 2);
  EXPECT_EQ(comm::ranks_sharing_a_gpu(uuid(0) + uuid(1)), 0);
  EXPECT_EQ(comm::ranks_sharing_a_gpu(unknown + unknown), 0);
  EXPECT_THROW(comm::ranks_sharing_a_gpu(std::string(17, 'x')), comm::InvalidArgument);
  // Over the world: each rank on its own GPU; ranks 0 and 1 on one; every rank on one.
  comm::Communicator& w = *world();
  const int r = w.rank(), n = w.size();
  EXPECT_EQ(comm::ranks_sharing_a_gpu(w, uuid(r)), 0);
  EXPECT_EQ(comm::ranks_sharing_a_gpu(w, uuid(r < 2 ? 0 : r)), n >= 2 ? 2 : 0);
  EXPECT_EQ(comm::ranks_sharing_a_gpu(w, uuid(0)), n >= 2 ? n : 0);
  EXPECT_EQ(comm::ranks_sharing_a_gpu(w, ""), 0);
}

// A rank that does not know its GPU's UUID counts the ranks of its node against the GPUs it sees (every
// rank, under a simulated topology): the Accelerator's check and the Communicator's choice both add it.
TEST(CudaCommChoice, ARankWithoutItsUuidCountsTheRanksOfItsNode) {
  comm::Topology t;
  t.world_size = 8;
  t.local_world_size = 4;
  EXPECT_EQ(comm::ranks_sharing_by_count(t, 2, ""), 4);
  EXPECT_EQ(comm::ranks_sharing_by_count(t, 4, ""), 0);
  EXPECT_EQ(comm::ranks_sharing_by_count(t, 2, std::string(16, 'g')), 0);  // known: the UUIDs decide
  t.simulated = true;
  EXPECT_EQ(comm::ranks_sharing_by_count(t, 4, ""), 8);
}

TEST(CudaCommChoice, TheVariableIsReadAndABadValueNamed) {
  {
    ScopedEnv e("ACCEL_CUDA_COMM", std::nullopt);
    EXPECT_EQ(comm::cuda_comm_requested(), CudaComm::Auto);
  }
  {
    ScopedEnv e("ACCEL_CUDA_COMM", "host");
    EXPECT_EQ(comm::cuda_comm_requested(), CudaComm::Host);
  }
  ScopedEnv e("ACCEL_CUDA_COMM", "gloo");
  try {
    comm::cuda_comm_requested();
    FAIL() << "ACCEL_CUDA_COMM=gloo was accepted";
  } catch (const comm::InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("auto, nccl, host"), std::string::npos) << err.what();
  }
}

// A group of every rank whose CUDA collectives are staged through host memory (ACCEL_CUDA_COMM=host
// while it chooses), with this rank's device; skipped without a device.
struct Staged {
  std::shared_ptr<comm::Communicator> comm;
  c10::Device device = c10::kCPU;
};
Staged staged_group() {
  Staged s;
  auto w = world();
  s.comm = w->split(0, w->rank());
  const int ndev = comm::cuda_device_count();
  if (ndev == 0) return s;
  s.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(w->topology().local_rank % ndev));
  ScopedEnv host("ACCEL_CUDA_COMM", "host");
  const std::string name = s.comm->backend_name(at::zeros({1}, at::TensorOptions().device(s.device)));  // (chooses)
  EXPECT_EQ(name.rfind("host+", 0), 0u) << name;
  return s;
}
#define SKIP_WITHOUT_DEVICE() \
  if (comm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// Random values this rank contributes (integers where the dtype is integral), the same on CPU and GPU.
at::Tensor values(at::ScalarType dt, int64_t n, int rank, int salt) {
  at::manual_seed(1000 * salt + rank);
  if (at::isIntegralType(dt, /*includeBool=*/false)) return at::randint(-50, 50, {n}).to(dt);
  return at::randn({n}, at::kDouble).to(dt);
}

void expect_same_bits(const at::Tensor& gpu, const at::Tensor& cpu, const std::string& what) {
  const at::Tensor g = gpu.cpu();
  ASSERT_EQ(g.numel(), cpu.numel()) << what;
  EXPECT_TRUE(at::equal(g.view(at::kByte), cpu.view(at::kByte)))
      << what << ": the staged result differs from the CPU "
      << "path's, max |diff| " << (g.to(at::kDouble) - cpu.to(at::kDouble)).abs().max().item<double>();
}

TEST(StagedComm_CUDA, EveryCollectiveGivesTheCpuPathsBits) {
  SKIP_WITHOUT_DEVICE();
  Staged s = staged_group();
  const int N = s.comm->size(), r = s.comm->rank();
  int salt = 0;
  for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt}) {
    const bool floating = at::isFloatingType(dt);
    for (comm::ReduceOp op : {comm::ReduceOp::Sum, comm::ReduceOp::Avg, comm::ReduceOp::Max, comm::ReduceOp::Min}) {
      if (op == comm::ReduceOp::Avg && !floating) continue;
      for (int64_t k : {int64_t{1}, int64_t{1031}, int64_t{300000}}) {  // 300000: several transport chunks
        const std::string what = std::string(c10::toString(dt)) + " " + comm::to_string(op) + " k=" + std::to_string(k);
        // all_reduce, in place and out of place
        const at::Tensor x = values(dt, k, r, ++salt);
        at::Tensor cpu = x.clone(), gpu = x.to(s.device);
        s.comm->all_reduce(cpu, {.op = op});
        s.comm->all_reduce(gpu, {.op = op});
        expect_same_bits(gpu, cpu, "all_reduce " + what);
        at::Tensor gout = at::empty_like(gpu);
        s.comm->all_reduce(x.to(s.device), gout, {.op = op});
        expect_same_bits(gout, cpu, "all_reduce out of place " + what);
        // reduce_scatter, out of place and into the input's own slice
        const at::Tensor y = values(dt, N * k, r, ++salt);
        at::Tensor cpu_rs = at::empty({k}, y.options());
        s.comm->reduce_scatter(y, cpu_rs, {.op = op});
        at::Tensor gy = y.to(s.device), g_rs = at::empty({k}, gy.options());
        s.comm->reduce_scatter(gy, g_rs, {.op = op});
        expect_same_bits(g_rs, cpu_rs, "reduce_scatter " + what);
        s.comm->reduce_scatter(gy, gy.narrow(0, r * k, k), {.op = op});
        expect_same_bits(gy.narrow(0, r * k, k), cpu_rs, "reduce_scatter in place " + what);
      }
    }
    // all_gather (out of place and from the output's own slice; 300000 elements a rank: an output past
    // 1 MiB, which the hierarchical transport gathers node by node) and broadcast from every root
    for (int64_t k : {int64_t{4099}, int64_t{300000}}) {
      const std::string what = std::string(c10::toString(dt)) + " k=" + std::to_string(k);
      const at::Tensor x = values(dt, k, r, ++salt);
      at::Tensor cpu_ag = at::empty({N * k}, x.options());
      s.comm->all_gather(x, cpu_ag);
      at::Tensor g_ag = at::empty({N * k}, x.options().device(s.device));
      s.comm->all_gather(x.to(s.device), g_ag);
      expect_same_bits(g_ag, cpu_ag, "all_gather " + what);
      at::Tensor g_ag2 = at::zeros({N * k}, x.options().device(s.device));
      g_ag2.narrow(0, r * k, k).copy_(x);
      s.comm->all_gather(g_ag2.narrow(0, r * k, k), g_ag2);
      expect_same_bits(g_ag2, cpu_ag, "all_gather in place " + what);
    }
    const int64_t k = 4099;
    const at::Tensor x = values(dt, k, r, ++salt);
    for (int root = 0; root < N; ++root) {
      at::Tensor cpu_b = x.clone(), gpu_b = x.to(s.device);
      s.comm->broadcast(cpu_b, {.root = root});
      s.comm->broadcast(gpu_b, {.root = root});
      expect_same_bits(gpu_b, cpu_b, "broadcast from " + std::to_string(root) + " " + c10::toString(dt));
    }
  }
}

TEST(StagedComm_CUDA, Fp8AllGatherMovesTheBytes) {
  SKIP_WITHOUT_DEVICE();
  Staged s = staged_group();
  const int N = s.comm->size(), r = s.comm->rank();
  const int64_t k = 777;
  const at::Tensor x = (values(at::kFloat, k, r, 9) * 8).to(at::kFloat8_e4m3fn);
  at::Tensor cpu = at::empty({N * k}, x.options());
  s.comm->all_gather(x, cpu);
  at::Tensor gpu = at::empty({N * k}, x.options().device(s.device));
  s.comm->all_gather(x.to(s.device), gpu);
  expect_same_bits(gpu, cpu, "fp8 all_gather");
}

// CPU and CUDA collectives issued alternately, the CUDA ones asynchronously and waited for last:
// the host transport runs them in issue order on every rank (no deadlock, every result right).
TEST(StagedComm_CUDA, CpuAndCudaCollectivesInterleaveInIssueOrder) {
  SKIP_WITHOUT_DEVICE();
  Staged s = staged_group();
  const double n = s.comm->size();
  const int r = s.comm->rank();
  std::vector<at::Tensor> gpu, cpu;
  std::vector<comm::WorkPtr> works;
  for (int i = 0; i < 6; ++i) {
    gpu.push_back(at::full({(i + 1) * 50000}, r + 1 + i, at::TensorOptions().device(s.device)));
    works.push_back(s.comm->all_reduce_async(gpu.back()));
    cpu.push_back(at::full({1000}, r + 1, at::kFloat));
    s.comm->all_reduce(cpu.back());  // blocking, between the CUDA ones
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(at::equal(gpu[i].cpu(), at::full_like(gpu[i].cpu(), n * (n + 1) / 2 + n * i))) << i;
    EXPECT_TRUE(at::equal(cpu[i], at::full({1000}, n * (n + 1) / 2, at::kFloat))) << i;
  }
}

// An input the caller's stream writes late (queued behind milliseconds of products) is what goes out,
// for every collective: the copy to the host waits for the caller's stream, and the host transport
// (every step of it, across simulated nodes too) for that copy. The results are read after wait() on
// the caller's stream.
TEST(StagedComm_CUDA, InputsWrittenLateByTheCallersStreamAreWhatIsReduced) {
  SKIP_WITHOUT_DEVICE();
  Staged s = staged_group();
  const int N = s.comm->size(), r = s.comm->rank();
  const auto on = at::TensorOptions().device(s.device);
  const int64_t k = 300000;
  at::Tensor ar = at::zeros({k}, on), rs_in = at::zeros({N * k}, on), rs_out = at::zeros({k}, on),
             ag_in = at::zeros({k}, on), ag_out = at::zeros({N * k}, on), bc = at::zeros({k}, on);
  // Busy work on the caller's stream first: 40 products of 2048 x 2048, each of the same inputs.
  const at::Tensor a = at::randn({2048, 2048}, on);
  at::Tensor busy;
  for (int i = 0; i < 40; ++i) busy = at::mm(a, a);
  ar.fill_(r + 1);
  rs_in.fill_(r + 1);
  ag_in.fill_(r + 1);
  if (r == 0) bc.fill_(7);
  std::vector<comm::WorkPtr> works;
  works.push_back(s.comm->all_reduce_async(ar));
  works.push_back(s.comm->reduce_scatter_async(rs_in, rs_out));
  works.push_back(s.comm->all_gather_async(ag_in, ag_out));
  works.push_back(s.comm->broadcast_async(bc, {.root = 0}));
  for (auto& w : works) w->wait();
  const float sum = N * (N + 1) / 2.0f;
  EXPECT_TRUE(at::equal(ar.cpu(), at::full({k}, sum))) << "all_reduce read the input before it was written";
  EXPECT_TRUE(at::equal(rs_out.cpu(), at::full({k}, sum))) << "reduce_scatter";
  EXPECT_TRUE(at::equal(ag_out.cpu(), at::arange(1, N + 1, at::kFloat).repeat_interleave(k))) << "all_gather";
  EXPECT_TRUE(at::equal(bc.cpu(), at::full({k}, 7.0f))) << "broadcast";
}

// The result lands as raw bytes, as the CPU transports write it: the output's version counter does not
// move, and an output made under c10::InferenceMode takes it outside that mode. (The CPU half runs
// without a device too.)
TEST(StagedComm_CUDA, TheResultLandsAsRawBytesAsOnTheCpu) {
  Staged s = staged_group();
  const float n = s.comm->size();
  std::vector<c10::Device> devices{c10::kCPU};
  if (s.device.is_cuda()) devices.push_back(s.device);
  for (const c10::Device d : devices) {
    at::Tensor t = at::ones({1000}, at::TensorOptions().device(d));
    const auto before = t._version();
    s.comm->all_reduce(t);
    EXPECT_EQ(t._version(), before) << d;
    EXPECT_TRUE(at::equal(t.cpu(), at::full({1000}, n))) << d;
    at::Tensor inference;
    {
      c10::InferenceMode guard;
      inference = at::ones({1000}, at::TensorOptions().device(d));
    }
    EXPECT_NO_THROW(s.comm->all_reduce(inference)) << d;
    EXPECT_TRUE(at::equal(inference.cpu(), at::full({1000}, n))) << d;
  }
}

// Ranks that disagree on a size raise MismatchError on every rank; the group works afterwards.
TEST(StagedComm_CUDA, AMismatchRaisesEverywhereAndTheGroupGoesOn) {
  SKIP_WITHOUT_DEVICE();
  Staged s = staged_group();
  const int N = s.comm->size(), r = s.comm->rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  at::Tensor t = at::ones({r == 0 ? 100 : 101}, at::TensorOptions().device(s.device));
  EXPECT_THROW(s.comm->all_reduce(t), comm::MismatchError);
  at::Tensor u = at::ones({64}, at::TensorOptions().device(s.device));
  s.comm->all_reduce(u);
  EXPECT_TRUE(at::equal(u.cpu(), at::full({64}, static_cast<float>(N))));
}

}  // namespace
}  // namespace accel::test
