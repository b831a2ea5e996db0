// The Accelerator front-end at world sizes 1..3: the collectives on tensors against closed forms,
// gradient accumulation's sync pattern, schedulers, clipping, and one training loop under each
// strategy (chosen by a config file) against a single-process libtorch reference.
#include "accelerator/accelerator.h"
#include "accelerator/rows.h"
#include "checkpoint/model_export.h"
#include "checkpoint/safetensors.h"
#include "support/errors.h"
#include "support/models.h"
#include "support/scoped_env.h"
#include "support/simulated_nodes.h"
#include "test_world.h"
#include "zero/plan.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace accel::test {
namespace {

namespace fs = std::filesystem;

// A config file in the job's directory for them (test::scratch_dir; rank 0 writes it, the others wait).
std::string write_config(const std::string& name, const std::string& text) {
  static const std::string dir = scratch_dir("configs");
  auto w = world();
  const std::string p = dir + "/" + name;
  if (w->rank() == 0) std::ofstream(p) << text;
  w->barrier();
  return p;
}

AcceleratorOptions quiet(std::optional<std::string> file = std::nullopt) {
  AcceleratorOptions o;
  o.config_file = std::move(file);
  o.report_ignored_keys = false;
  return o;
}

TEST(Accelerator, ProcessProperties) {
  Accelerator acc(quiet());
  auto w = world();
  EXPECT_EQ(acc.process_index(), w->rank());
  EXPECT_EQ(acc.num_processes(), w->size());
  EXPECT_EQ(acc.is_main_process(), w->rank() == 0);
  EXPECT_EQ(acc.is_last_process(), w->rank() == w->size() - 1);
  EXPECT_TRUE(acc.device().is_cpu());
  // No config: one process is NO; several are DDP over the CPU, as Accelerate's PartialState makes them.
  EXPECT_EQ(acc.distributed_type(), w->size() == 1 ? DistributedType::No : DistributedType::MultiCpu);
  EXPECT_TRUE(acc.sync_gradients());
  EXPECT_EQ(acc.gradient_accumulation_steps(), 1);
}

TEST(Accelerator, GatherConcatenatesInRankOrder) {
  Accelerator acc(quiet());
  const int N = acc.num_processes(), r = acc.process_index();
  at::Tensor mine = at::full({2, 3}, static_cast<double>(r), at::kDouble) + at::arange(3, at::kDouble);
  at::Tensor all = acc.gather(mine);
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{2 * N, 3}));
  for (int k = 0; k < N; ++k)
    EXPECT_TRUE(at::equal(all.narrow(0, 2 * k, 2),
                          at::full({2, 3}, static_cast<double>(k), at::kDouble) + at::arange(3, at::kDouble)));
  at::Tensor scalars = acc.gather(at::scalar_tensor(r + 1, at::kLong));
  ASSERT_EQ(scalars.numel(), N);
  EXPECT_EQ(scalars.sum().item<int64_t>(), static_cast<int64_t>(N) * (N + 1) / 2);
}

