// Offload to disk (offload_optimizer / offload_param device nvme) against the same run in memory:
// bitwise equal parameters and masters after steps with gradient accumulation, for AdamW and SGD
// (two param groups each), fp32 and bf16 compute over fp32 masters, under ZeRO-1/2/3; the files
// have the sizes the formula gives; the optimizer state leaves memory; checkpoint state round-trips
// through staging. And a device's offload path (host masters, gradients streamed to them, parameter
// shards in host memory or on disk copied back on side streams) on the CPU, through the emulated
// HostCopies (zero/host_copies.h), against the same run in memory.
#include "base/error.h"
#include "base/memory.h"
#include "offload/async_file.h"
#include "support/emulated_device.h"
#include "support/harness.h"
#include "test_world.h"
#include "zero/host_copies.h"
#include "zero/optimizer_offload.h"
#include "zero/param_offload.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/optim/rmsprop.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace accel::test {
namespace {

using zero::OffloadDevice;
using zero::ShardingSpec;

// The job's directory for offload files (test::scratch_dir), made by the first test that asks.
std::string offload_dir() {
  static const std::string dir = test::scratch_dir("offload");
  return dir;
}

struct TrainedRun {
  std::vector<at::Tensor> compute, masters;  // per flat, whole
  std::uint64_t file_bytes = 0, expected_file_bytes = 0, param_file_bytes = 0, expected_param_bytes = 0;
  std::int64_t optimizer_state_bytes = 0;  // counting allocator, after the steps
  std::size_t host_masters = 0;            // flats whose master is a device's in host memory
  std::size_t stepped_in_backward = 0;     // flats stepped in the last step's backward
  bool params_in_host_memory = false;
};

// How train() accumulates: the first of two micro-batches under NoSync, or reduced too
// (MoreMicroSteps: its reduced gradient is pending when the second one's is added).
enum class Accumulation { NoSync, Reduced };

// Three optimizer steps of the GPT, each of two micro-batches.
TrainedRun train(ShardingSpec spec, OptKind opt_kind, c10::ScalarType compute,
                 Accumulation accumulation = Accumulation::NoSync) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  Model m = make_model(ModelKind::GPT, at::kFloat);
  auto user_opt = make_optimizer(opt_kind, *m.module);
  if (compute != at::kFloat) spec.param_dtype = compute;
  auto s0 = memory::snapshot();
  auto p = zero::prepare(m.module, *user_opt, spec, world);
  TrainedRun out;
  if (const auto* o = p.engine->optimizer_offload()) {
    out.file_bytes = std::filesystem::file_size(o->path());
    // The formula, independently: per optimized flat, (1 + state tensors) * its master range in fp32,
    // each rounded up to 4 KiB (sub_group_size here is larger than any shard).
    const std::uint64_t state = opt_kind == OptKind::AdamW ? 2 : 1;
    for (const auto& f : p.engine->flats())
      if (f.group >= 0) {
        auto [b, e] = p.engine->master_range(f);
        out.expected_file_bytes += (1 + state) * offload::align_up(static_cast<std::uint64_t>(e - b) * 4);
      }
  }
  if (const auto* po = p.engine->param_offload(); po && !po->in_host_memory()) {
    out.param_file_bytes = std::filesystem::file_size(po->path());
    for (const auto& f : p.engine->flats())
      if (!f.persistent && f.flat_param->options().sharded)
        out.expected_param_bytes += offload::align_up(static_cast<std::uint64_t>(f.flat_param->layout().shard_size()) *
                                                      c10::elementSize(f.flat_param->options().dtype));
  }
  const int64_t rows = 4 * N;
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      auto [x, y] = make_batch(ModelKind::GPT, at::kFloat, step, micro, rows);
      at::Tensor loss = m.loss(x.narrow(0, r * 4, 4), y.narrow(0, r * 4, 4)) / 2;
      if (micro == 0 && accumulation == Accumulation::NoSync) {
        zero::Engine::NoSync ns(*p.engine);
        p.engine->backward(loss);
      } else if (micro == 0) {
        zero::Engine::MoreMicroSteps more(*p.engine);
        p.engine->backward(loss);
      } else {
        p.engine->backward(loss);
      }
    }
    out.stepped_in_backward = p.engine->stepped_in_backward().size();
    p.optimizer->step();
    p.optimizer->zero_grad();
  }
  out.optimizer_state_bytes =
      memory::snapshot()[memory::Category::OptimizerState].current - s0[memory::Category::OptimizerState].current;
  out.params_in_host_memory = p.engine->param_offload() && p.engine->param_offload()->in_host_memory();
  for (const auto& f : p.engine->flats()) {
    out.host_masters += f.master_in_host_memory ? 1 : 0;
    out.compute.push_back(p.engine->whole_values(f, zero::Engine::Source::Compute).clone());
    out.masters.push_back(p.engine->whole_values(f, zero::Engine::Source::Master).clone());
  }
  return out;
}

