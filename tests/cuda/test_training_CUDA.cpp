// Training on CUDA devices through the Accelerator and the engine, checked against plain libtorch on
// the same device (the GPU half of what the CPU suites check; run by scripts/gpu_check.sh):
//   * every strategy (DDP, ZeRO-2/3, FULL_SHARD, SHARD_GRAD_OP) trains an MLP like plain libtorch;
//     at one rank the engine is a passthrough, at N ranks the reductions go over NCCL (one GPU each) or
//     are staged through host memory (ranks sharing a GPU: comm/cuda_comm.h);
//   * bf16 autocast on the device: the configured dtype inside acc.autocast(), fp32 masters stepped on
//     the device, training that follows fp32 within bf16's precision, accumulation windows that add
//     up in fp32 (offloaded too);
//   * fp16 with the dynamic loss scaler: an overflow skips the step and leaves the weights alone;
//   * fp8: Float8Linear through at::_scaled_mm (cuBLASLt) against the exact emulation and against a
//     bf16 Linear;
//   * more ranks on a node than GPUs share them, and are refused when the Accelerator starts under
//     ACCEL_CUDA_COMM=nccl;
//   * a checkpoint restores each rank's device generator (dropout resumes exactly);
//   * the sharded step on device masters runs PyTorch's fused multi-tensor kernels, also for a
//     DeepSpeed config's optimizer block (Adam with amsgrad) under its OneCycle schedule;
//   * offload_optimizer device cpu: the masters in pinned host memory train like the device, no reduced
//     gradient stays on the device after backward, and the side stream's copies queue behind the
//     compute stream without blocking the host.
// Every test skips without a CUDA device (and where ranks outnumber devices under ACCEL_CUDA_COMM=nccl).
#include "accelerator/accelerator.h"
#include "accelerator/rows.h"
#include "base/memory.h"
#include "comm/cuda_comm.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "kernels/cpu_gemm.h"
#include "mixed_precision/autocast.h"
#include "mixed_precision/float8_linear.h"
#include "optim/fused_step.h"
#include "sharding/flat_param.h"
#include "support/models.h"
#include "support/scoped_env.h"
#include "test_world.h"
#include "zero/host_copies.h"
#include "zero/param_offload.h"
#include "zero/sharded_optimizer.h"

#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

namespace accel::test {
namespace {

namespace fs = std::filesystem;

// Why this rank cannot run the CUDA tests here, or empty.
std::string cuda_skip_reason() {
  const int ndev = comm::cuda_device_count();
  if (ndev == 0) return "no CUDA device";
  const auto& topo = world()->topology();
  const int here = topo.simulated ? topo.world_size : topo.local_world_size;
  try {
    comm::choose_cuda_comm(comm::cuda_comm_requested(), comm::nccl_compiled(), here > ndev ? here : 0);
  } catch (const comm::InvalidArgument& e) {
    return e.what();
  }
  return {};
}
#define SKIP_WITHOUT_CUDA()                     \
  do {                                          \
    const std::string why = cuda_skip_reason(); \
    if (!why.empty()) GTEST_SKIP() << why;      \
  } while (0)

// This rank's device, as the Accelerator picks it.
c10::Device my_device() {
  const auto& topo = world()->topology();
  const int index = topo.simulated ? topo.rank : topo.local_rank;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index % comm::cuda_device_count()));
}

// A config file every rank reads (rank 0 writes it in the job's directory for them, test::scratch_dir).
std::string write_config(const std::string& name, const std::string& text) {
  static const std::string dir = scratch_dir("configs");
  const std::string p = dir + "/" + name;
  if (world()->rank() == 0) std::ofstream(p) << text;
  world()->barrier();
  return p;
}

AcceleratorOptions quiet(const std::string& file) {
  AcceleratorOptions o;
  o.config_file = file;
  o.report_ignored_keys = false;
  return o;
}

const std::string kUnits =
    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LinearImpl\n";

struct Case {
  std::string name, text;
};
std::vector<Case> strategies(const std::string& precision) {
  const std::string mp = "mixed_precision: " + precision + "\n";
  return {
      {"ddp_" + precision + ".yaml", "distributed_type: MULTI_GPU\n" + mp},
      {"zero2_" + precision + ".yaml", "distributed_type: DEEPSPEED\n" + mp + "deepspeed_config:\n  zero_stage: 2\n"},
      {"zero3_" + precision + ".yaml", "distributed_type: DEEPSPEED\n" + mp + "deepspeed_config:\n  zero_stage: 3\n"},
      {"full_shard_" + precision + ".yaml",
       "distributed_type: FSDP\n" + mp + "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n" + kUnits},
      {"shard_grad_op_" + precision + ".yaml",
       "distributed_type: FSDP\n" + mp + "fsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n" + kUnits},
  };
}

constexpr int64_t kG = 8;  // global batch
const std::vector<int64_t> kWidths{16, 64, 64, 4};

struct Batch {
  at::Tensor x, y;
};
Batch global_batch(int k, c10::Device dev) {
  at::manual_seed(700 + k);
  return {at::randn({kG, kWidths.front()}).to(dev), (0.1 * at::randn({kG, kWidths.back()})).to(dev)};
}
Batch my_rows(const Batch& b, int rank, int n) {
  const int64_t per = kG / n;
  return {b.x.narrow(0, rank * per, per), b.y.narrow(0, rank * per, per)};
}
DataLoader<Rows> loader_for_micro_batch() {
  return DataLoader<Rows>(Rows(at::zeros({kG, kWidths.front()}), at::zeros({kG, kWidths.back()})),
                          {.batch_size = kG, .split_batches = true});
}
std::shared_ptr<MLPImpl> make_mlp() {
  at::manual_seed(1234);
  return std::make_shared<MLPImpl>(kWidths);
}

// Plain libtorch on `dev`, the whole global batch: the parameters after `steps` AdamW steps.
std::map<std::string, at::Tensor> plain_reference(c10::Device dev, int steps, std::vector<double>* losses = nullptr) {
  auto m = make_mlp();
  m->to(dev);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int k = 0; k < steps; ++k) {
    Batch b = global_batch(k, dev);
    at::Tensor loss = at::mse_loss(m->forward(b.x), b.y);
    if (losses) losses->push_back(loss.item<double>());
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : m->named_parameters()) out[kv.key()] = kv.value().detach().cpu();
  return out;
}

struct Trained {
  std::map<std::string, at::Tensor> params;      // full, on the CPU, float32 (get_state_dict's, every rank)
  std::map<std::string, at::ScalarType> dtypes;  // as get_state_dict gave them (on the main process only)
  std::vector<double> losses;                    // this rank's
  c10::Device device = c10::kCPU;
};

// The MLP's full weights, float32 on the CPU, on every rank (in the MLP's order): get_state_dict gives
// them on the main process only, which sends them, so that every rank compares and no rank returns
// early from a test the others go on with. dtypes: as get_state_dict gave them (main process only).
std::map<std::string, at::Tensor> full_weights(Accelerator& acc,
                                               std::map<std::string, at::ScalarType>* dtypes = nullptr) {
  std::map<std::string, at::Tensor> full, out;
  for (auto& [name, v] : acc.get_state_dict()) {
    if (dtypes) (*dtypes)[name] = v.scalar_type();
    full[name] = v;
  }
  for (const auto& kv : make_mlp()->named_parameters()) {
    at::Tensor v = at::zeros(kv.value().sizes(), at::kFloat);
    if (acc.is_main_process()) {
      if (full.count(kv.key()))
        v.copy_(full.at(kv.key()));
      else
        ADD_FAILURE() << "get_state_dict has no " << kv.key();
    }
    world()->broadcast(v);
    out[kv.key()] = v;
  }
  return out;
}

// The same training through the Accelerator under `config` (each rank its rows of the batch).
// build_sharded: the MLP is built under acc.sharded_init(), each rank seeded differently (rank 0's
// values must win, as they do for the model built whole). On a device the scope shards the layers where
// prepare() moves them as shards (ZeRO-3 and FULL_SHARD over several ranks, offloaded parameters: the
// configs whose names say zero3 or full_shard), and nothing elsewhere: the model goes there whole.
Trained accelerated(const std::string& config, int steps, const std::function<void(Accelerator&)>& check = nullptr,
                    bool build_sharded = false) {
  Accelerator acc(quiet(config));
  std::shared_ptr<MLPImpl> model;
  if (build_sharded) {
    auto scope = acc.sharded_init();
    at::manual_seed(1234 + 100 * acc.process_index());
    model = std::make_shared<MLPImpl>(kWidths);
    const std::string name = std::filesystem::path(config).filename().string();
    const bool param_sharding = name.rfind("zero3", 0) == 0 || name.rfind("full_shard", 0) == 0;
    const bool offloaded = name.find("infinity") != std::string::npos;
    const bool as_shards = acc.device().is_cpu() || (param_sharding && (acc.num_processes() > 1 || offloaded));
    EXPECT_EQ(scope->units_sharded(), as_shards ? static_cast<std::int64_t>(kWidths.size() - 1) : 0);
  } else {
    model = make_mlp();
  }
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto loader = loader_for_micro_batch();
  auto p = acc.prepare(model, adamw, loader);
  Trained t;
  t.device = acc.device();
  if (t.device.is_cuda())  // this rank's GPU is the current device, as Accelerate's set_device makes it
    EXPECT_EQ(c10::impl::VirtualGuardImpl(c10::kCUDA).getDevice(), t.device);
  for (int k = 0; k < steps; ++k) {
    Batch b = my_rows(global_batch(k, acc.device()), acc.process_index(), acc.num_processes());
    at::Tensor loss;
    {
      auto ac = acc.autocast();
      loss = at::mse_loss(model->forward(b.x).to(at::kFloat), b.y);
    }
    t.losses.push_back(loss.item<double>());
    acc.backward(loss);
    p->step();
    p->zero_grad();
  }
  if (check) check(acc);
  t.params = full_weights(acc, &t.dtypes);
  return t;
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / (b.to(at::kDouble).norm() + 1e-30)).item<double>();
}

