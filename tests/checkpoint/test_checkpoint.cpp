// save_state / load_state in one process per rank: every supported optimizer's state survives a
// round trip (sharded and full checkpoints) under each strategy (training on from a loaded checkpoint is bitwise the
// training that went on without it), a failed load changes nothing, and the bookkeeping (automatic names, the total
// limit, registered objects, the step counter) works.
#include "test_world.h"

#include "accelerator/accelerator.h"
#include "accelerator/lr_schedule.h"
#include "base/files.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/sharded_state.h"
#include "models/gpt.h"
#include "sharding/flat_param.h"
#include "sharding/sharded_init.h"
#include "sharding/unit.h"
#include "support/emulated_device.h"
#include "zero/engine.h"
#include "zero/optimizers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/data/datasets/base.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

namespace accel::test {
namespace {

// A unit in the middle (so ZeRO-3 / FULL_SHARD shard it on its own) and a buffer the loop updates.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    in = register_module("in", torch::nn::Linear(6, 8));
    blk = accel::unit(register_module("blk", torch::nn::Linear(8, 8)));
    out = register_module("out", torch::nn::Linear(8, 3));
    seen = register_buffer("seen", at::zeros({2}, at::kDouble));
  }
  at::Tensor forward(const at::Tensor& x) { return out(at::tanh(blk(at::tanh(in(x))))); }
  torch::nn::Linear in{nullptr}, out{nullptr};
  accel::Unit<torch::nn::LinearImpl> blk{nullptr};
  at::Tensor seen;
};

std::shared_ptr<NetImpl> make_net() {
  at::manual_seed(11);
  auto n = std::make_shared<NetImpl>();
  n->to(at::kDouble);
  return n;
}

// Step s's global batch of 12 rows (closed form, no RNG); each rank takes its contiguous part.
void train(Accelerator& acc, NetImpl& net, AcceleratedOptimizer& opt, int from, int to) {
  const int n = acc.num_processes(), r = acc.process_index(), rows = 12 / n;
  for (int s = from; s < to; ++s) {
    at::Tensor x = at::sin(at::arange(72, at::kDouble) * 0.37 + s).view({12, 6}).narrow(0, r * rows, rows);
    at::Tensor y = at::cos(at::arange(36, at::kDouble) * 0.21 + 2 * s).view({12, 3}).narrow(0, r * rows, rows);
    acc.backward(at::mse_loss(net.forward(x), y));
    opt.step();
    opt.zero_grad();
    c10::NoGradGuard ng;
    net.seen.add_(1.0);
  }
}

std::map<std::string, at::Tensor> weights(Accelerator& acc) {
  std::map<std::string, at::Tensor> m;
  for (auto& [k, v] : acc.get_state_dict()) m[k] = v;
  return m;
}

void expect_same(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    EXPECT_TRUE(at::equal(v, b.at(k))) << k << " differs: max |d| " << (v - b.at(k)).abs().max().item<double>();
  }
}

std::string write_config(const std::string& dir, const std::string& name, const std::string& yaml) {
  const std::string p = dir + "/" + name + ".yaml";
  if (world()->rank() == 0) std::ofstream(p) << yaml;
  world()->barrier();
  return p;
}

AcceleratorOptions with_config(const std::string& file, const std::string& project_dir = "") {
  AcceleratorOptions o;
  if (!file.empty()) o.config_file = file;
  o.report_ignored_keys = false;
  o.project_dir = project_dir;
  return o;
}

struct OptimizerCase {
  std::string name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(NetImpl&)> make;
};

std::vector<OptimizerCase> optimizers() {
  return {
      {"Adam",
       [](NetImpl& n) {
         return std::make_unique<torch::optim::Adam>(n.parameters(), torch::optim::AdamOptions(0.01));
       }},
      {"AdamW_amsgrad",
       [](NetImpl& n) {
         return std::make_unique<torch::optim::AdamW>(n.parameters(), torch::optim::AdamWOptions(0.01).amsgrad(true));
       }},
      {"SGD_nesterov",
       [](NetImpl& n) {
         return std::make_unique<torch::optim::SGD>(n.parameters(),
                                                    torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
       }},
      {"RMSprop_centered",
       [](NetImpl& n) {
         return std::make_unique<torch::optim::RMSprop>(
             n.parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
       }},
      {"Adagrad",
       [](NetImpl& n) {
         return std::make_unique<torch::optim::Adagrad>(n.parameters(), torch::optim::AdagradOptions(0.1));
       }},
  };
}

const std::vector<std::pair<std::string, std::string>>& strategies() {
  static const std::vector<std::pair<std::string, std::string>> s{
      {"ddp", "distributed_type: MULTI_CPU\n"},
      // DeepSpeed JSON (no loader is prepared, so the micro batch is given).
      {"zero1", R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}})"},
      {"zero3", R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}})"},
      {"full_shard", "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"},
  };
  return s;
}