TEST(Accelerator, ReduceClosedForms) {
  Accelerator acc(quiet());
  const int N = acc.num_processes(), r = acc.process_index();
  at::Tensor t = at::full({4}, static_cast<double>(r + 1), at::kDouble);
  EXPECT_DOUBLE_EQ(acc.reduce(t, "sum")[0].item<double>(), N * (N + 1) / 2.0);
  EXPECT_DOUBLE_EQ(acc.reduce(t, "mean")[0].item<double>(), (N + 1) / 2.0);
  EXPECT_DOUBLE_EQ(acc.reduce(t, "max")[0].item<double>(), N);
  EXPECT_DOUBLE_EQ(acc.reduce(t, "min")[0].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(t[0].item<double>(), r + 1.0) << "reduce must not modify its input";
  try {
    acc.reduce(t, "avg");
    ADD_FAILURE() << "no error for an unknown reduction";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sum, mean, max, min"), std::string::npos) << e.what();
  }
}

TEST(Accelerator, PadAcrossProcesses) {
  Accelerator acc(quiet());
  const int N = acc.num_processes(), r = acc.process_index();
  at::Tensor t = at::full({r + 1, 2}, 7.0);
  at::Tensor end = acc.pad_across_processes(t, 0, -1.0);
  ASSERT_EQ(end.size(0), N);
  EXPECT_TRUE(at::equal(end.narrow(0, 0, r + 1), t));
  EXPECT_TRUE(at::all(end.narrow(0, r + 1, N - r - 1) == -1.0).item<bool>());
  at::Tensor first = acc.pad_across_processes(t, 0, -1.0, /*pad_first=*/true);
  EXPECT_TRUE(at::equal(first.narrow(0, N - r - 1, r + 1), t));
  // Padded tensors gather: every rank's real rows appear once.
  at::Tensor all = acc.gather(end);
  EXPECT_EQ((all == 7.0).sum().item<int64_t>(), static_cast<int64_t>(N) * (N + 1));  // 2 columns
  EXPECT_THROW(acc.pad_across_processes(t, 2), std::invalid_argument);
}

TEST(Accelerator, SplitBetweenProcesses) {
  Accelerator acc(quiet());
  const int N = acc.num_processes();
  for (int n : {0, 1, 5, 7}) {
    std::vector<int> items(n);
    std::iota(items.begin(), items.end(), 0);
    std::vector<int> mine = acc.split_between_processes(items);
    at::Tensor count = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
    at::Tensor counts = acc.gather(count);
    EXPECT_EQ(counts.sum().item<int64_t>(), n);
    // The first n % N ranks get one more, parts are contiguous and in rank order.
    int64_t start = 0;
    for (int k = 0; k < acc.process_index(); ++k) start += counts[k].item<int64_t>();
    for (std::size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(mine[i], start + static_cast<int64_t>(i));
    EXPECT_EQ(static_cast<int>(mine.size()), n / N + (acc.process_index() < n % N ? 1 : 0));
    std::vector<int> padded = acc.split_between_processes(items, /*apply_padding=*/true);
    if (n > 0) EXPECT_EQ(static_cast<int>(padded.size()), (n + N - 1) / N);
    at::Tensor rows = acc.split_between_processes(at::arange(n).reshape({n, 1}));
    EXPECT_EQ(rows.size(0), static_cast<int64_t>(mine.size()));
    if (rows.size(0) > 0) EXPECT_EQ(rows[0][0].item<int64_t>(), start);
  }
}

TEST(Accelerator, TriggerReachesEveryRank) {
  Accelerator acc(quiet());
  EXPECT_FALSE(acc.check_trigger());
  if (acc.is_last_process()) acc.set_trigger();
  EXPECT_TRUE(acc.check_trigger());
  EXPECT_FALSE(acc.check_trigger()) << "the trigger resets after it fired";
}

TEST(Accelerator, MainProcessFirst) {
  Accelerator acc(quiet());
  const fs::path marker = fs::path(scratch_dir("main_process_first")) / "marker";
  {
    auto first = acc.main_process_first();
    if (acc.is_main_process())
      std::ofstream(marker) << "made by the main process";
    else
      EXPECT_TRUE(fs::exists(marker)) << "rank " << acc.process_index() << " ran before the main process";
  }
  acc.wait_for_everyone();
  if (acc.is_main_process()) fs::remove(marker);
}

// Eval-style iteration: gather_for_metrics sees every sample exactly once, padding dropped.
TEST(Accelerator, GatherForMetricsCountsEachSampleOnce) {
  for (int64_t n : {7, 12, 1}) {
    for (int64_t bs : {2, 3}) {
      Accelerator acc(quiet());
      DataLoader<Rows> loader(Rows(at::arange(n, at::kLong).reshape({n, 1}), at::arange(n, at::kLong)),
                              {.batch_size = bs});
      acc.prepare_data_loader(loader);
      std::vector<int64_t> seen;
      for (const Batch& b : loader) {
        at::Tensor g = acc.gather_for_metrics(b.target);
        for (int64_t i = 0; i < g.numel(); ++i) seen.push_back(g[i].item<int64_t>());
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> want(n);
      std::iota(want.begin(), want.end(), 0);
      EXPECT_EQ(seen, want) << "n " << n << " batch " << bs;
    }
  }
}

// A train loop left by `break`, then an eval loader of another dataset type: the eval loader is the
// active one (the newest iteration, whatever the dataset type), so its padding is dropped.
struct EvalIds : torch::data::datasets::Dataset<EvalIds> {
  explicit EvalIds(std::int64_t n) : n(n) {}
  torch::data::Example<> get(std::size_t i) override {
    const at::Tensor v = at::full({1}, static_cast<std::int64_t>(i), at::kLong);
    return {v, v.reshape({})};
  }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(n); }
  std::int64_t n;
};

TEST(Accelerator, GatherForMetricsFollowsTheNewestLoaderOfAnyDatasetType) {
  Accelerator acc(quiet());
  const int64_t N = acc.num_processes();
  DataLoader<Rows> train(Rows(at::arange(8 * N, at::kLong).reshape({8 * N, 1}), at::arange(8 * N, at::kLong)),
                         {.batch_size = 2});
  DataLoader<EvalIds> eval(EvalIds(3), {.batch_size = 2});
  acc.prepare_data_loader(train);
  acc.prepare_data_loader(eval);
  for (int pass = 0; pass < 2; ++pass) {
    for (const Batch& b : train) {
      (void)b;
      break;  // (max_steps reached, say), then an evaluation; then again from inside the train epoch
    }
    std::int64_t seen = 0;
    for (const Batch& b : eval) seen += acc.gather_for_metrics(b.target).numel();
    EXPECT_EQ(seen, 3) << "pass " << pass;
  }
}

// The same with one string per sample: the padding's strings are dropped too.
TEST(Accelerator, GatherForMetricsOfStringsCountsEachSampleOnce) {
  for (int64_t n : {7, 12, 1}) {
    Accelerator acc(quiet());
    DataLoader<Rows> loader(Rows(at::arange(n, at::kLong).reshape({n, 1}), at::arange(n, at::kLong)),
                            {.batch_size = 3});
    acc.prepare_data_loader(loader);
    std::vector<std::string> seen;
    for (const Batch& b : loader) {
      std::vector<std::string> mine;
      for (int64_t i = 0; i < b.target.numel(); ++i)
        mine.push_back("sample " + std::to_string(b.target[i].item<int64_t>()));
      for (auto& s : acc.gather_for_metrics(mine)) seen.push_back(s);
    }
    std::vector<std::string> want;
    for (int64_t i = 0; i < n; ++i) want.push_back("sample " + std::to_string(i));
    std::sort(seen.begin(), seen.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(seen, want) << "n " << n;
  }
}

// Strings across ranks: lists and strings of different lengths (empty ones, every byte value), in rank
// order on every rank; a broadcast from every rank, of any length, the others' argument not read.
TEST(Accelerator, ObjectsAreGatheredAndBroadcastAcrossRanks) {
  Accelerator acc(quiet());
  const int N = acc.num_processes(), me = acc.process_index();
  auto items_of = [](int r) {
    std::vector<std::string> v;
    for (int i = 0; i <= r; ++i) v.emplace_back(static_cast<std::size_t>(r * 3 + i), static_cast<char>('a' + i));
    std::string bytes(256, '\0');
    for (int b = 0; b < 256; ++b) bytes[static_cast<std::size_t>(b)] = static_cast<char>(b);
    v.push_back(bytes + std::to_string(r));
    if (r % 2) v.emplace_back();
    return v;
  };
  std::vector<std::string> want;
  for (int r = 0; r < N; ++r)
    for (auto& s : items_of(r)) want.push_back(s);
  EXPECT_EQ(acc.gather_object(items_of(me)), want);
  EXPECT_EQ(acc.gather_object(me == 0 ? std::vector<std::string>{"only rank 0"} : std::vector<std::string>{}),
            std::vector<std::string>{"only rank 0"});
  for (int from = 0; from < N; ++from) {
    const std::string sent = std::string(static_cast<std::size_t>(1000 + from), 'x') + std::string(1, '\0');
    EXPECT_EQ(acc.broadcast_object(me == from ? sent : "not read", from), sent) << "from " << from;
  }
  EXPECT_EQ(acc.broadcast_object(me == 0 ? "" : "not read"), "");
  EXPECT_THROW(acc.broadcast_object("x", N), std::invalid_argument);
}

// The loss of the tests' models on a batch.
at::Tensor mlp_loss(MLPImpl& m, const Batch& b) { return at::mse_loss(m.forward(b.data), b.target); }

std::shared_ptr<MLPImpl> make_mlp(int seed = 1234) {
  at::manual_seed(seed);
  auto m = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
  m->to(at::kDouble);
  return m;
}

Rows make_rows(int64_t n) {
  at::manual_seed(77);
  return Rows(at::randn({n, 6}, at::kDouble), at::randn({n, 3}, at::kDouble));
}

// Accumulation: with N = 3 micro-steps and a loader of 7 batches, sync happens on micro-steps 3, 6
// and 7 (the loader's end), the optimizer steps only then, and the scheduler steps with it.
TEST(Accelerator, AccumulateSyncsOnEveryNthMicroStepAndAtTheLoadersEnd) {
  AcceleratorOptions o = quiet();
  o.gradient_accumulation_steps = 3;
  Accelerator acc(o);
  const int N = acc.num_processes();
  auto model = make_mlp();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  DataLoader<Rows> loader(make_rows(7 * 2 * N), {.batch_size = 2 * N, .split_batches = true});
  auto [opt, sched] = acc.prepare(model, sgd, loader, [](torch::optim::Optimizer& inner) {
    return std::make_shared<torch::optim::StepLR>(inner, 1, 0.5);
  });
  EXPECT_EQ(acc.gradient_accumulation_steps(), 3);
  std::vector<bool> syncs;
  std::vector<bool> changed;
  for (const Batch& b : loader) {
    auto scope = acc.accumulate(model);
    at::Tensor before = model->layers[0]->weight.detach().clone();
    acc.backward(mlp_loss(*model, b));
    opt->step();
    sched->step();
    opt->zero_grad();
    syncs.push_back(acc.sync_gradients());
    changed.push_back(!at::equal(before, model->layers[0]->weight.detach()));
  }
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, true, false, false, true, true}));
  EXPECT_EQ(changed, syncs) << "the optimizer must step exactly on sync micro-steps";
  // Three scheduler steps (one per optimizer step), as a StepLR stepped three times directly.
  auto probe = make_mlp();
  torch::optim::SGD probe_sgd(probe->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::StepLR probe_sched(probe_sgd, 1, 0.5);
  for (int i = 0; i < 3; ++i) probe_sched.step();
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].options().get_lr(), probe_sgd.param_groups()[0].options().get_lr());
  EXPECT_LT(opt->param_groups()[0].options().get_lr(), 0.1);
}

