// Offload to disk (offload_optimizer / offload_param device nvme) against the same run in memory:
// bitwise equal parameters and masters after steps with gradient accumulation, for AdamW and SGD
// (two param groups each), fp32 and bf16 compute over fp32 masters, under ZeRO-1/2/3; the files
// have the sizes the formula gives; the optimizer state leaves memory; checkpoint state round-trips
// through staging.
#include "base/memory.h"
#include "offload/async_file.h"
#include "support/harness.h"
#include "zero/optimizer_offload.h"
#include "zero/param_offload.h"

#include <gtest/gtest.h>
#include <torch/optim/rmsprop.h>

#include <filesystem>
#include <string>
#include <vector>

namespace accel::test {
namespace {

using zero::OffloadDevice;
using zero::ShardingSpec;

// One per world size: ctest may run the np1/np2/np3 tests at the same time.
std::string scratch_dir() {
  const auto dir =
      std::filesystem::temp_directory_path() / ("accel-offload-test-np" + std::to_string(test::world()->size()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

struct TrainedRun {
  std::vector<at::Tensor> compute, masters;  // per flat, whole
  std::uint64_t file_bytes = 0, expected_file_bytes = 0, param_file_bytes = 0, expected_param_bytes = 0;
  std::int64_t optimizer_state_bytes = 0;  // counting allocator, after the steps
};

// Three optimizer steps of the GPT, each of two micro-batches (the first under NoSync).
TrainedRun train(ShardingSpec spec, OptKind opt_kind, c10::ScalarType compute) {
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
  if (const auto* po = p.engine->param_offload()) {
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
      if (micro == 0) {
        zero::Engine::NoSync ns(*p.engine);
        p.engine->backward(loss);
      } else {
        p.engine->backward(loss);
      }
    }
    p.optimizer->step();
    p.optimizer->zero_grad();
  }
  out.optimizer_state_bytes =
      memory::snapshot()[memory::Category::OptimizerState].current - s0[memory::Category::OptimizerState].current;
  for (const auto& f : p.engine->flats()) {
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
  const std::string dir = scratch_dir();
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
  s.offload.optimizer_nvme_path = scratch_dir();
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
  spec.optimizer_nvme_path = scratch_dir();
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