TEST(Checkpoint, EveryOptimizersStateRoundTripsUnderEveryStrategy) {
  const std::string dir = scratch_dir("round_trip");
  for (const auto& [sname, yaml] : strategies()) {
    for (const auto& oc : optimizers()) {
      SCOPED_TRACE(sname + " / " + oc.name);
      Accelerator acc(with_config(write_config(dir, sname, yaml)));
      auto net = make_net();
      auto inner = oc.make(*net);
      auto opt = acc.prepare(net, *inner);
      train(acc, *net, *opt, 0, 2);
      const std::string sharded = acc.save_state(dir + "/" + sname + "_" + oc.name);
      const std::string full = acc.save_state(dir + "/" + sname + "_" + oc.name + "_full", /*full=*/true);
      EXPECT_EQ(acc.step(), 2);
      train(acc, *net, *opt, 2, 5);
      const auto straight = weights(acc);
      for (const std::string& ckpt : {sharded, full}) {
        SCOPED_TRACE(ckpt);
        acc.load_state(ckpt);  // back to step 2: weights, moments, buffer, step counter
        EXPECT_EQ(acc.step(), 2);
        train(acc, *net, *opt, 2, 5);
        const auto resumed = weights(acc);
        if (acc.is_main_process()) expect_same(straight, resumed);
        EXPECT_EQ(net->seen[0].item<double>(), 5.0) << "the buffer was restored to 2, then counted 3 steps";
      }
    }
  }
}

// Offload from a device (the optimizer, and the parameters, in host memory), on the CPU through the
// device path's emulation (zero::HostCopies::emulate_device_for_tests): a checkpoint saved there
// round-trips (training on from it is bitwise the training that went on), and loads into the same
// strategy without offload, not emulated, which trains on to the same bits. load_state writes the
// host masters while copies to and from them may be queued; save_state reads them.
TEST(Checkpoint, OffloadFromADeviceRoundTripsAndLoadsWithoutIt) {
  const std::string dir = scratch_dir("offload_device");
  struct Case {
    std::string name, offloaded, plain;
    bool params;  // parameter shards in host memory too
  };
  const std::string micro = R"("train_micro_batch_size_per_gpu": 4, )";
  const std::vector<Case> cases{
      {"zero2_optimizer", "{" + micro + R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})",
       "{" + micro + R"("zero_optimization": {"stage": 2}})", false},
      {"zero3_both",
       "{" + micro +
           R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})",
       "{" + micro + R"("zero_optimization": {"stage": 3}})", true},
      {"full_shard_params",
       "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: true\n",
       "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string sharded, full;
    std::map<std::string, at::Tensor> straight;
    {
      const std::string config = write_config(dir, c.name, c.offloaded);
      // (read as the Accelerator takes the config and as prepare() builds the engine)
      std::optional<EmulatedDevice> emulated(std::in_place);
      Accelerator acc(with_config(config));
      // (on a GPU machine the run takes the device: CudaTraining_CUDA covers offload there)
      if (!acc.device().is_cpu()) GTEST_SKIP() << "emulates a device on the CPU; this run is on " << acc.device();
      auto net = make_net();
      torch::optim::Adam inner(net->parameters(), torch::optim::AdamOptions(0.01));
      auto opt = acc.prepare(net, inner);
      emulated.reset();
      std::size_t host_masters = 0;
      for (const auto& f : acc.engine()->flats()) host_masters += f.master_in_host_memory ? 1 : 0;
      EXPECT_GT(host_masters, 0u) << "not the device's path";
      const auto* po = acc.engine()->param_offload();
      EXPECT_EQ(po != nullptr && po->in_host_memory(), c.params);
      train(acc, *net, *opt, 0, 2);
      sharded = acc.save_state(dir + "/" + c.name);
      full = acc.save_state(dir + "/" + c.name + "_full", /*full=*/true);
      train(acc, *net, *opt, 2, 5);
      straight = weights(acc);
      for (const std::string& ckpt : {sharded, full}) {
        SCOPED_TRACE(ckpt);
        acc.load_state(ckpt);
        train(acc, *net, *opt, 2, 5);
        const auto resumed = weights(acc);
        if (acc.is_main_process()) expect_same(straight, resumed);
      }
    }
    Accelerator acc(with_config(write_config(dir, c.name + "_plain", c.plain)));
    auto net = make_net();
    torch::optim::Adam inner(net->parameters(), torch::optim::AdamOptions(0.01));
    auto opt = acc.prepare(net, inner);
    acc.load_state(sharded);
    train(acc, *net, *opt, 2, 5);
    const auto plain = weights(acc);
    if (acc.is_main_process()) expect_same(straight, plain);
  }
}