// One training loop, written once, under each strategy picked by a config file, against plain
// libtorch on one process with the same global batches (float64).
// sync_each_batch: AcceleratorOptions' (unset: the config's default, on under DeepSpeed ZeRO-2/3 only).
struct LoopCase {
  std::string name, yaml;
  std::optional<bool> sync_each_batch;
};

std::vector<LoopCase> loop_cases() {
  return {
      {"none", ""},
      {"ddp", "distributed_type: MULTI_CPU\nnum_processes: 2\ngradient_accumulation_steps: 2\n"},
      {"zero1", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 1\n  gradient_accumulation_steps: 2\n"},
      {"zero2", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 2\n"},
      {"zero3", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  gradient_accumulation_steps: 2\n"},
      {"full_shard",
       "distributed_type: FSDP\ngradient_accumulation_steps: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
       "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LinearImpl\n"},
      {"shard_grad_op",
       "distributed_type: FSDP\ngradient_accumulation_steps: 2\nfsdp_config:\n"
       "  fsdp_sharding_strategy: SHARD_GRAD_OP\n"},
      // Each micro-step reducing where the default does not, and the other way round.
      {"ddp_sync_each_batch", "distributed_type: MULTI_CPU\nnum_processes: 2\ngradient_accumulation_steps: 2\n", true},
      {"full_shard_sync_each_batch",
       "distributed_type: FSDP\ngradient_accumulation_steps: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n",
       true},
      {"zero3_no_sync",
       "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  gradient_accumulation_steps: 2\n", false},
      // DeepSpeed's MiCS in groups of one rank (a DeepSpeed JSON): every rank a copy of its own, the
      // copies averaging their gradients across the replicate group, at any world size.
      {"mics_groups_of_1",
       R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2,
           "zero_optimization": {"stage": 3, "mics_shard_size": 1}})"},
  };
}

// The prepared model's full weights (on the main process) are the single-process reference's.
void expect_weights_of(Accelerator& acc, torch::nn::Module& reference) {
  auto state = acc.get_state_dict();
  if (!acc.is_main_process()) {
    EXPECT_TRUE(state.empty());
    return;
  }
  std::map<std::string, at::Tensor> got(state.begin(), state.end());
  for (const auto& kv : reference.named_parameters()) {
    ASSERT_TRUE(got.count(kv.key())) << kv.key();
    EXPECT_TRUE(at::allclose(got[kv.key()], kv.value(), 1e-10, 1e-12)) << kv.key();
  }
  EXPECT_EQ(got.size(), reference.named_parameters().size());
}

TEST(Accelerator, TrainingLoopMatchesSingleProcessUnderEveryStrategy) {
  for (const LoopCase& c : loop_cases()) {
    SCOPED_TRACE(c.name);
    auto opts =
        quiet(c.yaml.empty() ? std::nullopt : std::optional<std::string>(write_config(c.name + ".yaml", c.yaml)));
    opts.sync_each_batch = c.sync_each_batch;
    Accelerator acc(opts);
    const bool deepspeed_sharded = c.name == "zero2" || c.name == "zero3" || c.name == "mics_groups_of_1";
    EXPECT_EQ(acc.sync_each_batch(), c.sync_each_batch.value_or(deepspeed_sharded));
    const int N = acc.num_processes();
    const int64_t accum = acc.gradient_accumulation_steps(), G = 6, batches = 8;
    // Every rank seeds differently: prepare() must start them all from rank 0's weights.
    auto model = make_mlp(1234 + acc.process_index());
    auto reference = make_mlp(1234);
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    torch::optim::AdamW ref_opt(reference->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    Rows rows = make_rows(G * batches);
    DataLoader<Rows> loader(rows, {.batch_size = G, .shuffle = true, .split_batches = true, .seed = 5});
    auto opt = acc.prepare(model, adamw, loader);
    ASSERT_EQ(G % N, 0);
    if (c.name == "mics_groups_of_1") {  // every rank a copy: a shard group of one, the copies across all
      EXPECT_EQ(acc.engine()->shard_group()->size(), 1);
      EXPECT_EQ(acc.engine()->replicate_group() ? acc.engine()->replicate_group()->size() : 1, N);
    }

    std::vector<double> norms, ref_norms;
    for (const Batch& b : loader) {
      auto scope = acc.accumulate(model);
      acc.backward(mlp_loss(*model, b));
      if (acc.sync_gradients()) norms.push_back(acc.clip_grad_norm_(0.5));
      opt->step();
      opt->zero_grad();
    }
    // The reference: the same global batches, loss averaged over the accumulation window.
    ShardPlan plan(G * batches, {.batch_size = G, .shuffle = true, .split_batches = true, .seed = 5}, 0, 1);
    auto global = plan.batches(0);
    for (std::size_t i = 0; i < global.size(); ++i) {
      at::Tensor idx = at::tensor(global[i], at::kLong);
      at::Tensor loss = at::mse_loss(reference->forward(rows.x.index_select(0, idx)), rows.y.index_select(0, idx));
      (loss / static_cast<double>(accum)).backward();
      if ((i + 1) % accum == 0 || i + 1 == global.size()) {
        ref_norms.push_back(torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.5));
        ref_opt.step();
        ref_opt.zero_grad();
      }
    }
    ASSERT_EQ(norms.size(), ref_norms.size());
    for (std::size_t i = 0; i < norms.size(); ++i) EXPECT_NEAR(norms[i], ref_norms[i], 1e-10 * ref_norms[i]);

    expect_weights_of(acc, *reference);
    acc.end_training();
  }
}

// A DeepSpeed config's optimizer and scheduler blocks, built by create_optimizer / create_scheduler
// with "auto" from the program, train as the same optimizer and schedule written out by hand on one
// process (ZeRO-2 at 2 and 3 ranks).
TEST(Accelerator, ConfigOptimizerAndScheduleTrainAsWrittenOutByHand) {
  const std::string json = write_config("optim_blocks.json", R"({"train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2},
    "optimizer": {"type": "Adam", "params": {"lr": "auto", "betas": [0.9, 0.95], "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": "auto", "total_num_steps": "auto", "warmup_type": "linear"}}})");
  Accelerator acc(quiet(json));
  const int64_t G = 6, steps = 8;
  auto model = make_mlp(1234);
  auto reference = make_mlp(1234);
  auto adam = acc.create_optimizer(model->parameters(), {.lr = 0.01, .weight_decay = 0.1});
  ASSERT_NE(dynamic_cast<torch::optim::AdamW*>(adam.get()), nullptr);  // DeepSpeed's "Adam": adam_w_mode
  Rows rows = make_rows(G * steps);
  DataLoader<Rows> loader(rows, {.batch_size = G, .shuffle = true, .split_batches = true, .seed = 5});
  auto opt = acc.prepare(model, *adam, loader);
  auto sched = acc.create_scheduler({.total_num_steps = steps, .warmup_num_steps = 2});
  // By hand: the k-th step runs at DeepSpeed's iteration k - 2 (-1 at construction): warmup_min_lr 0,
  // a linear warmup over 2 steps to the optimizer's 0.01, then down by (8 - i) / (8 - 2).
  const std::vector<double> lrs = {0, 0, 0.005, 0.01, 0.01 * 5 / 6, 0.01 * 4 / 6, 0.01 * 3 / 6, 0.01 * 2 / 6};
  std::vector<double> seen;
  for (const Batch& b : loader) {
    seen.push_back(opt->param_groups()[0].options().get_lr());
    acc.backward(mlp_loss(*model, b));
    opt->step();
    sched->step();
    opt->zero_grad();
  }
  ASSERT_EQ(seen.size(), lrs.size());
  for (std::size_t k = 0; k < lrs.size(); ++k) EXPECT_NEAR(seen[k], lrs[k], 1e-17) << "step " << k + 1;

  torch::optim::AdamW ref_opt(reference->parameters(),
                              torch::optim::AdamWOptions(0.01).betas(std::make_tuple(0.9, 0.95)).weight_decay(0.1));
  ShardPlan plan(G * steps, {.batch_size = G, .shuffle = true, .split_batches = true, .seed = 5}, 0, 1);
  auto global = plan.batches(0);
  ASSERT_EQ(global.size(), lrs.size());
  for (std::size_t i = 0; i < global.size(); ++i) {
    ref_opt.param_groups()[0].options().set_lr(lrs[i]);
    at::Tensor idx = at::tensor(global[i], at::kLong);
    at::mse_loss(reference->forward(rows.x.index_select(0, idx)), rows.y.index_select(0, idx)).backward();
    ref_opt.step();
    ref_opt.zero_grad();
  }
  expect_weights_of(acc, *reference);
  acc.end_training();
}