TEST(CudaTraining_CUDA, EveryStrategyTrainsLikePlainLibtorchOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  const int steps = 5;
  for (const auto& c : strategies("no")) {
    SCOPED_TRACE(c.name);
    Trained t = accelerated(write_config(c.name, c.text), steps);
    ASSERT_TRUE(t.device.is_cuda()) << "the Accelerator should train on the GPU";
    const auto ref = plain_reference(t.device, steps);
    EXPECT_EQ(t.params.size(), ref.size());
    // One rank: the same kernels in the same order. More: the reductions' summation order only.
    const double tol = world()->size() == 1 ? 1e-6 : 1e-5;
    for (const auto& [name, want] : ref) EXPECT_LE(rel_err(t.params.at(name), want), tol) << name;
    for (const auto& [name, dtype] : t.dtypes) EXPECT_EQ(dtype, at::kFloat) << name;
  }
}

// The engine's sharded step on device masters goes through PyTorch's fused multi-tensor kernels
// (optim/multi_tensor_step.h), counted with the CPU's fused steps: one per optimizer step, and the
// training still follows plain libtorch (EveryStrategyTrainsLikePlainLibtorchOnTheDevice's tolerance).
TEST(CudaTraining_CUDA, TheShardedStepOnTheDeviceRunsPyTorchsFusedKernels) {
  SKIP_WITHOUT_CUDA();
  if (world()->size() == 1) GTEST_SKIP() << "at one rank fp32 is a passthrough: the user's own optimizer steps";
  const std::uint64_t before = optim::fused_steps();
  const int steps = 4;
  Trained t = accelerated(
      write_config("zero3_fused.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"), steps);
  EXPECT_EQ(optim::fused_steps() - before, static_cast<std::uint64_t>(steps));
  const auto ref = plain_reference(t.device, steps);
  for (const auto& [name, want] : ref) EXPECT_LE(rel_err(t.params.at(name), want), 1e-5) << name;
}

// A DeepSpeed config's optimizer and scheduler blocks on the device (Accelerator::create_optimizer,
// create_scheduler): Adam with L2 weight decay and amsgrad (adam_w_mode false: at several ranks PyTorch's
// fused Adam over the device masters, its max_exp_avg_sq list included) under OneCycle, which sets the
// learning rate and both betas before every step. Plain libtorch's Adam on the device, given each
// step's lr and betas as the schedule set them, trains to the same weights.
TEST(CudaTraining_CUDA, AConfigsOptimizerAndScheduleTrainOnTheDeviceLikePlainLibtorch) {
  SKIP_WITHOUT_CUDA();
  const int steps = 6;
  Accelerator acc(quiet(write_config("config_blocks.json", R"({
    "train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2},
    "optimizer": {"type": "Adam", "params": {"lr": "auto", "weight_decay": 0.01, "amsgrad": true,
                                             "adam_w_mode": false}},
    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
                                                 "cycle_first_step_size": 2, "cycle_min_mom": 0.85,
                                                 "cycle_max_mom": 0.95}}})")));
  ASSERT_TRUE(acc.device().is_cuda()) << "the Accelerator should train on the GPU";
  auto model = make_mlp();
  auto opt = acc.create_optimizer(model->parameters(), {.lr = 5e-3});
  ASSERT_TRUE(dynamic_cast<torch::optim::Adam*>(opt.get())) << "adam_w_mode false builds torch's Adam";
  auto loader = loader_for_micro_batch();
  auto p = acc.prepare(model, *opt, loader);
  auto sched = acc.create_scheduler({.total_num_steps = steps});
  struct Hyper {
    double lr, beta1, beta2;
  };
  std::vector<Hyper> hyper;  // each step's, as the schedule set them
  const std::uint64_t fused_before = optim::fused_steps();
  for (int k = 0; k < steps; ++k) {
    Batch b = my_rows(global_batch(k, acc.device()), acc.process_index(), acc.num_processes());
    acc.backward(at::mse_loss(model->forward(b.x), b.y));
    const auto& o = static_cast<const torch::optim::AdamOptions&>(p->inner().param_groups()[0].options());
    hyper.push_back({o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas())});
    p->step();
    sched->step();
    p->zero_grad();
  }
  if (world()->size() > 1)  // (one rank in fp32 is a passthrough: the optimizer itself steps)
    EXPECT_EQ(optim::fused_steps() - fused_before, static_cast<std::uint64_t>(steps)) << "not PyTorch's fused Adam";
  EXPECT_TRUE(std::any_of(hyper.begin(), hyper.end(), [&](const Hyper& h) { return h.lr != hyper[0].lr; }))
      << "OneCycle did not move the learning rate";
  EXPECT_TRUE(std::any_of(hyper.begin(), hyper.end(), [&](const Hyper& h) { return h.beta1 != hyper[0].beta1; }))
      << "OneCycle did not move beta1";

  auto ref = make_mlp();
  ref->to(acc.device());
  torch::optim::Adam adam(ref->parameters(), torch::optim::AdamOptions(hyper[0].lr).weight_decay(0.01).amsgrad(true));
  for (int k = 0; k < steps; ++k) {
    auto& o = static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options());
    o.lr(hyper[k].lr);
    o.betas({hyper[k].beta1, hyper[k].beta2});
    Batch b = global_batch(k, acc.device());
    at::mse_loss(ref->forward(b.x), b.y).backward();
    adam.step();
    adam.zero_grad();
  }
  const double tol = world()->size() == 1 ? 1e-6 : 1e-5;  // (as EveryStrategyTrainsLikePlainLibtorchOnTheDevice)
  const auto got = full_weights(acc);
  for (const auto& kv : ref->named_parameters())
    EXPECT_LE(rel_err(got.at(kv.key()), kv.value().detach().cpu()), tol) << kv.key();
}

// bf16 compute, fp32 reduction on the device: an accumulation window of 4 micro-steps adds up in fp32
// (MixedPrecision.Bf16AccumulationAddsInFp32 on the CPU), under every strategy and with the optimizer
// offloaded to host memory (the window's sum reduced and sent there). The window's master gradient,
// times 4 (exact), against the fp64 sum of each micro-batch's own reduced gradient (measured on the
// CPU: 0 at 1 and 2 ranks, 8.3e-8 at 3); added in bf16 it was off by 2.9e-3 to 5.4e-3.
TEST(CudaTraining_CUDA, Bf16WindowsAddUpInFp32OnTheDevice) {
  SKIP_WITHOUT_CUDA();
  const std::int64_t K = 4;
  std::vector<Case> cases = strategies("bf16");
  cases.push_back({"zero3_offload_bf16.yaml",
                   "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  zero_stage: 3\n"
                   "  offload_optimizer_device: cpu\n"});
  // This rank's master gradients (fp64, on the CPU; undefined where a flat has none) after the backward
  // passes of batches `ks`, as one window of micro-steps (accum > 1) or as sync backwards (accum 1).
  auto grads_after = [](const std::string& config, const std::vector<int>& ks, std::int64_t accum) {
    AcceleratorOptions o = quiet(config);
    o.gradient_accumulation_steps = accum;
    Accelerator acc(o);
    EXPECT_TRUE(acc.device().is_cuda());
    auto model = make_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    auto loader = loader_for_micro_batch();
    auto p = acc.prepare(model, sgd, loader);
    for (int k : ks) {
      std::optional<Accelerator::AccumulateScope> scope;
      if (accum > 1) scope.emplace(acc.accumulate());
      Batch b = my_rows(global_batch(k, acc.device()), acc.process_index(), acc.num_processes());
      at::Tensor loss;
      {
        auto ac = acc.autocast();
        loss = at::mse_loss(model->forward(b.x).to(at::kFloat), b.y);
      }
      acc.backward(loss);
    }
    std::vector<at::Tensor> out;
    for (const auto& f : acc.engine()->flats())
      out.push_back(f.master.defined() && f.master.grad().defined() ? f.master.grad().to(at::kCPU, at::kDouble)
                                                                    : at::Tensor());
    return out;
  };
  const std::vector<int> batches = {0, 1, 2, 3};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string config = write_config(c.name, c.text);
    std::vector<at::Tensor> want;
    for (int k : batches) {
      auto g = grads_after(config, {k}, 1);
      if (want.empty()) {
        want = g;
        continue;
      }
      for (std::size_t i = 0; i < g.size(); ++i)
        if (g[i].defined()) want[i] += g[i];
    }
    const auto got = grads_after(config, batches, K);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].defined(), want[i].defined()) << i;
      if (got[i].defined()) EXPECT_LE(rel_err(got[i] * K, want[i]), 1e-6) << "flat " << i;
    }
  }
}

// save_state keeps each rank's device generator beside its CPU one, and load_state puts it back:
// dropout on the device after a resume draws what it drew after the save (issue 35, exact resume).
TEST(CudaTraining_CUDA, ACheckpointRestoresEveryRanksDeviceGenerator) {
  SKIP_WITHOUT_CUDA();
  Accelerator acc(
      quiet(write_config("zero3_rng.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n")));
  auto model = std::make_shared<MLPImpl>(std::vector<int64_t>{4, 8, 2});
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto loader = loader_for_micro_batch();  // (the micro batch; the config names none)
  auto prepared = acc.prepare(model, adamw, loader);
  ASSERT_TRUE(acc.device().is_cuda());
  at::manual_seed(7 + acc.process_index());  // each rank its own stream, CPU and device
  at::rand({3}, at::TensorOptions().device(acc.device()));
  const std::string dir = fs::path(write_config("rng_marker", "")).parent_path().string() + "/rng_ckpt";
  acc.save_state(dir);
  const at::Tensor device_after = at::rand({16}, at::TensorOptions().device(acc.device())).cpu();
  const at::Tensor cpu_after = at::rand({16});
  at::rand({1000}, at::TensorOptions().device(acc.device()));  // move both generators on
  at::rand({1000});
  acc.load_state(dir);
  EXPECT_TRUE(at::equal(at::rand({16}, at::TensorOptions().device(acc.device())).cpu(), device_after))
      << "the device generator was not restored";
  EXPECT_TRUE(at::equal(at::rand({16}), cpu_after)) << "the CPU generator was not restored";
}