// A frozen parameter in the root unit, which ZeRO-3 and FULL_SHARD keep gathered from step to step:
// load_state gives it the checkpoint's values where the forward reads them, not only in its shard.
TEST(Checkpoint, FrozenRootParametersTakeTheCheckpointsValues) {
  const std::string dir = scratch_dir("frozen_root");
  const at::Tensor x = at::sin(at::arange(18, at::kDouble) * 0.7).view({3, 6});
  for (const auto& [sname, yaml] : strategies()) {
    SCOPED_TRACE(sname);
    auto run = [&](bool perturb) {
      auto acc = std::make_unique<Accelerator>(with_config(write_config(dir, sname, yaml)));
      auto net = make_net();
      c10::NoGradGuard ng;
      if (perturb) net->in->weight.fill_(0.25);  // not the checkpoint's values
      net->in->weight.set_requires_grad(false);
      return std::make_pair(std::move(acc), net);
    };
    std::string ckpt;
    std::map<std::string, at::Tensor> want;
    at::Tensor out_want;
    {
      auto [acc, net] = run(false);
      torch::optim::Adam inner(net->parameters(), torch::optim::AdamOptions(0.01));
      auto opt = acc->prepare(net, inner);
      train(*acc, *net, *opt, 0, 2);
      ckpt = acc->save_state(dir + "/" + sname);
      want = weights(*acc);
      c10::NoGradGuard ng;
      out_want = net->forward(x);
    }
    auto [acc, net] = run(true);
    torch::optim::Adam inner(net->parameters(), torch::optim::AdamOptions(0.01));
    auto opt = acc->prepare(net, inner);
    acc->load_state(ckpt);
    const auto got = weights(*acc);
    if (acc->is_main_process()) expect_same(want, got);
    c10::NoGradGuard ng;
    const at::Tensor out = net->forward(x);
    EXPECT_TRUE(at::equal(out, out_want)) << "max |d| " << (out - out_want).abs().max().item<double>();
  }
}

TEST(Checkpoint, AFailedLoadChangesNothing) {
  const std::string dir = scratch_dir("failed_load");
  Accelerator acc(with_config(write_config(dir, "zero3", strategies()[2].second)));
  auto net = make_net();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto opt = acc.prepare(net, adamw);
  train(acc, *net, *opt, 0, 2);
  const std::string good = acc.save_state(dir + "/good");
  const std::string bad = acc.save_state(dir + "/bad");
  train(acc, *net, *opt, 2, 3);
  const auto before = weights(acc);
  const std::string last = "shard_" + std::to_string(acc.num_processes() - 1) + ".bin";
  if (acc.is_main_process()) ASSERT_EQ(::truncate((bad + "/" + last).c_str(), 8), 0);
  world()->barrier();
  try {
    acc.load_state(bad);
    ADD_FAILURE() << "a truncated checkpoint loaded";
  } catch (const checkpoint::CheckpointError& e) {
    // The rank that reads the truncated slices names the file; the others say which rank failed.
    const std::string m = e.what();
    EXPECT_TRUE(m.find(last + " is truncated") != std::string::npos || m.find("failed on rank") != std::string::npos)
        << m;
  }
  EXPECT_EQ(acc.step(), 3);
  const auto after = weights(acc);
  if (acc.is_main_process()) expect_same(before, after);
  // The optimizer is untouched too: going on from here equals going on from `good` + one step.
  train(acc, *net, *opt, 3, 4);
  const auto went_on = weights(acc);
  acc.load_state(good);
  train(acc, *net, *opt, 2, 4);
  const auto from_good = weights(acc);  // collective: every rank gathers
  if (acc.is_main_process()) expect_same(went_on, from_good);
}

// A checkpoint saved before the first step holds no optimizer state: loading it must also drop the
// state the optimizer built since, or the steps after it would differ.
TEST(Checkpoint, ACheckpointFromBeforeTheFirstStepResetsTheOptimizer) {
  const std::string dir = scratch_dir("before_first_step");
  for (const auto& [sname, yaml] : strategies()) {
    SCOPED_TRACE(sname);
    Accelerator acc(with_config(write_config(dir, sname, yaml)));
    auto net = make_net();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
    auto opt = acc.prepare(net, adamw);
    const std::string ckpt = acc.save_state(dir + "/" + sname);
    train(acc, *net, *opt, 0, 3);
    const auto first = weights(acc);
    acc.load_state(ckpt);
    EXPECT_EQ(acc.step(), 0);
    train(acc, *net, *opt, 0, 3);
    const auto second = weights(acc);
    if (acc.is_main_process()) expect_same(first, second);
  }
}

TEST(Checkpoint, OptimizerMismatchNamesBothTypes) {
  const std::string dir = scratch_dir("mismatch");
  std::string ckpt;
  {
    Accelerator acc(with_config(""));
    auto net = make_net();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
    auto opt = acc.prepare(net, adamw);
    train(acc, *net, *opt, 0, 1);
    ckpt = acc.save_state(dir + "/adamw");
  }
  Accelerator acc(with_config(""));
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  acc.prepare(net, sgd);
  try {
    acc.load_state(ckpt);
    ADD_FAILURE() << "AdamW state loaded into SGD";
  } catch (const checkpoint::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds AdamW state but the optimizer is SGD"), std::string::npos) << e.what();
  }
}