TEST(Accelerator, ClipGradValue) {
  {
    Accelerator acc(quiet(write_config("clip_ddp.yaml", "distributed_type: MULTI_CPU\n")));
    const int N = acc.num_processes();
    auto model = make_mlp();
    auto reference = make_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ref_sgd(reference->parameters(), torch::optim::SGDOptions(0.1));
    Rows rows = make_rows(4 * N);
    DataLoader<Rows> loader(rows, {.batch_size = 4 * N, .split_batches = true});
    auto opt = acc.prepare(model, sgd, loader);
    for (const Batch& b : loader) {
      acc.backward(mlp_loss(*model, b));
      acc.clip_grad_value_(0.01);
      opt->step();
    }
    at::mse_loss(reference->forward(rows.x), rows.y).backward();
    for (auto& p : reference->parameters()) p.grad().clamp_(-0.01, 0.01);
    ref_sgd.step();
    auto state = acc.get_state_dict();
    if (acc.is_main_process())
      for (const auto& [name, t] : state)
        EXPECT_TRUE(at::allclose(t, reference->named_parameters()[name], 1e-10, 1e-12)) << name;
  }
  {
    Accelerator acc(quiet(write_config("clip_fsdp.yaml", "distributed_type: FSDP\n")));
    auto model = make_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    auto opt = acc.prepare(model, sgd);
    try {
      acc.clip_grad_value_(1.0);
      ADD_FAILURE() << "clip_grad_value_ under FSDP did not throw";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("clip_grad_norm_"), std::string::npos) << e.what();
    }
  }
}