struct Case {
  const char* name;
  ShardingSpec spec;
  bool optimizer, param;
  c10::ScalarType compute;
};

std::vector<Case> cases() {
  return {
      {"ZeRO-1 optimizer", ShardingSpec::zero(1), true, false, at::kFloat},
      {"ZeRO-2 optimizer", ShardingSpec::zero(2), true, false, at::kFloat},
      {"ZeRO-3 optimizer", ShardingSpec::zero(3), true, false, at::kFloat},
      {"ZeRO-3 param", ShardingSpec::zero(3), false, true, at::kFloat},
      {"ZeRO-3 both", ShardingSpec::zero(3), true, true, at::kFloat},
      {"FULL_SHARD both bf16", ShardingSpec::fsdp("FULL_SHARD"), true, true, at::kBFloat16},
      {"ZeRO-2 optimizer bf16", ShardingSpec::zero(2), true, false, at::kBFloat16},
  };
}

TEST(Offload, OnDiskEqualsInMemoryBitwise) {
  ASSERT_TRUE(memory::counting_installed());
  const std::string dir = offload_dir();
  for (OptKind opt : {OptKind::AdamW, OptKind::SGD})
    for (const Case& c : cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + name(opt));
      ShardingSpec on = c.spec;
      if (c.optimizer) on.offload.optimizer = OffloadDevice::Nvme, on.offload.optimizer_nvme_path = dir;
      if (c.param) on.offload.param = OffloadDevice::Nvme, on.offload.param_nvme_path = dir;
      on.offload.sub_group_size = 5000;  // several sub-groups per flat: the pipeline runs
      on.offload.optimizer_buffer_count = 3;
      const TrainedRun want = train(c.spec, opt, c.compute);
      const TrainedRun got = train(on, opt, c.compute);
      ASSERT_EQ(want.compute.size(), got.compute.size());
      for (std::size_t i = 0; i < want.compute.size(); ++i) {
        EXPECT_TRUE(at::equal(want.compute[i], got.compute[i])) << "flat " << i << " compute";
        EXPECT_TRUE(at::equal(want.masters[i], got.masters[i])) << "flat " << i << " master";
      }
      if (c.optimizer) {
        EXPECT_EQ(got.file_bytes, got.expected_file_bytes);
        EXPECT_GT(got.file_bytes, 0u);
        // The optimizer state no longer in memory (only what bf16 masters... none: all of it on disk).
        EXPECT_EQ(got.optimizer_state_bytes, 0) << "in memory: " << want.optimizer_state_bytes;
        EXPECT_GT(want.optimizer_state_bytes, 0);
      }
      if (c.param) {
        EXPECT_EQ(got.param_file_bytes, got.expected_param_bytes);
        EXPECT_GT(got.param_file_bytes, 0u);
      }
    }
  // The files are scratch: gone with the engines (every rank's, once every rank is done).
  test::world()->barrier();
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find("accel-"), std::string::npos) << e.path();
}