// The optimizer table has one row per libtorch optimizer accel supports, each found from an instance,
// and refusing any other optimizer names every row.
struct UnknownOptimizer : torch::optim::Optimizer {
  explicit UnknownOptimizer(std::vector<at::Tensor> ps)
      : torch::optim::Optimizer(std::move(ps), std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  at::Tensor step(LossClosure) override { return {}; }
};

TEST(OptimizerTable, EveryRowIsFoundAndTheRefusalNamesEveryRow) {
  auto net = make_net();
  std::vector<std::pair<std::string, std::unique_ptr<torch::optim::Optimizer>>> expected;
  expected.emplace_back("Adam",
                        std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.1)));
  expected.emplace_back("AdamW",
                        std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.1)));
  expected.emplace_back("SGD", std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)));
  expected.emplace_back("RMSprop",
                        std::make_unique<torch::optim::RMSprop>(net->parameters(), torch::optim::RMSpropOptions(0.1)));
  expected.emplace_back("Adagrad",
                        std::make_unique<torch::optim::Adagrad>(net->parameters(), torch::optim::AdagradOptions(0.1)));
  ASSERT_EQ(zero::optimizer_rows().size(), expected.size());
  for (const auto& [name, opt] : expected) {
    const zero::OptimizerRow* row = zero::find_optimizer_row(*opt);
    ASSERT_NE(row, nullptr) << name;
    EXPECT_EQ(std::string(row->name), name);
  }
  auto refusal = [&](torch::optim::Optimizer& opt) -> std::string {
    Accelerator acc(with_config(""));
    auto fresh = make_net();
    try {
      acc.prepare(fresh, opt);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(prepared)";
  };
  UnknownOptimizer unknown(net->parameters());
  EXPECT_EQ(zero::find_optimizer_row(unknown), nullptr);
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.1));
  for (const std::string& msg : {refusal(unknown), refusal(lbfgs)})
    for (const auto& row : zero::optimizer_rows())
      EXPECT_NE(msg.find(row.name), std::string::npos) << row.name << " in: " << msg;
  EXPECT_NE(refusal(unknown).find("UnknownOptimizer"), std::string::npos);
  EXPECT_NE(refusal(lbfgs).find("LBFGS cannot be sharded"), std::string::npos);
}

TEST(Checkpoint, AutomaticNamesTotalLimitAndRegisteredObjects) {
  const std::string dir = scratch_dir("automatic");
  AcceleratorOptions o = with_config("", dir);
  o.total_limit = 2;
  Accelerator acc(o);
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto opt = acc.prepare(net, sgd);
  int counter = 0;
  acc.register_for_checkpointing(
      "counter", [&] { return std::to_string(counter); }, [&](const std::string& s) { counter = std::stoi(s); });
  for (int i = 1; i <= 3; ++i) {
    train(acc, *net, *opt, i - 1, i);
    counter = 10 * i;
    EXPECT_EQ(acc.save_state(), dir + "/checkpoints/checkpoint_" + std::to_string(i - 1));
  }
  const auto kept = checkpoint::automatic_checkpoints(dir);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].first, 1);
  EXPECT_EQ(kept[1].first, 2);
  train(acc, *net, *opt, 3, 5);
  counter = -1;
  acc.load_state();  // the newest: checkpoint_2, saved at step 3 with counter 30
  EXPECT_EQ(acc.step(), 3);
  EXPECT_EQ(counter, 30);
  EXPECT_THROW(acc.register_for_checkpointing(
                   "a/b", [] { return std::string(); }, [](const std::string&) {}),
               std::invalid_argument);
}

// Sample i of a dataset of n: x = y = [i].
struct SampleIds : torch::data::datasets::Dataset<SampleIds> {
  explicit SampleIds(std::size_t n) : n(n) {}
  torch::data::Example<> get(std::size_t i) override {
    const at::Tensor v = at::full({1}, static_cast<double>(i), at::kDouble);
    return {v, v};
  }
  std::optional<std::size_t> size() const override { return n; }
  std::size_t n;
};

// The sample indices every optimizer step read over all ranks (sorted), for `steps` steps.
std::vector<std::vector<std::int64_t>> step_samples(Accelerator& acc, std::shared_ptr<torch::nn::LinearImpl>& net,
                                                    AcceleratedOptimizer& opt, DataLoader<SampleIds>& loader,
                                                    int steps) {
  std::vector<std::vector<std::int64_t>> out;
  std::vector<std::int64_t> cur;
  while (static_cast<int>(out.size()) < steps) {
    for (const Batch& b : loader) {
      auto scope = acc.accumulate(net);
      acc.backward(at::mse_loss(net->forward(b.data), b.target));
      opt.step();
      opt.zero_grad();
      const at::Tensor all = acc.gather(b.data).reshape({-1}).to(at::kLong);
      for (std::int64_t k = 0; k < all.numel(); ++k) cur.push_back(all[k].item<std::int64_t>());
      if (!acc.sync_gradients()) continue;
      std::sort(cur.begin(), cur.end());
      out.push_back(std::exchange(cur, {}));
      if (static_cast<int>(out.size()) == steps) break;
    }
  }
  return out;
}