TEST(Accelerator, RefusesWhatItCannotDo) {
  auto expect_error = [](const AcceleratorOptions& o, const std::string& needle) {
    try {
      Accelerator acc(o);
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(quiet(write_config("gpu.yaml", "distributed_type: MULTI_GPU\n")), "MULTI_GPU needs CUDA");

  Accelerator acc(quiet());
  auto model = make_mlp();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  acc.prepare(model, sgd);
  auto other = make_mlp();
  torch::optim::SGD sgd2(other->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(acc.prepare(other, sgd2), std::logic_error);
}

// One SGD step of a fresh MLP prepared by `acc`: whether its loss was finite.
bool one_step_is_finite(Accelerator& acc) {
  auto model = make_mlp(7);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto opt = acc.prepare(model, sgd);
  Rows rows = make_rows(6);
  at::Tensor loss = at::mse_loss(model->forward(rows.x), rows.y);
  acc.backward(loss);
  opt->step();
  return std::isfinite(loss.item<double>());
}

// Shard groups from the config (DeepSpeed's MiCS, Accelerate's parallelism_config) are checked against
// the job when the Accelerator is made, naming the key: groups of 2 at 2 ranks train as one copy over
// both; at 1 or 3 ranks they do not divide the world. A parallelism_config of 2 copies of 1 rank fits only
// a job of 2, where the engine's groups are the copies.
TEST(Accelerator, ShardGroupsFromTheConfigAreCheckedAgainstTheJob) {
  const int N = world()->size();
  const auto mics = quiet(write_config("mics2.json", R"({"train_micro_batch_size_per_gpu": 3,
    "zero_optimization": {"stage": 3, "mics_shard_size": 2}})"));
  const auto hsdp = quiet(write_config("hsdp_2x1.yaml",
                                       "distributed_type: FSDP\nparallelism_config:\n  dp_replicate_size: 2\n"
                                       "  dp_shard_size: 1\n"));
  if (N % 2 == 0) {
    Accelerator acc(mics);
    EXPECT_TRUE(one_step_is_finite(acc));
    EXPECT_EQ(acc.engine()->shard_group()->size(), 2);
    EXPECT_EQ(static_cast<bool>(acc.engine()->replicate_group()), N > 2);
  } else {
    try {
      Accelerator acc(mics);
      ADD_FAILURE() << "MiCS groups of 2 at " << N << " ranks: no error";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("mics2.json: zero_optimization.mics_shard_size: shard groups of 2 ranks do not divide the " +
                          std::to_string(N) + " ranks of the job"),
                std::string::npos)
          << what;
    }
  }
  if (N == 2) {
    Accelerator two(hsdp);
    EXPECT_TRUE(one_step_is_finite(two));
    EXPECT_EQ(two.engine()->shard_group()->size(), 1);
    ASSERT_TRUE(two.engine()->replicate_group());
    EXPECT_EQ(two.engine()->replicate_group()->size(), 2);
    return;
  }
  try {
    Accelerator acc(hsdp);
    ADD_FAILURE() << "2 copies at " << N << " ranks: no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hsdp_2x1.yaml: parallelism_config's dp_replicate_size x dp_shard_size (2 x 1) is 2 "
                        "processes, but the job has " +
                        std::to_string(N)),
              std::string::npos)
        << what;
  }
}