// offload_optimizer device cpu (ZeRO-Offload): the fp32 masters and AdamW's moments live in pinned host
// memory and are stepped there by the fused CPU kernel; the device holds parameters and gradients
// only. Training follows plain libtorch on the device (CPU and CUDA AdamW round differently).
TEST(CudaTraining_CUDA, OffloadOptimizerToHostMemoryTrainsLikeTheDevice) {
  SKIP_WITHOUT_CUDA();
  const int steps = 5;
  for (const char* stage : {"1", "2", "3"}) {
    SCOPED_TRACE(std::string("zero_stage ") + stage);
    const std::string yaml = std::string("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: ") + stage +
                             "\n  offload_optimizer_device: cpu\n";
    bool checked = false;
    Trained t =
        accelerated(write_config(std::string("offload_cpu_") + stage + ".yaml", yaml), steps, [&](Accelerator& acc) {
          for (const auto& group : acc.engine()->optimizer_params())
            for (const auto& m : group) {
              EXPECT_TRUE(m.device().is_cpu()) << "a master on " << m.device();
              EXPECT_TRUE(m.is_pinned());
              checked = true;
            }
        });
    EXPECT_TRUE(checked);
    ASSERT_TRUE(t.device.is_cuda());
    const auto ref = plain_reference(t.device, steps);
    for (const auto& [name, want] : ref) EXPECT_LE(rel_err(t.params.at(name), want), 1e-5) << name;
  }
}

// Under offload_optimizer device cpu each reduced gradient leaves for the host as its bucket finishes,
// and the device lets go of it: after backward the device holds no gradient (without offload it
// holds this rank's shard of them, or all of them at one rank, until the step). Without offload the
// first step shows it (later ones reuse the reduce-scatter's output buffer, allocated before their
// forward); offloaded, the second step (every lazy allocation made) must keep none.
TEST(CudaTraining_CUDA, OffloadedOptimizerKeepsNoGradientOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  const std::vector<int64_t> widths{64, 512, 512, 512, 4};
  // Per step: device bytes allocated after its backward, less those before its forward.
  auto kept_after_backward = [&](const std::string& name, const std::string& extra) {
    Accelerator acc(
        quiet(write_config(name, "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: " + extra)));
    at::manual_seed(11);
    auto model = std::make_shared<MLPImpl>(widths);
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
    auto loader = loader_for_micro_batch();  // (the micro batch; the config names none)
    auto p = acc.prepare(model, adamw, loader);
    const c10::DeviceIndex index = acc.device().index();
    auto allocated = [&] {
      return at::accelerator::getDeviceStats(index)
          .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
          .current;
    };
    std::vector<std::int64_t> kept;
    for (int k = 0; k < 2; ++k) {
      at::manual_seed(100 + k + acc.process_index());
      const at::Tensor x = at::randn({kG / acc.num_processes(), widths.front()}, acc.device());
      const std::int64_t before = allocated();
      at::Tensor loss = model->forward(x).pow(2).mean();
      acc.backward(loss);
      loss = at::Tensor();
      kept.push_back(allocated() - before);
      p->step();
      p->zero_grad();
    }
    return kept;
  };
  std::int64_t numel = 0;
  for (const auto& t : std::make_shared<MLPImpl>(widths)->parameters()) numel += t.numel();
  const double shard_bytes = 4.0 * static_cast<double>(numel) / world()->size();
  for (const char* stage : {"2", "3"}) {
    SCOPED_TRACE(std::string("zero_stage ") + stage);
    const auto on_device = kept_after_backward(std::string("grads_dev_") + stage + ".yaml", stage + std::string("\n"));
    const auto offloaded = kept_after_backward(std::string("grads_host_") + stage + ".yaml",
                                               stage + std::string("\n  offload_optimizer_device: cpu\n"));
    EXPECT_GE(static_cast<double>(on_device[0]), 0.9 * shard_bytes) << "without offload the reduced gradients stay";
    EXPECT_LE(static_cast<double>(offloaded[1]), 0.05 * shard_bytes)
        << "offloaded: " << offloaded[1]
        << " B still allocated after the second backward (the shard's gradients: " << shard_bytes << " B)";
  }
}

// Sharded construction on a device (each rank seeded differently): where prepare() moves units as this
// rank's shards (ZeRO-3 and FULL_SHARD over several ranks, parameter offload at any world) the MLP's
// layers are sharded on the host as they are built; elsewhere (DDP, ZeRO-1/2, SHARD_GRAD_OP, one rank)
// the scope shards nothing and prepare() takes rank 0's values. Every strategy, fp32 and bf16, then
// trains bitwise like the model built whole.
TEST(CudaTraining_CUDA, ShardedInitTrainsLikeTheModelBuiltWhole) {
  SKIP_WITHOUT_CUDA();
  std::vector<Case> cases = strategies("no");
  for (const auto& c : strategies("bf16")) cases.push_back(c);
  // ZeRO-Infinity (the host build at one rank too) and ZeRO-1.
  cases.push_back({"zero3_infinity_init.yaml",
                   "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: cpu\n"
                   "  offload_param_device: cpu\n"});
  cases.push_back({"zero1_init.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 1\n"});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string config = write_config(c.name, c.text);
    const Trained whole = accelerated(config, 3);
    const Trained sharded = accelerated(config, 3, nullptr, /*build_sharded=*/true);
    EXPECT_EQ(sharding::presharded_count(), 0) << "prepare() gives every unit its values back";
    ASSERT_EQ(whole.params.size(), sharded.params.size());
    for (const auto& [name, v] : whole.params) EXPECT_TRUE(at::equal(sharded.params.at(name), v)) << name;
    EXPECT_EQ(whole.losses, sharded.losses);
  }
}

// A model handed to prepare() on the host (as it was built) under `config`, against the same model moved
// to the device by the user first: the device bytes at the peak of moving and prepare() beyond what was
// there before, as a share of the model's fp32 bytes, for each; and training after prepare() bitwise the
// same (the state dicts after 3 steps).
struct HostBuilt {
  double host_peak = 0, device_peak = 0;  // prepare()'s peak / the model's bytes: handed over on the host, moved first
  std::int64_t model_bytes = 0;
};
HostBuilt prepare_from_the_host(const std::string& config) {
  const std::vector<int64_t> widths{256, 1024, 1024, 1024, 1024, 4};
  HostBuilt out;
  for (const auto& t : std::make_shared<MLPImpl>(widths)->parameters()) out.model_bytes += 4 * t.numel();
  struct Result {
    std::int64_t prepare_peak = 0;  // device bytes at the peak of moving (the user's) and prepare(), beyond before
    std::map<std::string, at::Tensor> state;
  };
  auto train = [&](bool user_moves_it) {
    Accelerator acc(quiet(config));
    at::manual_seed(3);
    auto model = std::make_shared<MLPImpl>(widths);
    const c10::DeviceIndex index = acc.device().index();
    const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    at::accelerator::resetPeakStats(index);
    const std::int64_t before = at::accelerator::getDeviceStats(index).allocated_bytes[agg].current;
    if (user_moves_it) model->to(acc.device());  // (counted: the device holds the whole model from here)
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
    auto loader = loader_for_micro_batch();  // (the micro batch; the config names none)
    auto p = acc.prepare(model, adamw, loader);
    Result r;
    r.prepare_peak = at::accelerator::getDeviceStats(index).allocated_bytes[agg].peak - before;
    for (int k = 0; k < 3; ++k) {
      at::manual_seed(200 + k + acc.process_index());
      const at::Tensor x = at::randn({kG / acc.num_processes(), widths.front()}, acc.device());
      at::Tensor loss;
      {
        auto ac = acc.autocast();  // (the configured dtype: bf16 parameters take bf16 inputs)
        loss = model->forward(x).to(at::kFloat).pow(2).mean();
      }
      acc.backward(loss);
      p->step();
      p->zero_grad();
    }
    for (auto& [name, v] : acc.get_state_dict()) r.state[name] = v;
    return r;
  };
  const Result on_host = train(false), on_device = train(true);
  out.host_peak = static_cast<double>(on_host.prepare_peak) / static_cast<double>(out.model_bytes);
  out.device_peak = static_cast<double>(on_device.prepare_peak) / static_cast<double>(out.model_bytes);
  EXPECT_EQ(on_host.state.size(), on_device.state.size());
  for (const auto& [name, v] : on_device.state) {
    const auto it = on_host.state.find(name);
    if (it == on_host.state.end())
      ADD_FAILURE() << name << " is missing from the state of the model handed over on the host";
    else
      EXPECT_TRUE(at::equal(it->second, v)) << name;
  }
  return out;
}

// ZeRO-Infinity from a device: a model handed to prepare() on the host is flattened and sharded there,
// and each unit reaches the device only as its (offloaded, empty) buffers: the device never holds the
// whole model, as it did when prepare() first moved the model there. Training is bitwise the same as
// with the model moved to the device by the user before prepare().
TEST(CudaTraining_CUDA, OffloadedParamsNeverPutTheWholeModelOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  const HostBuilt r = prepare_from_the_host(write_config(
      "infinity.yaml",
      "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: true\n" +
          kUnits));
  EXPECT_GE(r.device_peak, 0.9) << "a model moved first is on the device whole";
  EXPECT_LE(r.host_peak, 0.5 / world()->size()) << "preparing the model from the host put " << r.host_peak
                                                << " of the model's " << r.model_bytes << " B on the device";
}