// A job restarted on fewer ranks than it started with (`accel launch --min_nodes` sets
// ACCEL_INITIAL_WORLD_SIZE): gradient accumulation grows by initial / now, a split_batches loader reads
// global batches that many times smaller, so an optimizer step reads the samples it read before; and
// a checkpoint saved with the larger global batch resumes at the same sample of the epoch. Simulated
// at one world size: ACCEL_INITIAL_WORLD_SIZE = 2 x this world.
TEST(Checkpoint, AJobOnFewerRanksKeepsTheGlobalBatchAndResumesAtTheSameSample) {
  const int W = world()->size();
  const std::string dir = scratch_dir("shrink");
  const std::int64_t batch = 4 * W;  // global (split_batches): 4 samples per rank
  auto run = [&](int from_step, int steps) {
    Accelerator acc(with_config("", dir));
    at::manual_seed(0);
    auto net = std::make_shared<torch::nn::LinearImpl>(1, 1);
    net->to(at::kDouble);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01));
    DataLoader<SampleIds> loader(SampleIds(64 * W),
                                 {.batch_size = batch, .shuffle = true, .split_batches = true, .seed = 5});
    auto opt = acc.prepare(net, sgd, loader);
    if (from_step > 0) {
      acc.load_state();
      EXPECT_EQ(acc.step(), from_step);
    }
    auto samples = step_samples(acc, net, *opt, loader, steps);
    if (from_step == 0) acc.save_state();  // after `steps` steps
    return std::make_tuple(std::move(samples), acc.gradient_accumulation_steps(), loader.plan().per_process_batch());
  };
  const auto [full, accum, per_rank] = run(0, 5);  // 5 steps; checkpoint_0 holds step 5
  EXPECT_EQ(accum, 1);
  EXPECT_EQ(per_rank, 4);
  ASSERT_EQ(setenv("ACCEL_INITIAL_WORLD_SIZE", std::to_string(2 * W).c_str(), 1), 0);
  const auto [resumed, accum2, per_rank2] = run(5, 3);  // steps 6-8 at "half the world"
  EXPECT_EQ(accum2, 2);
  EXPECT_EQ(per_rank2, 2);
  // The same samples as an uninterrupted run's steps 6-8: a fresh run without the variable.
  unsetenv("ACCEL_INITIAL_WORLD_SIZE");
  if (world()->rank() == 0) files::remove_tree(dir + "/checkpoints");
  world()->barrier();
  const auto [straight, a3, p3] = run(0, 8);
  ASSERT_EQ(resumed.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(resumed[k], straight[5 + k]) << "optimizer step " << 6 + k;
    EXPECT_EQ(resumed[k].size(), static_cast<std::size_t>(batch));
  }
  EXPECT_EQ(std::vector(straight.begin(), straight.begin() + 5), full);
  // A world that does not divide the initial one cannot keep the global batch: refused.
  if (W > 1) {
    ASSERT_EQ(setenv("ACCEL_INITIAL_WORLD_SIZE", std::to_string(2 * W + 1).c_str(), 1), 0);
    EXPECT_THROW(Accelerator(with_config("", dir)), ConfigError);
    unsetenv("ACCEL_INITIAL_WORLD_SIZE");
  }
}

// The samples a loader's next pass yields, over all ranks, batch by batch.
std::vector<std::vector<std::int64_t>> one_pass(Accelerator& acc, DataLoader<SampleIds>& loader) {
  std::vector<std::vector<std::int64_t>> out;
  for (const Batch& b : loader) {
    const at::Tensor all = acc.gather(b.data).reshape({-1}).to(at::kLong);
    out.emplace_back(all.data_ptr<std::int64_t>(), all.data_ptr<std::int64_t>() + all.numel());
  }
  return out;
}

// An Accelerator with a model of its own (Linear 1 -> 1 in float64) and a loader over n samples,
// prepared together.
struct PreparedRun {
  PreparedRun(const AcceleratorOptions& o, std::int64_t n, const DataLoaderOptions& lo)
      : acc(o), loader(SampleIds(static_cast<std::size_t>(n)), lo) {
    net->to(at::kDouble);
    opt = acc.prepare(net, sgd, loader);
  }
  Accelerator acc;
  DataLoader<SampleIds> loader;
  std::shared_ptr<torch::nn::LinearImpl> net = std::make_shared<torch::nn::LinearImpl>(1, 1);
  torch::optim::SGD sgd{net->parameters(), torch::optim::SGDOptions(0.01)};
  std::shared_ptr<AcceleratedOptimizer> opt;
};