// HYBRID_SHARD mirrors each node's shards on the other nodes, so nodes of different sizes are refused
// on every rank with a message naming them (ctest accelerator_uneven_nodes: 3 ranks as nodes of 2 and
// 1, where every other strategy trains in TrainingLoopMatchesSingleProcessUnderEveryStrategy); on
// nodes of one size it trains.
TEST(Accelerator, HybridShardRefusesNodesOfDifferentSizes) {
  const std::vector<int> sizes = simulated_node_sizes(world()->size());
  const bool uneven = !nodes_of_one_size(sizes);
  const std::string yaml =
      "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LinearImpl\n";
  const auto opts = quiet(write_config("hybrid.yaml", yaml));
  if (uneven) {
    try {
      Accelerator acc(opts);
      ADD_FAILURE() << "HYBRID_SHARD on nodes of " << std::getenv("ACCEL_RANKS_PER_NODE") << " ranks: no error";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("HYBRID_SHARD needs the same number of ranks on every node"), std::string::npos) << what;
      std::string listed;
      for (int k : sizes) listed += (listed.empty() ? "" : ", ") + std::to_string(k);
      EXPECT_NE(what.find("the " + std::to_string(sizes.size()) + " nodes hold " + listed + " rank(s)"),
                std::string::npos)
          << what;
    }
    // A program that builds an engine itself meets the same refusal where the groups are made.
    EXPECT_THROW(zero::groups_for(zero::ShardingSpec::fsdp("HYBRID_SHARD"), world()), InvalidArgumentError);
    // HYBRID_SHARD_ZERO2 (ZeRO-2 inside each node) the same, with ZeRO-2's way out.
    try {
      Accelerator acc(
          quiet(write_config("hybrid_zero2.yaml",
                             "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n")));
      ADD_FAILURE() << "HYBRID_SHARD_ZERO2 on uneven nodes: no error";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("HYBRID_SHARD_ZERO2 needs the same number of ranks on every node"), std::string::npos)
          << what;
      EXPECT_NE(what.find("or use SHARD_GRAD_OP, which shards over all ranks"), std::string::npos) << what;
    }
    world()->barrier();  // every rank threw (one that did not would wait here alone)
    return;
  }
  Accelerator acc(opts);
  EXPECT_TRUE(one_step_is_finite(acc));
}

// fsdp_activation_checkpointing: true reaches every unit of the prepared model, and training through
// the Accelerator then gives the losses of the same run without it (the MLP has no dropout: equal).
TEST(Accelerator, ActivationCheckpointingFromTheConfigReachesEveryUnit) {
  std::vector<at::Tensor> losses[2];
  for (int ck = 0; ck < 2; ++ck) {
    Accelerator acc(quiet(write_config(
        "ac.yaml", fmt::format("distributed_type: FSDP\nfsdp_config:\n  fsdp_activation_checkpointing: {}\n",
                               ck ? "true" : "false"))));
    auto model = make_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    auto opt = acc.prepare(model, sgd);
    for (auto& l : model->layers) EXPECT_EQ(l.checkpointed(), ck == 1);
    at::manual_seed(5 + acc.process_index());
    for (int step = 0; step < 3; ++step) {
      at::Tensor x = at::randn({4, 6}, at::kDouble), y = at::randn({4, 3}, at::kDouble);
      at::Tensor loss = at::mse_loss(model->forward(x), y);
      losses[ck].push_back(loss.detach());
      acc.backward(loss);
      opt->step();
      opt->zero_grad();
    }
  }
  for (std::size_t i = 0; i < losses[0].size(); ++i) EXPECT_TRUE(at::equal(losses[0][i], losses[1][i])) << i;
}