// ZeRO-3 and FULL_SHARD without offload over more than one rank (as FSDP moves a module on the CPU to its
// device_id unit by unit): each unit reaches the device as this rank's shard, so prepare() puts 1/N of the
// model there (fp32), or 1.5/N (bf16 shards beside fp32 masters), where a model moved first puts all of it.
// At one rank nothing is sharded and the whole model is moved, as before.
TEST(CudaTraining_CUDA, ShardedParamsNeverPutTheWholeModelOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  const int N = world()->size();
  struct Config {
    std::string file, yaml;
    double shard_bytes;  // device bytes per model byte a rank's shards take, times N
  };
  for (const Config& c :
       {Config{"full_shard.yaml",
               "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n" + kUnits, 1.0},
        Config{"zero3_bf16.yaml",
               "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  zero_stage: 3\n", 1.5}}) {
    SCOPED_TRACE(c.file);
    const HostBuilt r = prepare_from_the_host(write_config(c.file, c.yaml));
    EXPECT_GE(r.device_peak, 0.9) << "a model moved first is on the device whole";
    if (N == 1) {
      EXPECT_GE(r.host_peak, 0.9) << "one rank shards nothing: the whole model is moved";
      continue;
    }
    // (Each flat is padded to a multiple of N elements; the root unit is one scalar.)
    EXPECT_LE(r.host_peak, 1.1 * c.shard_bytes / N) << "preparing the model from the host put " << r.host_peak
                                                    << " of the model's " << r.model_bytes << " B on the device";
  }
}

// offload_param device cpu and nvme under ZeRO-3 (ZeRO-Infinity): the parameter shards leave the
// device, in pinned host memory or a file, and come back before each gather. The optimizer stays on
// the device, so training is bitwise the same as without offload; with the optimizer offloaded too
// (as the shipped zero3_offload config does, and to nvme) it is bitwise the optimizer's offload alone
// (the same CPU AdamW) and follows plain libtorch on the device.
// (gpu_check.sh runs the GPT example under the shipped config itself.)
TEST(CudaTraining_CUDA, OffloadParamsToHostMemoryAndNvmeTrainsLikeTheDevice) {
  SKIP_WITHOUT_CUDA();
  const int steps = 4;
  const std::string base = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n";
  const Trained plain3 = accelerated(write_config("zero3_plain.yaml", base), steps);
  ASSERT_TRUE(plain3.device.is_cuda());
  // The optimizer alone in host memory: the CPU AdamW the "both" cases step with, so their bits.
  const Trained opt_cpu =
      accelerated(write_config("zero3_opt_cpu.yaml", base + "  offload_optimizer_device: cpu\n"), steps);
  const std::string dir = fs::path(write_config("nvme_dir_marker", "")).parent_path().string();
  struct OffloadCase {
    const char* name;
    std::string yaml;
    bool host, bitwise;
  };
  const std::vector<OffloadCase> cases = {
      {"param_cpu", base + "  offload_param_device: cpu\n", true, true},
      {"param_nvme", base + "  offload_param_device: nvme\n  offload_param_nvme_path: " + dir + "\n", false, true},
      {"both_cpu", base + "  offload_param_device: cpu\n  offload_optimizer_device: cpu\n", true, false},
      {"both_nvme",
       base + "  offload_param_device: nvme\n  offload_param_nvme_path: " + dir +
           "\n  offload_optimizer_device: nvme\n  offload_optimizer_nvme_path: " + dir + "\n",
       false, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    bool offloaded = false;
    Trained t = accelerated(write_config(std::string(c.name) + ".yaml", c.yaml), steps, [&](Accelerator& acc) {
      const auto* po = acc.engine()->param_offload();
      ASSERT_NE(po, nullptr) << "no parameter offload";
      EXPECT_EQ(po->in_host_memory(), c.host);
      // fp32 shards over fp32 host masters (both_cpu): the masters are their pinned copies.
      const bool twins = c.host && std::string(c.name) == "both_cpu";
      EXPECT_EQ(po->owned_bytes(), twins ? 0 : po->bytes()) << "host bytes of the parameter shards' own";
      offloaded = true;
    });
    EXPECT_TRUE(offloaded);
    ASSERT_TRUE(t.device.is_cuda());
    if (c.bitwise) {
      for (const auto& [name, want] : plain3.params) EXPECT_TRUE(at::equal(t.params.at(name), want)) << name;
    } else {
      // Where the parameters live does not change the optimizer's bits (nor does the state on disk).
      for (const auto& [name, want] : opt_cpu.params) EXPECT_TRUE(at::equal(t.params.at(name), want)) << name;
      const auto ref = plain_reference(t.device, steps);
      for (const auto& [name, want] : ref) EXPECT_LE(rel_err(t.params.at(name), want), 1e-5) << name;
    }
  }
}

// ZeRO-3 over an MLP on the device whose units are 8-16 MiB (each gradient's copy to the host takes long
// enough that a step not waiting for it would read a half-written gradient), its optimizer (AdamW) and,
// with params_too, its parameter shards in host memory.
struct OffloadedMlp {
  std::shared_ptr<MLPImpl> model;
  zero::EngineAndOptimizer p;
  std::int64_t bytes = 0;  // the model's parameters in fp32
};
OffloadedMlp offloaded_mlp(const c10::Device& dev, std::shared_ptr<comm::Communicator> world, bool params_too,
                           bool in_backward, bool bucket_per_flat = false) {
  at::manual_seed(5);
  OffloadedMlp m;
  m.model = std::make_shared<MLPImpl>(std::vector<int64_t>{512, 2048, 2048, 16});
  for (const auto& t : m.model->parameters()) m.bytes += 4 * t.numel();
  m.model->to(dev);
  torch::optim::AdamW user(m.model->parameters(), torch::optim::AdamWOptions(1e-2));
  zero::ShardingSpec spec = zero::ShardingSpec::zero(3);
  spec.offload.optimizer = zero::OffloadDevice::Cpu;
  if (params_too) spec.offload.param = zero::OffloadDevice::Cpu;
  spec.step_in_backward = in_backward;
  if (bucket_per_flat) {  // one flat a bucket, one bucket in flight: each is reduced as it is launched
    spec.bucket_bytes = 0;
    spec.grad_buckets_in_flight = 1;
  }
  m.p = zero::prepare(m.model, user, spec, std::move(world));
  return m;
}

// ShardingSpec::step_in_backward over a device's masters in host memory (ZeRO-Offload, and with the
// parameter shards there too): each master's fused CPU step runs on the worker once its gradient's copy
// to the host has arrived, while the device's backward goes on; the same bits as the step in step().
TEST(StepInBackward_CUDA, HostMastersStepDuringBackwardWithTheSameBits) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (const bool params_too : {false, true}) {
    SCOPED_TRACE(params_too ? "optimizer and parameters in host memory" : "optimizer in host memory");
    std::vector<at::Tensor> masters[2];
    std::vector<double> losses[2];
    for (const bool in_backward : {false, true}) {
      auto [mdl, p, bytes] = offloaded_mlp(dev, world, params_too, in_backward);
      std::size_t optimized = 0;
      for (const auto& f : p.engine->flats()) optimized += f.group >= 0 ? 1 : 0;
      for (int step = 0; step < 3; ++step) {
        at::manual_seed(100 + step);
        const at::Tensor x = at::randn({8 * N, 512}).to(dev), y = at::randn({8 * N, 16}).to(dev);
        const at::Tensor loss = at::mse_loss(mdl->forward(x.narrow(0, 8 * r, 8)), y.narrow(0, 8 * r, 8));
        losses[in_backward].push_back(loss.item<double>());
        p.engine->backward(loss);
        EXPECT_EQ(p.engine->stepped_in_backward().size(), in_backward ? optimized : 0u);
        p.optimizer->step();
        p.optimizer->zero_grad();
      }
      for (const auto& f : p.engine->flats())
        if (f.group >= 0) {
          EXPECT_TRUE(f.master.is_cpu()) << "a host master";
          masters[in_backward].push_back(f.master.clone());
        }
    }
    ASSERT_EQ(masters[1].size(), masters[0].size());
    for (std::size_t i = 0; i < masters[0].size(); ++i) EXPECT_TRUE(at::equal(masters[1][i], masters[0][i])) << i;
    EXPECT_EQ(losses[1], losses[0]);
  }
}