// Where a loader resumes: saved on its epoch's last batch, the next pass is the next epoch (also after
// the user's set_epoch, as Accelerate's recipe does); a position past the dataset under another global
// batch is the epoch's end too; a loader prepared after an automatic resume (prepare(model,
// optimizer), then prepare_data_loader) still gets its position.
TEST(Checkpoint, LoadersResumeWhereTheyStopped) {
  const int W = world()->size();
  const std::string dir = scratch_dir("loader_resume");
  const DataLoaderOptions opts{.batch_size = 2, .shuffle = true, .seed = 5};
  std::vector<std::vector<std::int64_t>> epoch1;  // what an uninterrupted run reads in epoch 1
  {
    PreparedRun r(with_config("", dir), 8 * W, opts);
    Accelerator& acc = r.acc;
    auto& loader = r.loader;
    one_pass(acc, loader);
    epoch1 = one_pass(acc, loader);
  }
  ASSERT_EQ(epoch1.size(), 4u);
  {  // stopped on the epoch's last batch (before the loop ends it), then saved
    PreparedRun r(with_config("", dir), 8 * W, opts);
    Accelerator& acc = r.acc;
    auto& loader = r.loader;
    int k = 0;
    for (const Batch& b : loader) {
      (void)b;
      if (++k == 4) break;
    }
    acc.save_state(dir + "/at_end");
  }
  for (bool set_epoch : {false, true}) {
    PreparedRun r(with_config("", dir), 8 * W, opts);
    Accelerator& acc = r.acc;
    auto& loader = r.loader;
    acc.load_state(dir + "/at_end");
    if (set_epoch) loader.set_epoch(1);
    EXPECT_EQ(one_pass(acc, loader), epoch1) << "set_epoch " << set_epoch;
  }
  // A dataset of 7W samples, all of epoch 0 read under a global batch of W (as if saved at world 1
  // with batch W: the index edited so). Under a global batch of 2W now, 7W samples are 3.5 batches:
  // the next pass is epoch 1, not the rest of batch 3 again.
  std::vector<std::vector<std::int64_t>> epoch1_of_7;
  {
    PreparedRun r(with_config("", dir), 7 * W, opts);
    Accelerator& acc = r.acc;
    auto& loader = r.loader;
    one_pass(acc, loader);
    epoch1_of_7 = one_pass(acc, loader);
  }
  if (world()->rank() == 0) {
    nlohmann::json index = nlohmann::json::parse(files::read_file(dir + "/at_end/index.json"));
    index["training"]["loaders"][0]["batches_consumed"] = 7;
    index["training"]["loaders"][0]["global_batch"] = W;
    const std::string text = index.dump();
    files::write_file_synced(dir + "/at_end/index.json", text.data(), text.size());
  }
  world()->barrier();
  {
    PreparedRun r(with_config("", dir), 7 * W, opts);
    Accelerator& acc = r.acc;
    auto& loader = r.loader;
    acc.load_state(dir + "/at_end");
    EXPECT_EQ(one_pass(acc, loader), epoch1_of_7) << "under another global batch";
  }
  // Mid-epoch (2 of 4 batches), resumed by auto_resume in prepare(model, optimizer), the loader after.
  {
    PreparedRun r(with_config("", dir), 8 * W, opts);
    Accelerator& acc = r.acc;
    auto& loader = r.loader;
    one_pass(acc, loader);  // epoch 0
    int k = 0;
    for (const Batch& b : loader) {
      (void)b;
      if (++k == 2) break;
    }
    acc.save_state();  // <dir>/checkpoints/checkpoint_0
  }
  {
    AcceleratorOptions o = with_config("", dir);
    o.auto_resume = true;
    Accelerator acc(o);
    auto net = std::make_shared<torch::nn::LinearImpl>(1, 1);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01));
    acc.prepare(net, sgd);
    DataLoader<SampleIds> loader(SampleIds(8 * W), opts);
    acc.prepare_data_loader(loader);
    EXPECT_EQ(one_pass(acc, loader), std::vector(epoch1.begin() + 2, epoch1.end())) << "auto_resume, loader after";
  }
}