// Offloaded state round-trips through checkpoints: a checkpoint saved with the optimizer state and
// the parameters on disk (ZeRO-3, DeepSpeed YAML, nvme) loads without offload, and one saved without
// loads with it; the step after either load is bitwise the step the saving run took next.
TEST(Accelerator, CheckpointsRoundTripBetweenOffloadedAndNot) {
  auto w = world();
  const int N = w->size(), r = w->rank();
  const std::string root = scratch_dir("offload_checkpoints");
  const std::string nvme = root + "/nvme";
  if (r == 0) fs::create_directories(nvme);
  w->barrier();
  const std::string plain = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n";
  const std::string offloaded = plain + "  offload_optimizer_device: nvme\n  offload_optimizer_nvme_path: " + nvme +
                                "\n  offload_param_device: nvme\n  offload_param_nvme_path: " + nvme + "\n";
  auto float_mlp = [] {
    at::manual_seed(99);
    return std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
  };
  // One optimizer step on this rank's rows of batch `k`.
  auto step = [&](Accelerator& acc, MLPImpl& m, AcceleratedOptimizer& opt, int k) {
    at::manual_seed(500 + k);
    at::Tensor x = at::randn({4 * N, 6}).narrow(0, 4 * r, 4), y = at::randn({4 * N, 3}).narrow(0, 4 * r, 4);
    acc.backward(at::mse_loss(m.forward(x), y));
    opt.step();
    opt.zero_grad();
  };
  auto weights = [](Accelerator& acc) {
    std::map<std::string, at::Tensor> out;
    for (auto& [n, t] : acc.get_state_dict()) out[n] = t.clone();
    return out;
  };
  for (bool save_offloaded : {true, false}) {
    SCOPED_TRACE(save_offloaded ? "saved offloaded, loaded in memory" : "saved in memory, loaded offloaded");
    std::map<std::string, at::Tensor> want;
    std::string dir;
    {
      Accelerator acc(quiet(write_config("ckpt_a.yaml", save_offloaded ? offloaded : plain)));
      auto m = float_mlp();
      torch::optim::AdamW adamw(m->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
      DataLoader<Rows> loader(make_rows(4 * N), {.batch_size = 4 * N, .split_batches = true});  // the batch size
      auto opt = acc.prepare(m, adamw, loader);
      step(acc, *m, *opt, 0);
      step(acc, *m, *opt, 1);
      dir = acc.save_state(root + (save_offloaded ? "/from_offloaded" : "/from_memory"));
      step(acc, *m, *opt, 2);
      want = weights(acc);
      acc.end_training();
    }
    Accelerator acc(quiet(write_config("ckpt_b.yaml", save_offloaded ? plain : offloaded)));
    auto m = float_mlp();
    torch::optim::AdamW adamw(m->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    DataLoader<Rows> loader(make_rows(4 * N), {.batch_size = 4 * N, .split_batches = true});
    auto opt = acc.prepare(m, adamw, loader);
    acc.load_state(dir);
    step(acc, *m, *opt, 2);
    const auto got = weights(acc);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) EXPECT_TRUE(at::equal(t, got.at(name))) << name;
    acc.end_training();
  }
}

// fsdp_state_dict_type decides what save_state() writes when its `full` argument is not given:
// FULL_STATE_DICT has rank 0 write every tensor whole, SHARDED_STATE_DICT (and LOCAL_STATE_DICT, and
// no key) each rank its own slices. Told apart by the ranks whose shard file holds data.
TEST(Accelerator, FsdpStateDictTypeDecidesWhatSaveStateWrites) {
  auto w = world();
  const int N = w->size();
  auto ranks_with_data = [&](const std::string& dir) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("shard_", 0) == 0 && fs::file_size(e.path()) > 0) ++n;
    return n;
  };
  const std::string root = scratch_dir("state_dict_type");
  struct Case {
    const char* type;         // fsdp_state_dict_type, "" for none
    std::optional<bool> arg;  // save_state's `full`
    bool full;                // what must be written
  };
  const Case cases[] = {{"FULL_STATE_DICT", std::nullopt, true},   {"SHARDED_STATE_DICT", std::nullopt, false},
                        {"LOCAL_STATE_DICT", std::nullopt, false}, {"", std::nullopt, false},
                        {"FULL_STATE_DICT", false, false},         {"SHARDED_STATE_DICT", true, true}};
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.type) + (c.arg ? (*c.arg ? " full=true" : " full=false") : ""));
    std::string yaml = "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n";
    if (*c.type) yaml += std::string("  fsdp_state_dict_type: ") + c.type + "\n";
    Accelerator acc(quiet(write_config("sdt_" + std::to_string(i) + ".yaml", yaml)));
    EXPECT_EQ(acc.config().state_dict_type,
              std::string(c.type) == "FULL_STATE_DICT" ? StateDictType::Full : StateDictType::Sharded);
    auto model = make_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    acc.prepare(model, sgd);
    const std::string dir = acc.save_state(root + "/ckpt_" + std::to_string(i++), c.arg);
    if (acc.is_main_process()) EXPECT_EQ(ranks_with_data(dir), c.full ? 1 : N);
    acc.load_state(dir);  // reads either kind
    acc.end_training();
  }
}