// Accumulation under ZeRO-Offload whose micro-steps each reduce (Engine::MoreMicroSteps: DeepSpeed's
// ZeRO-2/3, sync_each_batch): each micro-step's reduced gradient is added to the pending one in host
// memory on its way there (HostCopies::add_to_host), so between micro-steps the device keeps no gradient,
// where NoSync keeps every unit's unsharded one. The sum is the one NoSync makes (bitwise at one rank,
// where the reductions are exact), and the step in backward after the last micro-step waits for it.
TEST(StepInBackward_CUDA, MicroStepsThatReduceAddUpInHostMemory) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  auto world = test::world();
  const int N = world->size(), r = world->rank(), accum = 3;
  const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  auto allocated = [&] { return at::accelerator::getDeviceStats(dev.index()).allocated_bytes[agg].current; };
  struct Run {
    std::vector<at::Tensor> masters;
    std::vector<double> losses;
    // Most device bytes a micro-step before the last kept after its backward (reducing: from the second
    // step on, every lazy allocation made).
    std::int64_t kept = 0;
    std::size_t stepped = 0;
  };
  std::int64_t model_bytes = 0;
  auto train = [&](bool each, bool in_backward, bool params_too) {
    auto [mdl, p, bytes] = offloaded_mlp(dev, world, params_too, in_backward);
    model_bytes = bytes;
    Run out;
    for (int step = 0; step < 3; ++step) {
      for (int m = 0; m < accum; ++m) {
        at::manual_seed(100 + 10 * step + m);
        const at::Tensor x = at::randn({8 * N, 512}).to(dev), y = at::randn({8 * N, 16}).to(dev);
        const std::int64_t before = allocated();
        at::Tensor loss = at::mse_loss(mdl->forward(x.narrow(0, 8 * r, 8)), y.narrow(0, 8 * r, 8)) / accum;
        if (m == 0) out.losses.push_back(loss.item<double>());
        std::optional<zero::Engine::NoSync> no_sync;
        std::optional<zero::Engine::MoreMicroSteps> more;
        if (m + 1 < accum) {
          if (each)
            more.emplace(*p.engine);
          else
            no_sync.emplace(*p.engine);
        }
        p.engine->backward(loss);
        loss = at::Tensor();
        if (m + 1 < accum && (step > 0 || !each)) out.kept = std::max(out.kept, allocated() - before);
      }
      out.stepped = p.engine->stepped_in_backward().size();
      p.optimizer->step();
      p.optimizer->zero_grad();
    }
    for (const auto& f : p.engine->flats())
      if (f.group >= 0) out.masters.push_back(f.master.clone());
    return out;
  };
  for (const bool params_too : {false, true}) {
    SCOPED_TRACE(params_too ? "optimizer and parameters in host memory" : "optimizer in host memory");
    const Run unreduced = train(false, false, params_too), each = train(true, false, params_too),
              each_in_backward = train(true, true, params_too);
    EXPECT_GE(static_cast<double>(unreduced.kept), 0.9 * model_bytes) << "NoSync keeps the unsharded gradients";
    EXPECT_LE(static_cast<double>(each.kept), 0.05 * model_bytes)
        << each.kept << " B kept on the device after a micro-step that reduced (the model: " << model_bytes << " B)";
    ASSERT_EQ(each.masters.size(), unreduced.masters.size());
    ASSERT_FALSE(each.masters.empty());
    for (std::size_t i = 0; i < each.masters.size(); ++i) {
      if (N == 1)
        EXPECT_TRUE(at::equal(each.masters[i], unreduced.masters[i])) << i;
      else
        EXPECT_LE(rel_err(each.masters[i], unreduced.masters[i]), 1e-5) << i;
    }
    if (N == 1) EXPECT_EQ(each.losses, unreduced.losses);
    // The step in backward after the last micro-step: every master, on the sum, the same bits.
    EXPECT_EQ(each_in_backward.stepped, each.masters.size());
    for (std::size_t i = 0; i < each.masters.size(); ++i)
      EXPECT_TRUE(at::equal(each_in_backward.masters[i], each.masters[i])) << i;
    EXPECT_EQ(each_in_backward.losses, each.losses);
  }
}

// A sharded flat's storage, freed and allocated again between uses (alloc_storage), lands on the
// tensor's own device whichever device this thread has current (the CUDA allocator goes by the
// current one). Needs two GPUs.
TEST(FlatParam_CUDA, StorageIsAllocatedAgainOnTheTensorsDevice) {
  SKIP_WITHOUT_CUDA();
  if (at::detail::getCUDAHooks().deviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  const c10::Device second(c10::kCUDA, 1);
  const at::Tensor t = at::arange(1 << 20, at::TensorOptions().dtype(at::kFloat).device(second));
  sharding::free_storage(t);
  c10::DeviceGuard first(c10::Device(c10::kCUDA, 0));
  sharding::alloc_storage(t, static_cast<std::size_t>(t.numel()) * sizeof(float));
  // The allocator's record of where the memory is (the device current when it allocated), not the tensor's claim.
  EXPECT_EQ(t.storage().data_ptr().device(), second);
  EXPECT_EQ(t.fill_(3).cpu().sum().item<double>(), 3.0 * t.numel());
}

// Queues `count` 4096 x 4096 matmuls on the current stream: work a side stream's copy must queue
// behind, long enough that the host gets past the copy's call before the device is done.
void queue_matmuls(const c10::Device& dev, int count) {
  const at::Tensor w = at::randn({4096, 4096}, at::TensorOptions().device(dev)) * (1.0 / 64);
  at::Tensor acc = w;
  for (int i = 0; i < count; ++i) acc = at::mm(acc, w);
}

// Whether the current stream has already done all that is queued on it (false: the host got here
// before the device finished, so nothing since made the host wait for it).
bool current_stream_done(const c10::Device& dev) {
  c10::Event now(c10::kCUDA);
  now.record(c10::impl::VirtualGuardImpl(c10::kCUDA).getStream(dev));
  return now.query();
}

// A 512 MiB copy to queue on `copies`' to-device stream, so that what is queued there next lands tens
// of milliseconds after the compute stream's queued work ends: a kernel the compute stream runs
// without waiting for it reads the bytes from before. Its buffers are allocated when it is made,
// before any work is queued: allocating device or page-locked memory may make the host wait for the
// device, which would hide the very waits the tests look for.
struct CopyDelay {
  at::Tensor src, dst;
  explicit CopyDelay(const c10::Device& dev)
      : src(at::empty({int64_t{1} << 29}, at::TensorOptions().dtype(at::kByte).pinned_memory(true))),
        dst(at::empty({int64_t{1} << 29}, at::TensorOptions().dtype(at::kByte).device(dev))) {}
  void queue(zero::HostCopies& copies) const { (void)copies.to_device_async(dst, src); }
};

// Two flat parameters of n elements on the device, sharded over a world of one (the shard is the
// whole buffer), with the values they started from.
struct TwoFlats {
  TwoFlats(const c10::Device& dev, int64_t n)
      : a0(at::randn({n}, at::TensorOptions().device(dev))),
        b0(at::randn({n}, a0.options())),
        a("a", {a0.clone().requires_grad_()}, {"a"}, options()),
        b("b", {b0.clone().requires_grad_()}, {"b"}, options()) {}
  static sharding::FlatParam::Options options() {
    sharding::FlatParam::Options o;
    o.sharded = true;
    return o;
  }
  at::Tensor a0, b0;
  sharding::FlatParam a, b;
};

// The side stream of offload to host memory (zero/host_copies.h): a copy queues behind what the
// current stream has queued (it sees the values written there) and returns before that work is done;
// the current stream's next kernels see what to_device wrote.
TEST(HostCopies_CUDA, CopiesQueueBehindTheComputeStreamWithoutBlockingTheHost) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  const int64_t n = 1 << 22;
  at::Tensor src = at::zeros({n}, at::TensorOptions().device(dev));
  const at::Tensor host = at::empty({n}, at::TensorOptions().pinned_memory(true));
  zero::HostCopies copies(dev);

  queue_matmuls(dev, 100);  // ~0.3 s on the current stream
  src.fill_(7);             // queued behind the matmuls: the copy must wait for it
  copies.to_host(host, src);
  EXPECT_FALSE(current_stream_done(dev)) << "to_host returned only after the compute stream's work was done";
  copies.synchronize();
  EXPECT_TRUE(at::equal(host, at::full({n}, 7.0f))) << "to_host copied before the compute stream wrote src";

  const at::Tensor back = at::zeros({n}, at::TensorOptions().device(dev));
  host.copy_(at::arange(n, at::kFloat));
  queue_matmuls(dev, 100);
  copies.to_device(back, host);
  EXPECT_FALSE(current_stream_done(dev)) << "to_device blocked the host";
  const at::Tensor seen = back.clone();  // on the compute stream, which waits for the copy
  EXPECT_TRUE(at::equal(seen.cpu(), at::arange(n, at::kFloat))) << "the compute stream did not wait for to_device";
  copies.synchronize();
}

// A backward that throws after a micro-step that reduced, under ZeRO-Offload (OffloadEmulatedDevice's
// AFailedMicroStepKeepsTheWindowUnlessItAddedToIt, on the device):
// - thrown first in backward, before any bucket was reduced: nothing was added to the gradients pending
//   in host memory, so the window stays as it was (as in memory);
// - thrown at the first layer's output, after the root, fc2 and fc1 were reduced and added to them in
//   host memory: a sum cannot be taken back, so the window goes (every master's gradient) rather than a
//   sum holding part of the failed backward; the step then changes nothing.
TEST(StepInBackward_CUDA, AFailedMicroStepKeepsTheWindowUnlessItAddedToIt) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (const bool late : {false, true}) {
    SCOPED_TRACE(late ? "thrown at the first layer" : "thrown first");
    auto [mdl, p, bytes] = offloaded_mlp(dev, world, /*params_too=*/false, /*in_backward=*/false,
                                         /*bucket_per_flat=*/true);
    const at::Tensor x = at::randn({8 * N, 512}).to(dev), y = at::randn({8 * N, 16}).to(dev);
    {
      zero::Engine::MoreMicroSteps more(*p.engine);
      p.engine->backward(at::mse_loss(mdl->forward(x.narrow(0, 8 * r, 8)), y.narrow(0, 8 * r, 8)));
    }
    std::vector<at::Tensor> before, pending;
    for (const auto& f : p.engine->flats())
      if (f.group >= 0) {
        ASSERT_TRUE(f.master.grad().defined()) << "no pending gradient after the first micro-step";
        before.push_back(f.master.clone());
        pending.push_back(f.master.grad().clone());
      }
    ASSERT_FALSE(before.empty());
    auto throws = [](const at::Tensor& g) -> at::Tensor {
      if (g.defined()) throw std::runtime_error("injected");
      return g;
    };
    at::Tensor h = mdl->layers[0](x.narrow(0, 8 * r, 8));  // MLPImpl::forward, with the hook where it throws
    if (late) h.register_hook(throws);
    for (std::size_t i = 1; i < mdl->layers.size(); ++i) h = mdl->layers[i](at::tanh(h));
    at::Tensor out = h * mdl->scale;
    if (!late) out.register_hook(throws);
    EXPECT_THROW(p.engine->backward(at::mse_loss(out, y.narrow(0, 8 * r, 8))), std::exception);
    std::size_t k = 0;
    for (const auto& f : p.engine->flats()) {
      if (f.group < 0) continue;
      if (late) {
        EXPECT_FALSE(f.master.grad().defined()) << f.flat_param->name() << " kept a gradient";
      } else {
        ASSERT_TRUE(f.master.grad().defined()) << f.flat_param->name() << " lost a window nothing was added to";
        EXPECT_TRUE(at::equal(f.master.grad(), pending[k])) << f.flat_param->name() << ": the window changed";
      }
      ++k;
    }
    p.optimizer->step();
    k = 0;
    if (late)
      for (const auto& f : p.engine->flats())
        if (f.group >= 0) EXPECT_TRUE(at::equal(f.master, before[k++])) << "a step on a dropped window";
  }
}