// The emulated HostCopies itself (a CPU "device"): a copy or add runs when something waits for it,
// not before; its source's values are those it had when queued; a source written before its copy
// ran is an error at the wait; a destination freed meanwhile is left alone; the destination's
// version counts the write when it is queued.
TEST(OffloadEmulatedDevice, CopiesRunWhenWaitedForAndARacingWriteIsAnError) {
  zero::HostCopies copies(c10::kCPU);
  ASSERT_TRUE(copies.emulated());
  const at::Tensor src = at::arange(8, at::kFloat), host = at::zeros({8}), dev = at::zeros({8});
  const auto version = host._version();
  copies.to_host(host, src);
  EXPECT_GT(host._version(), version) << "the write is not counted when queued";
  const zero::HostCopies::Done to_dev = copies.to_device_async(dev, src * 2);
  EXPECT_EQ(host.sum().item<float>(), 0.0f) << "ran before anything waited";
  EXPECT_FALSE(to_dev.query());
  copies.synchronize_to_host();
  EXPECT_TRUE(at::equal(host, src));
  EXPECT_EQ(dev.sum().item<float>(), 0.0f) << "the copy to the device ran with those to the host";
  copies.current_waits(to_dev);
  EXPECT_TRUE(to_dev.query());
  EXPECT_TRUE(at::equal(dev, src * 2));
  // An add to the host, in the destination's dtype.
  copies.add_to_host(host, at::full({8}, 0.5, at::kBFloat16));
  copies.synchronize();
  EXPECT_TRUE(at::equal(host, src + 0.5));
  // The source written after the copy was queued, before the wait: an error there.
  const at::Tensor raced = at::ones({8});
  copies.to_host(host, raced);
  raced.mul_(3);
  EXPECT_THROW(copies.synchronize(), accel::LogicError);
  // A destination whose memory went meanwhile is not written.
  at::Tensor gone = at::zeros({8});
  copies.to_host(gone, src);
  gone.set_(at::zeros({8}).storage());
  copies.synchronize();
  EXPECT_EQ(gone.sum().item<float>(), 0.0f);
  // Plain host memory stands for pinned memory: a tensor of its own, no view.
  const at::Tensor m = zero::HostCopies::pinned_empty({3, 5}, at::kFloat, c10::kCPU);
  EXPECT_EQ(m.sizes(), at::IntArrayRef({3, 5}));
  EXPECT_FALSE(m.is_view());
}