// Under ZeRO-3 / FULL_SHARD a unit's parameters have no storage between steps. Reading them through
// unwrap_model(model)->named_parameters() (the Accelerate habit of saving unwrap_model(model)'s
// weights) throws an error naming get_state_dict / save_model instead of reading freed memory; the
// root unit's parameter stays readable; get_state_dict, save_model and further training (forward with
// prefetch, backward, step) are unaffected by the failed reads.
TEST(Accelerator, ShardedParametersAtRestNameGetStateDictAndSaveModel) {
  // Private shards, all-gathered around each use: what this test counts (node-shared parameters,
  // the default on one node, gather nothing).
  test::ScopedEnv private_shards("ACCEL_NODE_SHARED_PARAMS", "0");
  auto w = world();
  const std::vector<std::pair<std::string, std::string>> configs = {
      {"rest_full_shard.yaml",
       "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_forward_prefetch: true\n"},
      {"rest_zero3.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})"},
  };
  const std::vector<std::pair<const char*, std::function<void(const at::Tensor&)>>> reads = {
      {"sum", [](const at::Tensor& p) { (void)p.sum(); }},
      {"clone", [](const at::Tensor& p) { (void)p.detach().clone(); }},
      {"data_ptr", [](const at::Tensor& p) { (void)p.data_ptr(); }},
      {"torch::save",
       [](const at::Tensor& p) {
         std::ostringstream out;
         torch::save(p, out);
       }},
  };
  for (const auto& [name, yaml] : configs) {
    SCOPED_TRACE(name);
    Accelerator acc(quiet(write_config(name, yaml)));
    const int N = acc.num_processes();
    auto model = make_mlp();
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(0.01));
    auto opt = acc.prepare(model, adamw);
    Rows rows = make_rows(4 * N);
    auto train_step = [&](int i) {
      at::Tensor idx = at::arange(2 * i + acc.process_index() * 4, 2 * i + acc.process_index() * 4 + 2, at::kLong);
      acc.backward(at::mse_loss(model->forward(rows.x.index_select(0, idx)), rows.y.index_select(0, idx)));
      opt->step();
      opt->zero_grad();
    };
    train_step(0);
    const bool sharded = acc.engine()->plan().params_sharded;
    EXPECT_EQ(sharded, N > 1);
    int freed = 0;
    for (const auto& kv : acc.unwrap_model(model)->named_parameters()) {
      const bool at_rest = sharded && kv.key() != "scale";  // "scale" is the root unit's: always gathered
      freed += at_rest;
      for (const auto& [what, read] : reads) {
        SCOPED_TRACE(kv.key() + " " + what);
        const std::string m = message_of<c10::Error>([&, &read = read] { read(kv.value()); });
        if (!at_rest) {
          EXPECT_EQ(m, "");
          continue;
        }
        EXPECT_NE(m.find("has no storage between steps"), std::string::npos) << m;
        EXPECT_NE(m.find("accelerator.get_state_dict()"), std::string::npos) << m;
        EXPECT_NE(m.find("accelerator.save_model(model, dir)"), std::string::npos) << m;
      }
    }
    EXPECT_EQ(freed, sharded ? 6 : 0);  // fc0..fc2, weight and bias

    auto state = acc.get_state_dict();
    const std::string dir = scratch_dir("at_rest_" + name);
    acc.save_model(model, dir);
    if (acc.is_main_process()) {
      std::map<std::string, at::Tensor> got(state.begin(), state.end());
      ASSERT_EQ(got.size(), 7u);
      int tensors = 0;
      for (const auto& f : checkpoint::resolve_model_files(dir).files) {
        auto file = checkpoint::SafetensorsFile::open(f);
        for (const auto& n : file.names()) {
          ASSERT_TRUE(got.count(n)) << n;
          EXPECT_TRUE(at::equal(file.read(n), got[n])) << n;
          ++tensors;
        }
      }
      EXPECT_EQ(tensors, 7);
    }
    // The next step gathers the units again (the error is lifted) and moves every weight.
    train_step(1);
    auto after = acc.get_state_dict();
    if (acc.is_main_process()) {
      std::map<std::string, at::Tensor> before(state.begin(), state.end());
      for (const auto& [n, t] : after) {
        EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << n;
        EXPECT_FALSE(at::equal(t, before.at(n))) << n;
      }
    }
    acc.end_training();
  }
}

// DeepSpeed's gather_16bit_weights_on_model_save (zero3_save_16bit_model in the YAML) under bf16:
// save_model writes the bf16 compute weights; without it, the fp32 masters.
TEST(Accelerator, Save16BitModelWritesTheComputeDtype) {
  auto w = world();
  const std::string root = scratch_dir("save_16bit");
  for (bool sixteen : {false, true}) {
    SCOPED_TRACE(sixteen ? "gather_16bit_weights_on_model_save: true" : "gather_16bit_weights_on_model_save: false");
    const std::string json = fmt::format(R"({{"train_micro_batch_size_per_gpu": 4, "bf16": {{"enabled": true}},
        "zero_optimization": {{"stage": 3, "gather_16bit_weights_on_model_save": {}}}}})",
                                         sixteen);
    Accelerator acc(quiet(write_config(sixteen ? "save16_on.json" : "save16_off.json", json)));
    ASSERT_EQ(acc.config().zero3_save_16bit_model, sixteen);
    auto model = make_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    acc.prepare(model, sgd);
    const std::string dir = root + (sixteen ? "/on" : "/off");
    acc.save_model(model, dir);
    if (acc.is_main_process()) {
      int tensors = 0;
      for (const auto& f : checkpoint::resolve_model_files(dir).files) {
        auto file = checkpoint::SafetensorsFile::open(f);
        for (const auto& n : file.names()) {
          EXPECT_EQ(file.dtype(n), sixteen ? at::kBFloat16 : at::kFloat) << n;
          ++tensors;
        }
      }
      EXPECT_GT(tensors, 0);
    }
    acc.end_training();
  }
}

}  // namespace
}  // namespace accel::test