// add_to_host (a micro-step's gradient added to the one pending in host memory): summed on the device
// behind the compute stream's queued work (src's value written there is the one added), without the
// host waiting for that work; after synchronize() dst holds the fp32 sum, the add's own rounding.
TEST(HostCopies_CUDA, AnAddToHostSumsOnTheDeviceWithoutBlockingTheHost) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  const int64_t n = 1 << 22;
  const at::Tensor pending = at::arange(n, at::kFloat) * 0.37;
  const at::Tensor host = zero::HostCopies::pinned_empty(n, at::kFloat, dev);
  host.copy_(pending);
  at::Tensor src = at::zeros({n}, at::TensorOptions().device(dev));
  zero::HostCopies copies(dev);
  queue_matmuls(dev, 100);  // ~0.3 s on the current stream
  src.fill_(1.25);          // queued behind the matmuls: the add must wait for it
  copies.add_to_host(host, src);
  EXPECT_FALSE(current_stream_done(dev)) << "add_to_host blocked the host";
  copies.synchronize();
  EXPECT_TRUE(at::equal(host, pending + 1.25f)) << "the sum is not pending + src";
}

// To the device in another dtype (fp32 masters in host memory to bf16 parameters): converted on the
// device, so the host goes on (ATen's copy_ converts on the host into pageable memory, whose copy
// blocks the host until the side stream gets to it, behind the compute stream's work).
TEST(HostCopies_CUDA, AConversionToTheDeviceRunsThereWithoutBlockingTheHost) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  const int64_t n = 1 << 22;
  const at::Tensor host = at::empty({n}, at::TensorOptions().pinned_memory(true));
  host.copy_(at::arange(n, at::kFloat) * 0.37);
  at::Tensor dst = at::zeros({n}, at::TensorOptions().device(dev).dtype(at::kBFloat16));
  zero::HostCopies copies(dev);
  queue_matmuls(dev, 100);
  dst.fill_(-1);  // behind the matmuls: the copy lands after it
  copies.to_device(dst, host);
  EXPECT_FALSE(current_stream_done(dev)) << "the converting copy blocked the host";
  EXPECT_TRUE(at::equal(dst.cpu(), host.to(at::kBFloat16))) << "not the bf16 rounding of the fp32 values";
  copies.synchronize();
}

// A prefetch (to_device_async): queued behind the compute stream's work (it overwrites what that work
// wrote), returned before that work is done, and seen by the kernels queued after current_waits.
TEST(HostCopies_CUDA, AnAsyncCopyToTheDeviceIsWaitedForOnlyByTheDevice) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  const int64_t n = 1 << 22;
  const at::Tensor host = at::arange(n, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  at::Tensor dst = at::zeros({n}, at::TensorOptions().device(dev));
  zero::HostCopies copies(dev);
  queue_matmuls(dev, 100);
  dst.fill_(-1);  // behind the matmuls: the copy lands after it
  const zero::HostCopies::Done done = copies.to_device_async(dst, host);
  EXPECT_FALSE(current_stream_done(dev)) << "to_device_async blocked the host";
  copies.current_waits(done);
  const at::Tensor seen = dst.clone();  // on the compute stream, after the copy
  EXPECT_TRUE(at::equal(seen.cpu(), host)) << "the copy ran before the compute stream's fill, or was not waited for";
  copies.synchronize();
}

// HostCopies::pinned_empty: page-locked host memory of the size asked (no power-of-two rounding),
// from which a copy to the device runs on the side stream without the host.
TEST(HostCopies_CUDA, PinnedEmptyIsPageLockedAndCopiesWithoutTheHost) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  const int64_t n = 157'286'400 / 4 + 3;  // 150 MiB and 12 bytes: PyTorch's allocator would take 256 MiB
  at::Tensor dst = at::zeros({n}, at::TensorOptions().device(dev));  // (ATen's CUDA state up: is_pinned asks it)
  zero::HostCopies copies(dev);
  const at::Tensor host = zero::HostCopies::pinned_empty(n, at::kFloat, dev);
  ASSERT_EQ(host.numel(), n);
  EXPECT_TRUE(host.is_pinned()) << "not page-locked";
  c10::impl::VirtualGuardImpl impl(c10::kCUDA);
  EXPECT_FALSE(at::getHostAllocator(at::kCUDA)->record_event(host.data_ptr(), host.storage().data_ptr().get_context(),
                                                             impl.getStream(dev)))
      << "a block of PyTorch's pinned allocator (rounded up to a power of two)";
  host.copy_(at::arange(n, at::kFloat));
  queue_matmuls(dev, 100);
  copies.to_device(dst, host);
  EXPECT_FALSE(current_stream_done(dev)) << "the copy from pinned_empty's memory blocked the host";
  EXPECT_TRUE(at::equal(dst.cpu(), host));
  copies.synchronize();
}

// A buffer of pinned_empty is the tensor a master or a gradient is made of: it is no view, so that
// Optimizer::zero_grad's in-place detach takes the gradient (a view of a flat buffer it refuses,
// which every offloaded training step on a GPU threw once).
TEST(HostCopies_CUDA, PinnedEmptyOfASizeIsNoView) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  at::Tensor master = zero::HostCopies::pinned_empty({3, 5}, at::kFloat, dev).fill_(1);
  ASSERT_EQ(master.sizes(), at::IntArrayRef({3, 5}));
  EXPECT_FALSE(master.is_view());
  master.set_requires_grad(true);
  master.mutable_grad() = zero::HostCopies::pinned_empty(master.sizes(), at::kFloat, dev).fill_(2);
  EXPECT_FALSE(master.grad().is_view());
  torch::optim::SGD sgd({master}, torch::optim::SGDOptions(0.1));
  EXPECT_NO_THROW(sgd.zero_grad());
  EXPECT_FALSE(master.grad().defined());
}

// Parameter shards in pinned host memory for a device (offload_param cpu): fetch_async starts the
// copy without blocking the host; fetch makes the device wait; a shard twinned with its host master
// keeps no copy of its own and follows the master; store() of other values lands in both.
TEST(ParamOffload_CUDA, ShardsInHostMemoryArriveOnTheSideStream) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  const int64_t n = 1 << 20;
  TwoFlats t(dev, n);
  sharding::FlatParam &fa = t.a, &fb = t.b;
  const at::Tensor &a0 = t.a0, &b0 = t.b0;
  const at::Tensor master_b = at::empty({fb.shard().numel()}, at::TensorOptions().pinned_memory(true));
  master_b.copy_(fb.shard());
  zero::OffloadSpec spec;
  spec.param = zero::OffloadDevice::Cpu;
  zero::HostCopies copies(dev);
  zero::ParamOffload po(spec, 0, {&fa, &fb}, &copies, {at::Tensor(), master_b});
  EXPECT_EQ(po.bytes(), 2 * fa.shard().nbytes());
  EXPECT_EQ(po.owned_bytes(), fa.shard().nbytes()) << "b's master is its pinned copy";
  EXPECT_FALSE(po.resident(0));
  EXPECT_THROW(fa.shard().sum(), std::exception) << "an offloaded shard has no storage";

  const CopyDelay delay(dev);
  queue_matmuls(dev, 100);
  delay.queue(copies);
  po.fetch_async(0);
  po.fetch_async(1);
  EXPECT_FALSE(current_stream_done(dev)) << "fetch_async blocked the host";
  po.fetch(0);
  po.fetch(1);
  // On the compute stream: after the copies only because fetch made it wait for them.
  fa.shard().mul_(2);
  fb.shard().mul_(2);
  EXPECT_TRUE(at::equal(fa.shard().narrow(0, 0, n), a0 * 2)) << "the compute stream did not wait for the copy";
  EXPECT_TRUE(at::equal(fb.shard().narrow(0, 0, n), b0 * 2)) << "the compute stream did not wait for the copy";
  po.release(0);
  po.release(1);

  // The step writes b's master in place: the next fetch brings those values.
  master_b.mul_(2);
  po.store(1, 0, master_b);  // (the engine's write_params: nothing to copy)
  po.fetch(1);
  EXPECT_TRUE(at::equal(fb.shard().narrow(0, 0, n), b0 * 2));
  po.release(1);
  // Other values stored into a twinned slot are the master's new values too.
  po.store(1, 0, at::zeros({fb.shard().numel()}));
  EXPECT_EQ(master_b.abs().sum().item<float>(), 0.0f);
  po.store(0, 0, at::ones({fa.shard().numel()}));
  po.fetch(0);
  EXPECT_TRUE(at::equal(fa.shard().cpu(), at::ones({fa.shard().numel()})));
}