// A device's offload (what a GPU runs: CudaTraining_CUDA.Offload*, StepInBackward_CUDA.*) on the CPU:
// masters in host memory apart from the device's shards, each reduced gradient queued to them as its
// bucket finishes (added to the pending one there when a micro-step before reduced too), the step
// in backward once it has arrived, the masters copied back, parameter shards in host memory (twinned
// with fp32 masters) or read from disk through staging, each fetched ahead on the side stream. The
// emulated copies run only when waited for, so a read before the wait, or a source written before
// its copy ran, shows here as different bits. Bitwise the same training in memory, not emulated.
TEST(OffloadEmulatedDevice, HostMemoryAndDiskEqualInMemoryBitwise) {
  if (!test_device().is_cpu()) GTEST_SKIP() << "emulates a device on the CPU (on one: CudaTraining_CUDA.Offload*)";
  ASSERT_TRUE(memory::counting_installed());
  const std::string dir = offload_dir();
  std::vector<Case> all = cases();
  // (across simulated nodes, sharding_hybrid_2nodes: averaged across them at the end of backward)
  all.push_back({"HYBRID_SHARD both", ShardingSpec::fsdp("HYBRID_SHARD"), true, true, at::kFloat});
  // bf16 compute reduced in fp32: a NoSync window adds up in an fp32 sum, which the sync backward
  // reduces and hands to the host masters (the sum itself at one rank).
  for (Case c :
       {Case{"ZeRO-1 optimizer bf16, fp32 reduction", ShardingSpec::zero(1), true, false, at::kBFloat16},
        Case{"ZeRO-2 optimizer bf16, fp32 reduction", ShardingSpec::zero(2), true, false, at::kBFloat16},
        Case{"FULL_SHARD both bf16, fp32 reduction", ShardingSpec::fsdp("FULL_SHARD"), true, true, at::kBFloat16}}) {
    c.spec.reduce_dtype = at::kFloat;
    all.push_back(c);
  }
  for (const Case& c : all)
    for (const OffloadDevice where : {OffloadDevice::Cpu, OffloadDevice::Nvme})
      for (const Accumulation accumulation : {Accumulation::NoSync, Accumulation::Reduced})
        for (const bool in_backward : {false, true}) {
          if (in_backward && (where != OffloadDevice::Cpu || !c.optimizer)) continue;  // (host masters only)
          // bf16 micro-steps that reduce: the pending gradient is added to in host memory in fp32 (the
          // master's dtype, as DeepSpeed's offload accumulates), in memory in bf16 (the reduction's): not
          // the same bits, by design. (Reduced in fp32, both add in fp32: compared.)
          const bool host_opt = c.optimizer && where == OffloadDevice::Cpu;
          if (host_opt && c.compute != at::kFloat && c.spec.reduce_dtype != at::kFloat &&
              accumulation == Accumulation::Reduced)
            continue;
          SCOPED_TRACE(fmt::format(
              "{}, to {}, first micro-step {}{}", c.name, where == OffloadDevice::Cpu ? "host memory" : "disk",
              accumulation == Accumulation::NoSync ? "NoSync" : "reduced", in_backward ? ", step in backward" : ""));
          ShardingSpec on = c.spec;
          if (c.optimizer) on.offload.optimizer = where, on.offload.optimizer_nvme_path = dir;
          if (c.param) on.offload.param = where, on.offload.param_nvme_path = dir;
          on.offload.sub_group_size = 5000;
          on.step_in_backward = in_backward;
          // One rank in fp32 without offload is a passthrough: autograd adds the second micro-step's
          // contributions to the first's one at a time, where the engine sums them first and adds the
          // reduced sum. There, the engine's own way in memory: the optimizer on disk (bitwise the step
          // in memory: Offload.OnDiskEqualsInMemoryBitwise).
          ShardingSpec ref = c.spec;
          if (test::world()->size() == 1 && accumulation == Accumulation::Reduced)
            ref.offload.optimizer = OffloadDevice::Nvme, ref.offload.optimizer_nvme_path = dir;
          const TrainedRun want = train(ref, OptKind::AdamW, c.compute, accumulation);
          TrainedRun got;
          {
            const EmulatedDevice emulated;
            got = train(on, OptKind::AdamW, c.compute, accumulation);
          }
          // The device's path was taken: masters in host memory, parameter shards there.
          if (host_opt)
            EXPECT_GT(got.host_masters, 0u);
          else
            EXPECT_EQ(got.host_masters, 0u);
          EXPECT_EQ(got.params_in_host_memory, c.param && where == OffloadDevice::Cpu);
          if (in_backward) EXPECT_EQ(got.stepped_in_backward, got.host_masters);
          ASSERT_EQ(want.compute.size(), got.compute.size());
          for (std::size_t i = 0; i < want.compute.size(); ++i) {
            EXPECT_TRUE(at::equal(want.compute[i], got.compute[i])) << "flat " << i << " compute";
            EXPECT_TRUE(at::equal(want.masters[i], got.masters[i])) << "flat " << i << " master";
          }
        }
  test::world()->barrier();
}