// A schedule prepared after an automatic resume (prepare(model, optimizer) loads the checkpoint; the
// schedule comes after) takes the program's learning rate as its base and steps on from the saved
// count: the learning rates, and OneCycle's betas, are those of a run never stopped (the saved rate,
// already scheduled, is not the base), also from a checkpoint of step 0, whose rate is the warmup's 0.
// A resume that prepares no schedule runs at the saved rate; one saved again before a step or a
// schedule is still the checkpoint it loaded; a load_state of an earlier checkpoint takes the schedule
// back to it.
TEST(Checkpoint, SchedulesPreparedAfterAResumeFollowTheUninterruptedRun) {
  const std::string dir = scratch_dir("schedule_resume");
  struct Case {
    std::string name, config;  // config: a DeepSpeed JSON ("" for none: the program's own schedule)
  };
  const std::vector<Case> cases = {
      {"cosine_block", R"({"zero_optimization": {"stage": 1}, "train_batch_size": 12,
        "optimizer": {"type": "Adam", "params": {"lr": "auto"}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 3,
                                                           "warmup_type": "linear", "cos_min_ratio": 0.1}}})"},
      {"onecycle_block", R"({"zero_optimization": {"stage": 2}, "train_batch_size": 12,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
        "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01,
                                                     "cycle_first_step_size": 3, "cycle_second_step_size": 4}}})"},
      {"program_cosine", ""},
  };
  const int total = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string config = c.config.empty() ? "" : write_config(dir, c.name, c.config);
    // Trains from the newest checkpoint in `project` (auto_resume) or from the start, to step `to`, with
    // the schedule or without one; returns the learning rate and beta1 each step ran at. rewind: after
    // step 7, load the checkpoint of step 4 saved on the way (the schedule goes back) and go on.
    auto run = [&](const std::string& project, bool resume, int to, bool save, bool schedule, bool rewind = false) {
      AcceleratorOptions o = with_config(config, project);
      o.auto_resume = resume;
      Accelerator acc(o);
      auto net = make_net();
      std::shared_ptr<AcceleratedOptimizer> opt;
      std::shared_ptr<AcceleratedScheduler> sched;
      std::shared_ptr<torch::optim::Optimizer> inner;
      if (c.config.empty()) {
        inner = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.01));
        opt = acc.prepare(net, *inner);
        if (schedule) sched = acc.prepare_scheduler(std::make_shared<CosineSchedule>(opt->inner(), total, 3, 0.1));
      } else {
        inner = acc.create_optimizer(net->parameters(), {.lr = 0.01});
        opt = acc.prepare(net, *inner);
        if (schedule) sched = acc.create_scheduler({.total_num_steps = total});
      }
      std::vector<std::pair<double, double>> seen;
      bool rewound = false;
      for (int s = static_cast<int>(acc.step()); s < to; ++s) {
        if (rewind && !rewound && s == 4) acc.save_state(project + "/at4");
        if (rewind && !rewound && s == 7) {
          acc.load_state(project + "/at4");
          rewound = true;
          s = 4;
          seen.resize(4);
        }
        train(acc, *net, *opt, s, s + 1);
        const auto& g = opt->param_groups()[0].options();  // (what the step ran at: the schedule steps next)
        const auto* w = dynamic_cast<const torch::optim::AdamWOptions*>(&g);
        seen.emplace_back(g.get_lr(), w ? std::get<0>(w->betas()) : -1.0);
        if (sched) sched->step();
      }
      if (save) acc.save_state();
      return seen;
    };
    const auto whole = run(dir + "/" + c.name + "_whole", false, total, false, true);
    ASSERT_EQ(whole.size(), static_cast<std::size_t>(total));
    EXPECT_NE(whole[4].first, whole[5].first);  // (the schedule moves there)
    for (const int stop : {0, 4}) {
      SCOPED_TRACE("stopped after step " + std::to_string(stop));
      const std::string project = dir + "/" + c.name + "_" + std::to_string(stop);
      run(project, false, stop, true, true);
      const auto rest = run(project, true, total, false, true);
      ASSERT_EQ(rest.size(), static_cast<std::size_t>(total - stop));
      for (int k = 0; k < total - stop; ++k) {
        EXPECT_DOUBLE_EQ(rest[k].first, whole[stop + k].first) << "lr of step " << stop + k + 1;
        EXPECT_DOUBLE_EQ(rest[k].second, whole[stop + k].second) << "beta1 of step " << stop + k + 1;
      }
    }
    // Resumed without a schedule: every step at the saved rate (the one step 5 ran at).
    const auto unscheduled = run(dir + "/" + c.name + "_4", true, total, false, false);
    ASSERT_EQ(unscheduled.size(), static_cast<std::size_t>(total - 4));
    for (const auto& [lr, beta1] : unscheduled) EXPECT_DOUBLE_EQ(lr, whole[4].first);
    // A checkpoint loaded after the schedule went past it: the schedule goes back to it.
    const auto rewound = run(dir + "/" + c.name + "_rewind", false, total, false, true, true);
    ASSERT_EQ(rewound.size(), static_cast<std::size_t>(total));
    for (int k = 4; k < total; ++k) {
      EXPECT_DOUBLE_EQ(rewound[k].first, whole[k].first) << "rewound, lr of step " << k + 1;
      EXPECT_DOUBLE_EQ(rewound[k].second, whole[k].second) << "rewound, beta1 of step " << k + 1;
    }
    // Saved again right after a resume, before a step or a schedule: still the checkpoint it loaded.
    run(dir + "/" + c.name + "_4", true, 4, true, false);
    const auto again = run(dir + "/" + c.name + "_4", true, total, false, true);
    ASSERT_EQ(again.size(), static_cast<std::size_t>(total - 4));
    for (int k = 0; k < total - 4; ++k) EXPECT_DOUBLE_EQ(again[k].first, whole[4 + k].first) << "step " << 5 + k;
  }
}

// Without even_batches the first ranks hold one batch more than the others. A checkpoint (rank 0's
// position) saved before the epoch's end keeps every rank in that epoch: the ranks that had read all
// of theirs read nothing more of it, and the next pass is epoch 1 on every rank.
TEST(Checkpoint, UnevenLoadersResumeInTheSameEpochOnEveryRank) {
  const int W = world()->size();
  const std::string dir = scratch_dir("uneven_resume");
  const DataLoaderOptions opts{.batch_size = 2, .even_batches = false};
  auto local_pass = [](DataLoader<SampleIds>& loader) {  // this rank's samples (no collective: counts differ)
    std::vector<std::int64_t> out;
    for (const Batch& b : loader)
      for (std::int64_t k = 0; k < b.data.numel(); ++k)
        out.push_back(static_cast<std::int64_t>(b.data[k].item<double>()));
    return out;
  };
  std::vector<std::int64_t> rest_of_epoch0;
  {
    PreparedRun r(with_config("", dir), 2 * W + 1, opts);  // rank 0: 2 batches, the others 1
    int k = 0;
    for (const Batch& b : r.loader) {
      (void)b;
      if (++k == 1) break;
    }
    r.acc.save_state(dir + "/one_batch");
  }
  {
    PreparedRun r(with_config("", dir), 2 * W + 1, opts);
    r.acc.load_state(dir + "/one_batch");
    const auto got = local_pass(r.loader);
    if (world()->rank() == 0)
      EXPECT_EQ(got, std::vector<std::int64_t>{2 * W});  // its second batch: the last sample
    else
      EXPECT_TRUE(got.empty()) << "rank " << world()->rank() << " read " << got.size() << " samples of epoch 1";
    EXPECT_EQ(r.loader.epoch(), 1);
  }
}