// Parameter shards in a file for a device (offload_param nvme): the reads land in pinned staging
// buffers and go on to the device on the side stream; a read into a buffer whose copy is still
// queued waits for that copy first (one buffer: every fetch reuses it).
TEST(ParamOffload_CUDA, ShardsOnDiskReachTheDeviceThroughPinnedStaging) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  c10::DeviceGuard on_device(dev);
  const int64_t n = (1 << 20) + 7;  // (not a multiple of the 4 KiB alignment)
  TwoFlats t(dev, n);
  sharding::FlatParam &fa = t.a, &fb = t.b;
  const at::Tensor &a0 = t.a0, &b0 = t.b0;
  zero::OffloadSpec spec;
  spec.param = zero::OffloadDevice::Nvme;
  spec.param_nvme_path = fs::path(write_config("nvme_dir_marker", "")).parent_path().string();
  spec.param_buffer_count = 1;
  zero::HostCopies copies(dev);
  {
    zero::ParamOffload po(spec, 0, {&fa, &fb}, &copies);
    EXPECT_FALSE(po.in_host_memory());
    const CopyDelay delay(dev);
    for (int round = 0; round < 2; ++round) {
      queue_matmuls(dev, 50);  // the side stream's copies queue behind these
      delay.queue(copies);
      po.fetch(0);
      fa.shard().mul_(2);  // (on the compute stream: after a's copy only if fetch made it wait)
      po.fetch_async(1);   // the one buffer: waits for a's copy, then reads b
      delay.queue(copies);
      po.fetch(1);
      fb.shard().mul_(2);
      EXPECT_TRUE(at::equal(fa.shard().narrow(0, 0, n), a0 * 2)) << "round " << round;
      EXPECT_TRUE(at::equal(fb.shard().narrow(0, 0, n), b0 * 2)) << "round " << round;
      po.release(0);
      po.release(1);
    }
    po.store(1, 0, at::zeros({fb.shard().numel()}));
    po.fetch(1);
    EXPECT_EQ(fb.shard().abs().sum().item<float>(), 0.0f);
    po.release(1);
    copies.synchronize();
  }
}

TEST(CudaTraining_CUDA, Bf16AutocastOnTheDeviceFollowsFp32) {
  SKIP_WITHOUT_CUDA();
  const int steps = 12;
  const auto ref = plain_reference(my_device(), steps);
  for (const auto& c : strategies("bf16")) {
    SCOPED_TRACE(c.name);
    Trained t = accelerated(write_config(c.name, c.text), steps, [](Accelerator& acc) {
      ASSERT_TRUE(acc.device().is_cuda());
      at::manual_seed(3);
      const at::Tensor a = at::randn({32, 48}, acc.device()), b = at::randn({48, 16}, acc.device());
      auto g = acc.autocast();
      EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCUDA));
      const at::Tensor r = at::matmul(a, b);
      EXPECT_EQ(r.scalar_type(), at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      const at::Tensor want = at::matmul(a.to(at::kBFloat16), b.to(at::kBFloat16));
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      EXPECT_TRUE(at::equal(r, want)) << "autocast's product differs from the product of bf16 inputs";
      // The optimizer steps fp32 masters on the device (the model's own parameters hold bf16).
      ASSERT_TRUE(acc.engine());
      for (const auto& f : acc.engine()->flats()) {
        if (!f.master.defined()) continue;
        EXPECT_EQ(f.master.scalar_type(), at::kFloat);
        EXPECT_TRUE(f.master.is_cuda());
      }
    });
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA)) << "autocast left on after the scope";
    // Training follows fp32 within bf16's precision (8 significant bits).
    for (const auto& [name, want] : ref) {
      EXPECT_LE(rel_err(t.params.at(name), want), 3e-2) << name;
    }
    EXPECT_LT(t.losses.back(), 0.7 * t.losses.front()) << "bf16 training did not reduce the loss";
  }
}

TEST(CudaTraining_CUDA, Fp16OverflowSkipsTheStepAndKeepsTheWeights) {
  SKIP_WITHOUT_CUDA();
  for (const auto& c : strategies("fp16")) {
    SCOPED_TRACE(c.name);
    Accelerator acc(quiet(write_config(c.name, c.text)));
    ASSERT_TRUE(acc.device().is_cuda());
    auto model = make_mlp();
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
    auto loader = loader_for_micro_batch();
    auto p = acc.prepare(model, adamw, loader);
    ASSERT_TRUE(acc.loss_scale().has_value());
    EXPECT_EQ(*acc.loss_scale(), 65536.0);
    auto step = [&](int k, bool overflow) {
      Batch b = my_rows(global_batch(k, acc.device()), acc.process_index(), acc.num_processes());
      at::Tensor loss;
      {
        auto ac = acc.autocast();
        at::Tensor out = model->forward(b.x);
        EXPECT_EQ(out.scalar_type(), at::kHalf);
        loss = at::mse_loss(out.to(at::kFloat), b.y);
      }
      // The last rank's loss becomes inf: its gradients overflow, and every rank must skip.
      if (overflow && acc.is_last_process()) loss = loss * std::numeric_limits<double>::infinity();
      acc.backward(loss);
      p->step();
      p->zero_grad();
      return loss.item<double>();
    };
    const double first = step(0, false);
    auto before = acc.get_state_dict();
    step(1, true);
    EXPECT_TRUE(acc.optimizer_step_was_skipped());
    auto after = acc.get_state_dict();
    ASSERT_EQ(before.size(), after.size());
    for (std::size_t i = 0; i < before.size(); ++i)
      EXPECT_TRUE(at::equal(before[i].second, after[i].second)) << before[i].first << " changed on a skipped step";
    double last = first;
    for (int k = 2; k < 14; ++k) last = step(k % 4, false);
    EXPECT_FALSE(acc.optimizer_step_was_skipped());
    EXPECT_LT(last, first) << "fp16 training did not reduce the loss";
  }
}

// An engine over a CUDA model leaves the process's CPU settings alone: float32 CPU matmuls stay on
// libtorch's kernels even under ACCEL_CPU_GEMM=onednn, and the CPU allocator's cache stays off (both
// are process-wide, and for engines over CPU models).
TEST(CudaTraining_CUDA, ACudaEngineLeavesTheCpuMatmulsAndAllocatorAlone) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv gemm("ACCEL_CPU_GEMM", "onednn");
  ASSERT_EQ(cpu_gemm::installed(), cpu_gemm::Path::libtorch) << "an earlier test installed oneDNN's matmuls";
  ASSERT_FALSE(memory::keeping_freed_cpu_memory()) << "an earlier test turned the CPU allocator's cache on";
  const std::string yaml = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n";
  Trained t = accelerated(write_config("zero3_cpu_settings.yaml", yaml), 2);
  EXPECT_TRUE(t.device.is_cuda());
  EXPECT_EQ(cpu_gemm::installed(), cpu_gemm::Path::libtorch) << "a CUDA engine routed the CPU matmuls to oneDNN";
  EXPECT_FALSE(memory::keeping_freed_cpu_memory()) << "a CUDA engine turned the CPU allocator's cache on";
}

// forward_gelu on the device, where the fused casts compute the GELU: the same output and gradients as
// forward(at::gelu(pre)), bit for bit, through at::_scaled_mm (tensorwise) and through the rowwise recipe
// (GELU computed inside the layer), and the same output without gradients.
TEST(CudaFloat8_CUDA, ForwardGeluIsForwardOfGeluBitForBit) {
  SKIP_WITHOUT_CUDA();
  const c10::Device dev = my_device();
  for (auto recipe : {mixed_precision::Float8Recipe::Tensorwise, mixed_precision::Float8Recipe::Rowwise}) {
    at::manual_seed(43);
    nn::Float8Linear a(256, 128), b(256, 128);
    {
      at::NoGradGuard ng;
      b->weight.copy_(a->weight);
      b->bias.copy_(a->bias);
    }
    a->to(dev, at::kBFloat16);
    b->to(dev, at::kBFloat16);
    a->recipe = b->recipe = recipe;
    const at::Tensor pre = (at::randn({4, 32, 256}, dev) * 2).to(at::kBFloat16);
    const at::Tensor g = (at::randn({4, 32, 128}, dev) * 1e-2).to(at::kBFloat16);
    const at::Tensor pa = pre.clone().set_requires_grad(true), pb = pre.clone().set_requires_grad(true);
    const at::Tensor ya = a->forward_gelu(pa), yb = b->forward(at::gelu(pb));
    ya.backward(g);
    yb.backward(g);
    const std::string what = mixed_precision::to_string(recipe);
    EXPECT_TRUE(at::equal(ya, yb)) << what;
    EXPECT_TRUE(at::equal(pa.grad(), pb.grad())) << what;
    EXPECT_TRUE(at::equal(a->weight.grad(), b->weight.grad())) << what;
    EXPECT_TRUE(at::equal(a->bias.grad(), b->bias.grad())) << what;
    // Without gradients (inference, checkpointing's first pass) only the row-major bytes are cast: the
    // flat cast of gelu(pre).
    at::NoGradGuard ng;
    EXPECT_TRUE(at::equal(a->forward_gelu(pre), b->forward(at::gelu(pre)))) << what << " (no grad)";
  }
}