// A backward that throws after a micro-step that reduced into host masters (StepInBackward_CUDA's
// AFailedMicroStepKeepsTheWindowUnlessItAddedToIt, on the emulated device), against the same in memory.
// - Thrown first in backward: no bucket was reduced, so nothing was added to the gradients pending in
//   host memory. The window stays, as in memory, and the step is the same bits as there.
// - Thrown at the first layer's output, after the root, fc2 and fc1 were reduced (one flat a bucket,
//   one bucket in flight: each finishes as it is launched) and added in host memory. A sum cannot be
//   taken back, so the window goes, every master's gradient with it, and the step changes nothing. So
//   does ZeRO-3 in memory (it adds on the way there too); ZeRO-1 in memory adds at the end of backward
//   and keeps the window, so its in-memory run is not compared there.
struct FailedMicroStep {
  std::vector<at::Tensor> before, after;   // optimized masters before and after the step
  std::vector<at::Tensor> pending_before;  // their gradients before the failed backward
  std::vector<at::Tensor> pending;         // ... and after it (undefined: dropped)
};

FailedMicroStep failed_micro_step(ShardingSpec spec, bool offload, bool throw_late) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  std::optional<EmulatedDevice> emulated;
  if (offload) emulated.emplace();
  Model m = make_model(ModelKind::MLP, at::kFloat, {6, 64, 64, 3});
  auto user = make_optimizer(OptKind::AdamW, *m.module);
  if (offload) spec.offload.optimizer = OffloadDevice::Cpu;
  spec.bucket_bytes = 0;
  spec.grad_buckets_in_flight = 1;
  auto p = zero::prepare(m.module, *user, spec, world);
  auto [x, y] = make_batch(ModelKind::MLP, at::kFloat, 0, 0, 4 * N);
  x = x.narrow(0, 4 * r, 4), y = y.narrow(0, 4 * r, 4);
  {
    zero::Engine::MoreMicroSteps more(*p.engine);
    p.engine->backward(m.loss(x, y));
  }
  FailedMicroStep out;
  for (const auto& f : p.engine->flats())
    if (f.group >= 0) {
      EXPECT_EQ(f.master_in_host_memory, offload);
      EXPECT_TRUE(f.master.grad().defined()) << "no pending gradient after the first micro-step";
      out.before.push_back(f.master.clone());
      out.pending_before.push_back(f.master.grad().defined() ? f.master.grad().clone() : at::Tensor());
    }
  EXPECT_FALSE(out.before.empty());
  auto* mlp = dynamic_cast<MLPImpl*>(m.module.get());
  EXPECT_NE(mlp, nullptr);
  if (!mlp) return out;
  auto throws = [](const at::Tensor& g) -> at::Tensor {
    if (g.defined()) throw std::runtime_error("injected");
    return g;
  };
  at::Tensor h = mlp->layers[0](x);  // MLPImpl::forward, with the hook where it throws
  if (throw_late) h.register_hook(throws);
  for (std::size_t i = 1; i < mlp->layers.size(); ++i) h = mlp->layers[i](at::tanh(h));
  at::Tensor out_t = h * mlp->scale;
  if (!throw_late) out_t.register_hook(throws);
  EXPECT_THROW(p.engine->backward(at::mse_loss(out_t, y)), std::exception);
  for (const auto& f : p.engine->flats())
    if (f.group >= 0) out.pending.push_back(f.master.grad().defined() ? f.master.grad().clone() : at::Tensor());
  p.optimizer->step();
  for (const auto& f : p.engine->flats())
    if (f.group >= 0) out.after.push_back(f.master.clone());
  return out;
}