// Accumulation windows stay where they were: a checkpoint saved mid-window (a warning says its
// gradients are not in it) resumes with the window's micro-step count, so the next syncs fall on the
// batches an uninterrupted run syncs on.
TEST(Checkpoint, AccumulationWindowsResumeWhereTheyWere) {
  const int W = world()->size();
  const std::string dir = scratch_dir("micro_step");
  auto syncs = [&](PreparedRun& r, int stop_after) {
    std::vector<bool> out;
    for (const Batch& b : r.loader) {
      auto scope = r.acc.accumulate(r.net);
      r.acc.backward(at::mse_loss(r.net->forward(b.data), b.target));
      r.opt->step();
      r.opt->zero_grad();
      out.push_back(r.acc.sync_gradients());
      if (static_cast<int>(out.size()) == stop_after) break;
    }
    return out;
  };
  AcceleratorOptions o = with_config("", dir);
  o.gradient_accumulation_steps = 2;
  std::vector<bool> straight, first, rest;
  {
    PreparedRun r(o, 16 * W, {.batch_size = 2});
    straight = syncs(r, 8);
  }
  {
    PreparedRun r(o, 16 * W, {.batch_size = 2});
    first = syncs(r, 3);  // mid-window
    r.acc.save_state(dir + "/mid");
  }
  {
    PreparedRun r(o, 16 * W, {.batch_size = 2});
    r.acc.load_state(dir + "/mid");
    rest = syncs(r, 5);
  }
  ASSERT_EQ(straight.size(), 8u);
  EXPECT_EQ(first, std::vector(straight.begin(), straight.begin() + 3));
  EXPECT_EQ(rest, std::vector(straight.begin() + 3, straight.end()));
}

// Sharded construction (zero.Init): the GPT's blocks are sharded as they are built, each rank keeps
// 1/N of them, and the prepared model trains exactly as the one built whole. The ranks seed
// differently: only rank 0's values may survive.
TEST(ShardedInit, UnitsAreShardedAsBuiltAndTrainLikeTheWholeModel) {
  const std::string dir = scratch_dir("sharded_init");
  const examples::GPTConfig cfg{11, 8, 2, 3, 5};
  auto run = [&](const std::string& yaml, bool sharded) {
    Accelerator acc(with_config(write_config(dir, "cfg", yaml)));
    const int n = acc.num_processes();
    at::manual_seed(sharded ? 7 + 100 * acc.process_index() : 7);
    std::shared_ptr<examples::GPTImpl> model;
    if (sharded) {
      auto scope = acc.sharded_init();
      model = std::make_shared<examples::GPTImpl>(cfg);
      EXPECT_EQ(scope->units_sharded(), cfg.layers);
      std::int64_t block_params = 0;
      for (auto& b : model->blocks)
        for (const auto& p : b->parameters()) {
          EXPECT_FALSE(sharding::storage_allocated(p)) << "a block parameter kept its storage";
          ++block_params;
        }
      EXPECT_EQ(sharding::presharded_count(), block_params);
      // Reading (or moving) a sharded parameter before prepare() says why it cannot.
      try {
        (void)model->blocks[0]->parameters()[0].sum();
        ADD_FAILURE() << "a sharded parameter was read before prepare()";
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("Accelerator::sharded_init"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("prepare()"), std::string::npos) << e.what();
      }
      // This rank holds its 1/n of every block (plus at most one element of padding per block).
      EXPECT_LE(scope->shard_bytes(), scope->sharded_bytes() / n + cfg.layers * 4);
      EXPECT_GE(scope->shard_bytes(), scope->sharded_bytes() / n - cfg.layers * 4);
    } else {
      model = std::make_shared<examples::GPTImpl>(cfg);
    }
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(0.01));
    auto opt = acc.prepare(model, adamw);
    EXPECT_EQ(sharding::presharded_count(), 0) << "prepare() gives every unit its values back";
    at::Tensor tokens = (at::arange(20, at::kLong) * 7).remainder(11).view({4, 5});
    for (int s = 0; s < 3; ++s) {
      acc.backward(examples::lm_loss(model->forward(tokens), tokens.roll(1, 1)));
      opt->step();
      opt->zero_grad();
    }
    return weights(acc);
  };
  for (const auto& [sname, yaml] : strategies()) {
    SCOPED_TRACE(sname);
    const auto whole = run(yaml, false);
    const auto sharded = run(yaml, true);
    if (world()->rank() == 0) expect_same(whole, sharded);
  }
}

}  // namespace
}  // namespace accel::test