TEST(CudaFloat8_CUDA, ScaledMmMatchesTheEmulationAndFollowsBf16Linear) {
  SKIP_WITHOUT_CUDA();
  using mixed_precision::Float8MatmulBackend;
  const c10::Device dev = my_device();
  try {  // cuBLASLt's fp8 GEMM needs compute capability >= 8.9
    const at::Tensor a = at::ones({16, 16}, dev).to(at::kFloat8_e4m3fn);
    const at::Tensor one = at::ones({}, at::TensorOptions().device(dev));
    (void)at::_scaled_mm(a, a.t(), one, one, std::nullopt, std::nullopt, at::kBFloat16);
  } catch (const std::exception& e) {
    GTEST_SKIP() << "at::_scaled_mm does not run on this device: " << std::string(e.what()).substr(0, 200);
  }
  at::manual_seed(5);
  nn::Float8Linear mm(128, 64), emu(128, 64);
  torch::nn::Linear lin(128, 64);
  {
    at::NoGradGuard ng;
    emu->weight.copy_(mm->weight);
    emu->bias.copy_(mm->bias);
    lin->weight.copy_(mm->weight);
    lin->bias.copy_(mm->bias);
  }
  mm->to(dev);
  emu->to(dev);
  lin->to(dev, at::kBFloat16);
  mm->backend = Float8MatmulBackend::ScaledMM;
  emu->backend = Float8MatmulBackend::Emulated;
  const std::int64_t copies = mixed_precision::float8_operand_copies();
  const std::int64_t products = mixed_precision::float8_scaled_mm_products();
  const at::Tensor x0 = at::randn({96, 128}, dev).to(at::kBFloat16);
  const at::Tensor g = at::randn({96, 64}, dev).to(at::kBFloat16) * 1e-2;
  at::Tensor xm = x0.clone().set_requires_grad(true), xe = x0.clone().set_requires_grad(true);
  const at::Tensor ym = mm->forward(xm), ye = emu->forward(xe);
  ym.backward(g);
  ye.backward(g);
  EXPECT_EQ(ym.scalar_type(), at::kBFloat16);
  // The same fp8 operands and scales: cuBLASLt and the emulation differ in summation order and in
  // the final rounding to bf16 only (one bf16 ulp, 2^-8 relative, plus accumulation order).
  EXPECT_LE(rel_err(ym.to(at::kFloat), ye.to(at::kFloat)), 1e-2);
  EXPECT_LE(rel_err(xm.grad().to(at::kFloat), xe.grad().to(at::kFloat)), 1e-2);
  EXPECT_LE(rel_err(mm->weight.grad(), emu->weight.grad()), 1e-2);
  // The bias gradient: summed by grad_output's cast on the device (the tiled cast), by at::sum in the
  // emulation (row-major operands, the flat cast). Any order of 96 fp32 additions is within 95 x 2^-24
  // of a column's sum of magnitudes from the exact sum, so the two within twice that of each other.
  const at::Tensor mass = g.to(at::kDouble).abs().sum(0);
  EXPECT_LE(((mm->bias.grad().to(at::kDouble) - emu->bias.grad().to(at::kDouble)).abs() / mass).max().item<double>(),
            2 * 95 * std::ldexp(1.0, -24));
  // Against the bf16 Linear: within e4m3's precision (3 mantissa bits), yet really fp8.
  const at::Tensor yl = lin->forward(x0).detach();
  const double rel =
      rel_err(ym.detach().to(at::kFloat) - mm->bias.detach(), yl.to(at::kFloat) - lin->bias.detach().to(at::kFloat));
  EXPECT_LT(rel, 0.08);
  EXPECT_GT(rel, 1e-3) << "no fp8 rounding visible: is the fp8 path really taken?";
  EXPECT_EQ(mixed_precision::float8_scaled_mm_products(), products + 3);

  // The rowwise recipe the same way (Auto): all three products through _scaled_mm, which a fallback to
  // the emulation would not count; the fp32 weight's gradient is cuBLASLt's bf16 product converted
  // (rowwise scaling writes bf16; torchao's way), within the same bound. In both recipes every operand
  // reached cuBLASLt in its layout (a row-major, b column-major): no product copied one.
  mm->backend = Float8MatmulBackend::Auto;
  for (auto* m : {&mm, &emu}) {
    (*m)->recipe = mixed_precision::Float8Recipe::Rowwise;
    (*m)->weight.mutable_grad() = at::Tensor();
  }
  xm = x0.clone().set_requires_grad(true), xe = x0.clone().set_requires_grad(true);
  const at::Tensor rm = mm->forward(xm), re = emu->forward(xe);
  rm.backward(g);
  re.backward(g);
  EXPECT_LE(rel_err(rm.to(at::kFloat), re.to(at::kFloat)), 1e-2);
  EXPECT_LE(rel_err(xm.grad().to(at::kFloat), xe.grad().to(at::kFloat)), 1e-2);
  EXPECT_EQ(mm->weight.grad().scalar_type(), at::kFloat);
  EXPECT_LE(rel_err(mm->weight.grad(), emu->weight.grad()), 1e-2);
  EXPECT_EQ(mixed_precision::float8_scaled_mm_products(), products + 6);
  EXPECT_EQ(mixed_precision::float8_operand_copies(), copies) << "a product copied an operand into its layout";

  // One row (a decoding step's single token): its [1, 1] scale goes to _scaled_mm as a rowwise [1, 1],
  // beside the weight's [1, N] (a 0-dim one there is refused), in forward and grad_input (grad_weight's
  // inner dim is that one row, under _scaled_mm's multiple of 16: emulated).
  {
    at::Tensor x1 = x0.narrow(0, 0, 1).clone().set_requires_grad(true),
               e1 = x1.detach().clone().set_requires_grad(true);
    const at::Tensor y1 = mm->forward(x1), z1 = emu->forward(e1);
    y1.backward(g.narrow(0, 0, 1));
    z1.backward(g.narrow(0, 0, 1));
    EXPECT_LE(rel_err(y1.to(at::kFloat), z1.to(at::kFloat)), 1e-2);
    EXPECT_LE(rel_err(x1.grad().to(at::kFloat), e1.grad().to(at::kFloat)), 1e-2);
    EXPECT_EQ(mixed_precision::float8_scaled_mm_products(), products + 8);
  }

  // bf16 weights (step_bench --precision fp8, the engine's bf16 parameters): every output bf16, the
  // weight's gradient from grad_output's per-column cast (column-major, transposed into the first
  // operand) and the saved column-major input, in both recipes.
  for (auto recipe : {mixed_precision::Float8Recipe::Rowwise, mixed_precision::Float8Recipe::Tensorwise}) {
    SCOPED_TRACE(mixed_precision::to_string(recipe));
    for (auto* m : {&mm, &emu}) {
      (*m)->to(at::kBFloat16);
      (*m)->recipe = recipe;
      (*m)->weight.mutable_grad() = at::Tensor();
    }
    const std::int64_t before = mixed_precision::float8_scaled_mm_products();
    xm = x0.clone().set_requires_grad(true), xe = x0.clone().set_requires_grad(true);
    const at::Tensor bm = mm->forward(xm), be = emu->forward(xe);
    bm.backward(g);
    be.backward(g);
    EXPECT_EQ(mm->weight.grad().scalar_type(), at::kBFloat16);
    EXPECT_LE(rel_err(bm.to(at::kFloat), be.to(at::kFloat)), 1e-2);
    EXPECT_LE(rel_err(xm.grad().to(at::kFloat), xe.grad().to(at::kFloat)), 1e-2);
    EXPECT_LE(rel_err(mm->weight.grad().to(at::kFloat), emu->weight.grad().to(at::kFloat)), 1e-2);
    EXPECT_EQ(mixed_precision::float8_scaled_mm_products(), before + 3);
    EXPECT_EQ(mixed_precision::float8_operand_copies(), copies) << "a product copied an operand into its layout";
  }

  // Under autocast (the Accelerator's training loop), an fp32 input (what autocast's layer_norm hands
  // the next layer on CUDA) goes in at bf16, as into torch::nn::Linear: the bf16 input's output, bit
  // for bit, through _scaled_mm.
  const std::int64_t before = mixed_precision::float8_scaled_mm_products();
  const at::Tensor want = mm->forward(x0).detach();
  mixed_precision::AutocastScope on(c10::kCUDA, at::kBFloat16);
  const at::Tensor y32 = mm->forward(x0.to(at::kFloat)).detach();
  EXPECT_EQ(y32.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(y32, want));
  EXPECT_EQ(mixed_precision::float8_scaled_mm_products(), before + 2);
}

TEST(AcceleratorOnCuda_CUDA, MoreRanksThanDevicesShareThemOrAreRefusedUnderNccl) {
  const int ndev = comm::cuda_device_count();
  if (ndev == 0) GTEST_SKIP() << "no CUDA device";
  const auto& topo = world()->topology();
  const int here = topo.simulated ? topo.world_size : topo.local_world_size;
  if (here <= ndev) GTEST_SKIP() << "every rank has its own GPU here (run with more ranks than devices)";
  const std::string cfg = write_config("gpu.yaml", "distributed_type: MULTI_GPU\n");
  {
    ScopedEnv nccl("ACCEL_CUDA_COMM", "nccl");
    try {
      Accelerator acc(quiet(cfg));
      ADD_FAILURE() << "no error with " << here << " ranks on " << ndev << " device(s) under ACCEL_CUDA_COMM=nccl";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("share a GPU, which NCCL refuses"), std::string::npos) << e.what();
    }
  }
  ScopedEnv any("ACCEL_CUDA_COMM", std::nullopt);
  Accelerator acc(quiet(cfg));
  EXPECT_EQ(acc.device(), my_device());
  at::Tensor t = at::full({1000}, acc.process_index() + 1.0, at::TensorOptions().device(acc.device()));
  auto group = world()->split(0, world()->rank());  // a group that chooses its CUDA transport now
  EXPECT_EQ(std::string(group->backend_name(t)).rfind("host+", 0), 0u);
  group->all_reduce(t);
  const double n = acc.num_processes();
  EXPECT_TRUE(at::equal(t.cpu(), at::full({1000}, n * (n + 1) / 2, at::kFloat)));
}

}  // namespace
}  // namespace accel::test