TEST(OffloadEmulatedDevice, AFailedMicroStepKeepsTheWindowUnlessItAddedToIt) {
  if (!test_device().is_cpu()) GTEST_SKIP() << "emulates a device on the CPU (on one: StepInBackward_CUDA.*)";
  for (const int stage : {1, 3})
    for (const bool late : {false, true}) {
      SCOPED_TRACE(fmt::format("ZeRO-{}, thrown {}", stage, late ? "at the first layer" : "first"));
      const FailedMicroStep got = failed_micro_step(ShardingSpec::zero(stage), /*offload=*/true, late);
      ASSERT_EQ(got.after.size(), got.before.size());
      ASSERT_EQ(got.pending.size(), got.before.size());
      for (std::size_t i = 0; i < got.after.size(); ++i)
        if (late) {
          EXPECT_FALSE(got.pending[i].defined()) << "flat " << i << " kept a gradient the failed backward added to";
          EXPECT_TRUE(at::equal(got.after[i], got.before[i])) << "flat " << i << ": a step on a dropped window";
        } else {
          ASSERT_TRUE(got.pending[i].defined()) << "flat " << i << " lost a window nothing was added to";
          EXPECT_TRUE(at::equal(got.pending[i], got.pending_before[i])) << "flat " << i << ": the window changed";
        }
      // In memory (on one rank that is a passthrough: libtorch's own .grad, no window to compare).
      if (test::world()->size() == 1 || (late && stage == 1)) continue;  // (in memory ZeRO-1 keeps it)
      const FailedMicroStep want = failed_micro_step(ShardingSpec::zero(stage), /*offload=*/false, late);
      ASSERT_EQ(got.after.size(), want.after.size());
      for (std::size_t i = 0; i < got.after.size(); ++i) {
        EXPECT_EQ(got.pending[i].defined(), want.pending[i].defined()) << "flat " << i;
        if (got.pending[i].defined() && want.pending[i].defined())
          EXPECT_TRUE(at::equal(got.pending[i], want.pending[i])) << "flat " << i << " pending gradient";
        EXPECT_TRUE(at::equal(got.after[i], want.after[i])) << "flat " << i << ": not the step in memory";
      }
    }
}

// What the emulated device holds: accel's counting allocator less the optimizer state (the host's,
// under optimizer offload). The host's page-locked buffers are outside that allocator, as a device's
// are (HostCopies::pinned_empty).
std::int64_t device_side(const memory::Snapshot& s, bool peak) {
  const memory::Usage& all = s.total;
  const memory::Usage& opt = s[memory::Category::OptimizerState];
  return peak ? all.peak - opt.current : all.current - opt.current;
}

struct Residency {
  std::int64_t model = 0;  // the MLP's fp32 bytes
  std::int64_t kept = 0;   // after the second backward, beyond before its forward
  std::int64_t peak = 0;   // the second step's peak, beyond before the model was built
};

// ZeRO-3 over an MLP of `layers` hidden layers of 256 (each a unit of 257 KiB), two steps of AdamW.
Residency residency(ShardingSpec spec, int layers) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const EmulatedDevice emulated;
  Residency out;
  std::vector<int64_t> widths{64};
  for (int l = 0; l < layers; ++l) widths.push_back(256);
  widths.push_back(4);
  const std::int64_t baseline = device_side(memory::snapshot(), false);
  at::manual_seed(3);
  auto mlp = std::make_shared<MLPImpl>(widths);
  for (const auto& t : mlp->parameters()) out.model += 4 * t.numel();
  auto user = make_optimizer(OptKind::AdamW, *mlp);
  auto p = zero::prepare(mlp, *user, spec, world);
  for (int step = 0; step < 2; ++step) {
    at::manual_seed(40 + step);
    const at::Tensor x = at::randn({4 * N, widths.front()}).narrow(0, 4 * r, 4);
    const at::Tensor y = at::randn({4 * N, widths.back()}).narrow(0, 4 * r, 4);
    memory::reset_peaks();
    const std::int64_t before = device_side(memory::snapshot(), false);
    p.engine->backward(at::mse_loss(mlp->forward(x), y));
    if (step == 1) out.kept = device_side(memory::snapshot(), false) - before;
    p.optimizer->step();
    p.optimizer->zero_grad();
    if (step == 1) out.peak = device_side(memory::snapshot(), true) - baseline;
  }
  return out;
}

// What a device holds under ZeRO-3, measured on the emulated one at 8 and 16 hidden layers: the peak
// grows with the model's depth by what stays on the device per unit, (c / N) per fp32 byte of the
// eight more units, plus their activations (at most two tensors of 4 x 256 floats a layer):
//   c = 2 without offload (the parameter shards and the reduced gradients kept for the step),
//   c = 1 with the optimizer in host memory (the parameter shards: each gradient leaves as its copy to
//     the host is done, at most grad_buckets_in_flight of them pending: Engine::hold_for_host),
//   c = 0 with the parameters there too (ZeRO-Infinity: a few units at a time, whatever the depth).
// And after a backward under offload the device keeps no gradient.
TEST(OffloadEmulatedDevice, WhatTheDeviceHoldsGrowsWithDepthOnlyByWhatStaysThere) {
  if (!test_device().is_cpu()) GTEST_SKIP() << "emulates a device on the CPU (on one: CudaTraining_CUDA.*)";
  const int N = test::world()->size();
  const std::int64_t activations = 8 * 2 * 4 * 256 * 4;
  std::int64_t peak16[3] = {0, 0, 0};
  for (const int offload : {0, 1, 2}) {
    SCOPED_TRACE(offload == 0 ? "no offload" : offload == 1 ? "optimizer in host memory" : "and the parameters");
    ShardingSpec s = ShardingSpec::zero(3);
    s.bucket_bytes = 0;  // (units of 257 KiB, one a bucket: as a GPT's blocks against 25 MiB buckets)
    if (offload >= 1) s.offload.optimizer = OffloadDevice::Cpu;
    if (offload >= 2) s.offload.param = OffloadDevice::Cpu;
    const Residency a = residency(s, 8), b = residency(s, 16);
    const std::int64_t more = b.model - a.model, per_unit_stays = (2 - offload) * more / N;
    EXPECT_GE(b.peak - a.peak, per_unit_stays) << "8 more layers: " << more << " B of parameters";
    EXPECT_LE(b.peak - a.peak, per_unit_stays + activations) << "8 more layers: " << more << " B of parameters";
    if (offload > 0) {
      EXPECT_EQ(a.kept, 0) << "the device kept gradients after backward";
      EXPECT_EQ(b.kept, 0) << "the device kept gradients after backward";
    }
    peak16[offload] = b.peak;
  }
  EXPECT_LT(peak16[1], peak16[0]);
  EXPECT_LT(peak16[2], peak16[1]);
}

TEST(Offload, BadNvmePathsAreNamedBeforeTraining) {
  auto world = test::world();
  Model m = make_model(ModelKind::MLP, at::kFloat);
  auto user_opt = make_optimizer(OptKind::AdamW, *m.module);
  ShardingSpec s = ShardingSpec::zero(2);
  s.offload.optimizer = OffloadDevice::Nvme;
  s.offload.optimizer_nvme_path = "/nonexistent/accel-offload";
  try {
    zero::prepare(m.module, *user_opt, s, world);
    FAIL() << "no error for a missing nvme_path";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/accel-offload"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.nvme_path"), std::string::npos) << e.what();
  }
}

TEST(Offload, OptimizersWithoutFusedKernelsAreRefused) {
  auto world = test::world();
  Model m = make_model(ModelKind::MLP, at::kFloat);
  torch::optim::RMSprop rms(m.module->parameters(), torch::optim::RMSpropOptions(0.01));
  ShardingSpec s = ShardingSpec::zero(2);
  s.offload.optimizer = OffloadDevice::Nvme;
  s.offload.optimizer_nvme_path = offload_dir();
  try {
    zero::prepare(m.module, rms, s, world);
    FAIL() << "RMSprop accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RMSprop"), std::string::npos) << e.what();
  }
}

// A step that fails partway (here the callback that receives the updated masters throws at the third
// of four chunks) leaves the file half stepped: reading it (what save_state does) and stepping again
// are refused, naming the file and the failure, until every region's master and state are written
// back (what load_state does); then it reads back what was written and steps again.
TEST(OffloadOptimizerFile, AStepThatFailsPartwayIsRefusedUntilTheStateIsLoadedAgain) {
  zero::OffloadSpec spec;
  spec.optimizer = OffloadDevice::Nvme;
  spec.optimizer_nvme_path = offload_dir();
  spec.sub_group_size = 4096;  // two regions of 8192 elements: four chunks
  spec.optimizer_buffer_count = 2;
  zero::OffloadRule adam;
  adam.adam.lr = 0.1;
  zero::OptimizerOffload file(spec, test::world()->rank(), {{8192, adam}, {8192, adam}});
  at::manual_seed(3);
  std::vector<at::Tensor> masters{at::randn({8192}), at::randn({8192})};
  for (std::size_t i = 0; i < 2; ++i) file.init(i, masters[i]);
  const std::vector<at::Tensor> grads{at::randn({8192}), at::randn({8192})};
  const std::vector<zero::OffloadRule> rules{adam, adam};
  auto nothing = [](std::size_t, std::int64_t, const at::Tensor&) {};
  file.step(grads, rules, nothing);
  // What a checkpoint holds after that step (every slot of every region).
  std::vector<std::vector<at::Tensor>> saved(2);
  for (std::size_t i = 0; i < 2; ++i)
    for (int slot = 0; slot <= adam.state_count(); ++slot) saved[i].push_back(file.read(i, slot));
  int chunks = 0;
  EXPECT_THROW(file.step(grads, rules,
                         [&](std::size_t, std::int64_t, const at::Tensor&) {
                           if (++chunks == 3) throw std::runtime_error("injected I/O failure");
                         }),
               std::runtime_error);
  for (const std::string what : {"read", "step"}) {
    try {
      if (what == "read")
        file.read(0, 0);
      else
        file.step(grads, rules, nothing);
      ADD_FAILURE() << what << " of a half-stepped file was allowed";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(file.path()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("injected I/O failure"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("load_state"), std::string::npos) << e.what();
    }
  }
  // Loading writes every slot back; one slot short, the file is still refused.
  for (std::size_t i = 0; i < 2; ++i)
    for (int slot = 0; slot <= adam.state_count(); ++slot)
      if (i != 1 || slot != adam.state_count()) file.write(i, slot, saved[i][slot]);
  EXPECT_THROW(file.read(0, 0), std::runtime_error);
  file.write(1, adam.state_count(), saved[1][adam.state_count()]);
  for (std::size_t i = 0; i < 2; ++i)
    for (int slot = 0; slot <= adam.state_count(); ++slot)
      EXPECT_TRUE(at::equal(file.read(i, slot), saved[i][slot])) << "region " << i << " slot " << slot;
  file.step(grads, rules, nothing);
}

// The staging buffer a parameter read lands in next (zero::choose_staging_buffer): on a device, a buffer
// whose copy to the device still runs is the last choice short of landing a read, so the host does
// not wait for the device at each prefetch.
TEST(OffloadStaging, AFreeBufferWhoseCopyIsDoneComesFirst) {
  using zero::choose_staging_buffer;
  using zero::kGrowBuffer;
  using zero::kLandOldestRead;
  // The host (no copies): the lowest free buffer.
  EXPECT_EQ(choose_staging_buffer({false, true, true}, {false, false, false}, {0, 0, 0}, true), 1);
  // Buffer 0's copy runs (it was just queued), buffer 1's is done: 1, not 0.
  EXPECT_EQ(choose_staging_buffer({true, true}, {true, false}, {7, 3}, false), 1);
  // Every free buffer's copy runs: another buffer while the count allows...
  EXPECT_EQ(choose_staging_buffer({true, true, false}, {true, true, false}, {5, 3, 0}, true), kGrowBuffer);
  // ...else the free one whose copy was queued first (3, not 5 or 9).
  EXPECT_EQ(choose_staging_buffer({true, true, false, true}, {true, true, false, true}, {5, 3, 0, 9}, false), 1);
  // None free: another buffer, or else land the oldest read.
  EXPECT_EQ(choose_staging_buffer({false, false}, {false, false}, {0, 0}, true), kGrowBuffer);
  EXPECT_EQ(choose_staging_buffer({false, false}, {true, false}, {2, 0}, false), kLandOldestRead);
  EXPECT_EQ(choose_staging_buffer({}, {}, {}, true), kGrowBuffer);
}

}  // namespace
}  // namespace accel::test
