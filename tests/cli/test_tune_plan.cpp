// accel tune's rules (cli/tune_plan.h): the grid and its pruning (against `accel estimate-memory`'s own
// table), the staged search against an exhaustive one on a synthetic machine, and the configs it writes
// (read back by accel's config readers).
#include "accelerator/config.h"
#include "base/files.h"
#include "cli/estimate_memory.h"
#include "cli/tune_plan.h"
#include "support/errors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

using accel::test::message_of;

namespace accel::cli {
namespace {

TuneRequest tune_request(double params, int ranks, std::int64_t global_batch) {
  TuneRequest r;
  r.params = params;
  r.num_processes = ranks;
  r.global_batch = global_batch;
  return r;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / ("accel_tune_plan_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(TunePlan, PruningByMemoryIsEstimateMemorysVerdict) {
  // For every precision, rank count and budget: a candidate is pruned for memory exactly when
  // estimate-memory's row for its strategy (and offload) says it does not fit, at the candidate's
  // accumulation (64 / ranks micro-steps of 1) as its DeepSpeed config runs them: ZeRO-2/3 reducing each
  // (--sync_each_batch), DDP and ZeRO-1 not (TunePlan.WinnersKeepTheMicroStepsTheirCandidatesRan).
  for (const char* precision : {"no", "bf16"})
    for (int ranks : {1, 2, 4})
      for (double budget_gb : {2.0, 6.0, 20.0}) {
        TuneRequest r = tune_request(0.75e9, ranks, 64);
        r.precision = precision;
        r.device_cuda = true;  // (offload candidates exist)
        r.budget_bytes = budget_gb * 1e9;
        r.micro_batches = {1};
        r.checkpointing = {false};
        const TuneGrid g = plan_tune(r);
        for (const char* off : {"none", "optimizer", "optimizer+params"}) {
          EstimateRequest e;
          e.params = r.params;
          e.num_processes = ranks;
          e.dtype = std::string(precision) == "bf16" ? Dtype::Bf16 : Dtype::Fp32;
          e.optimizer = OptimizerKind::AdamW;
          e.offload = parse_offload(off);
          e.device_budget = *r.budget_bytes;
          e.accumulation.steps = 64 / ranks;
          const Estimate not_reducing = estimate_memory(e);
          e.accumulation.sync_each_batch = true;
          const Estimate reducing = estimate_memory(e);
          for (std::size_t i = 0; i < reducing.rows.size(); ++i) {
            const bool zero23 = reducing.rows[i].strategy == zero::Strategy::Zero2 ||
                                reducing.rows[i].strategy == zero::Strategy::Zero3;
            const StrategyRow& row = zero23 ? reducing.rows[i] : not_reducing.rows[i];
            const std::string s = row.strategy == zero::Strategy::NoShard ? "DDP"
                                  : row.strategy == zero::Strategy::Zero1 ? "ZERO_1"
                                  : row.strategy == zero::Strategy::Zero2 ? "ZERO_2"
                                                                          : "ZERO_3";
            if (std::string(off) == "optimizer+params" && s != "ZERO_3") continue;  // (pruned for another reason)
            if (s == "DDP" && std::string(off) != "none") continue;  // (DDP offloads nothing: estimate-memory's note)
            bool runnable = false, memory_pruned = false;
            for (const auto& c : g.runnable) runnable = runnable || (c.strategy == s && c.offload == off);
            for (const auto& p : g.pruned)
              memory_pruned = memory_pruned || (p.candidate.strategy == s && p.candidate.offload == off &&
                                                p.why.find("estimate-memory") != std::string::npos);
            SCOPED_TRACE(::testing::Message()
                         << precision << " " << ranks << " ranks, " << budget_gb << " GB, " << s << " offload " << off);
            ASSERT_TRUE(row.fits.has_value());
            EXPECT_EQ(runnable, *row.fits);
            EXPECT_EQ(memory_pruned, !*row.fits);
          }
        }
      }
}

TEST(TunePlan, TheGridKeepsTheGlobalBatchAndPrunesWhatCannotRunWithWhy) {
  TuneRequest r = tune_request(1e6, 2, 12);
  r.micro_batches = {1, 2, 4, 6};
  r.checkpointing = {false};
  r.offloads = {"none", "optimizer"};
  const TuneGrid g = plan_tune(r);
  for (const auto& c : g.runnable) {
    EXPECT_EQ(c.micro_batch * 2 * c.accumulation, 12) << c.label();
    EXPECT_EQ(c.offload, "none") << "offload on a CPU run";
  }
  auto why = [&](const std::string& s, int mb, const std::string& off) {
    for (const auto& p : g.pruned)
      if (p.candidate.strategy == s && p.candidate.micro_batch == mb && p.candidate.offload == off) return p.why;
    return std::string();
  };
  EXPECT_EQ(why("ZERO_3", 4, "none"), "micro batch 4 x 2 ranks does not divide the global batch 12");
  EXPECT_EQ(why("ZERO_2", 2, "optimizer"),
            "offload on a CPU run changes nothing (the state is in host memory already)");
  EXPECT_EQ(g.runnable.size(), 4u * 3u);  // DDP, ZeRO-1/2/3 x micro batches 1, 2, 6
  // HYBRID_SHARD only across machines; parameter offload only with ZeRO-3.
  TuneRequest h = tune_request(1e6, 4, 8);
  h.strategies = {"hybrid_shard", "full_shard", "shard_grad_op"};
  h.device_cuda = true;
  h.micro_batches = {1};
  h.checkpointing = {false};
  const TuneGrid hg = plan_tune(h);
  for (const auto& c : hg.runnable) EXPECT_NE(c.strategy, "HYBRID_SHARD");
  bool param_offload_zero2 = false;
  for (const auto& p : hg.pruned)
    param_offload_zero2 =
        param_offload_zero2 || (p.candidate.strategy == "ZERO_2" && p.candidate.offload == "optimizer+params" &&
                                p.why == "parameter offload needs ZeRO-3");
  EXPECT_TRUE(param_offload_zero2);
  h.num_machines = 2;
  const TuneGrid hg2 = plan_tune(h);
  bool hybrid = false;
  for (const auto& c : hg2.runnable) {
    hybrid = hybrid || c.strategy == "HYBRID_SHARD";
    // (FSDP's YAML offloads the optimizer only with the parameters: fsdp_offload_params)
    EXPECT_FALSE(c.strategy == "HYBRID_SHARD" && c.offload == "optimizer");
  }
  EXPECT_TRUE(hybrid);
  bool hybrid_optimizer_pruned = false;
  for (const auto& p : hg2.pruned)
    hybrid_optimizer_pruned =
        hybrid_optimizer_pruned || (p.candidate.strategy == "HYBRID_SHARD" && p.candidate.offload == "optimizer" &&
                                    p.why.find("fsdp_offload_params") != std::string::npos);
  EXPECT_TRUE(hybrid_optimizer_pruned);
}

TEST(TunePlan, DefaultsAndBadRequestsNameTheFlag) {
  const TuneRequest d = with_defaults(tune_request(1e6, 2, 16));
  EXPECT_EQ(d.strategies, (std::vector<std::string>{"DDP", "ZERO_1", "ZERO_2", "ZERO_3"}));
  EXPECT_EQ(d.micro_batches, (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(d.bucket_mib, (std::vector<double>{25}));
  EXPECT_EQ(d.offloads, (std::vector<std::string>{"none"}));
  EXPECT_EQ(with_defaults([] {
              TuneRequest r = tune_request(1e6, 2, 16);
              r.device_cuda = true;
              return r;
            }())
                .offloads,
            (std::vector<std::string>{"none", "optimizer", "optimizer+params"}));
  auto err = [](std::function<void(TuneRequest&)> edit) {
    TuneRequest r = tune_request(1e6, 2, 16);
    edit(r);
    return message_of<TuneError>([&] { with_defaults(r); });
  };
  EXPECT_EQ(err([](TuneRequest& r) { r.precision = "fp8"; }),
            "mixed_precision 'fp8': accel tune tunes fp32 (no), fp16 and bf16 runs");
  EXPECT_EQ(err([](TuneRequest& r) { r.global_batch = 1; }),
            "--global_batch 1 is smaller than the 2 ranks (one sample per rank at least)");
  EXPECT_EQ(err([](TuneRequest& r) { r.offloads = {"disk"}; }),
            "--offload: 'disk' is not one of none, optimizer, optimizer+params");
  EXPECT_EQ(err([](TuneRequest& r) { r.num_machines = 3; }), "--num_machines 3 must divide --num_processes 2");
  EXPECT_EQ(err([](TuneRequest& r) { r.micro_batches = {0}; }), "--micro_batches: 0 is not a batch size (>= 1)");
  EXPECT_NE(err([](TuneRequest& r) { r.strategies = {"zero4"}; }).find("zero4"), std::string::npos);
}

// A synthetic machine: throughput rises with the micro batch and falls with sharding and
// checkpointing, the bucket matters a little, and micro batches past a strategy's limit run out of
// memory. The staged search finds the exhaustive optimum (within 5%) in at most a third of its runs, and
// never runs a micro batch above one that did not fit.
TEST(TunePlan, TheStagedSearchFindsTheExhaustiveBestInAThirdOfTheRuns) {
  TuneRequest r = tune_request(1e8, 2, 64);
  r.bucket_mib = {5, 25, 100};
  const TuneGrid grid = plan_tune(r);
  auto limit = [](const TuneCandidate& c) {  // largest micro batch that fits
    const int base = c.strategy == "DDP" ? 4 : c.strategy == "ZERO_1" ? 8 : c.strategy == "ZERO_2" ? 8 : 16;
    return c.checkpointing ? base * 4 : base;
  };
  auto measure = [&](const TuneCandidate& c) {
    TuneResult t;
    t.candidate = c;
    if (c.micro_batch > limit(c)) {
      t.status = TuneResult::Status::OutOfMemory;
      return t;
    }
    t.status = TuneResult::Status::Ok;
    const double sharding = c.strategy == "DDP"      ? 1.0
                            : c.strategy == "ZERO_1" ? 0.97
                            : c.strategy == "ZERO_2" ? 0.95
                                                     : 0.85;
    const double bucket = c.bucket_mib == 25 ? 1.0 : c.bucket_mib == 100 ? 1.03 : 0.96;
    t.samples_per_s = 100 * sharding * bucket * (c.checkpointing ? 0.75 : 1.0) * (1 - 0.5 / c.micro_batch);
    return t;
  };
  double best_all = 0;
  int exhaustive_runs = 0;
  for (const auto& c : grid.runnable) {
    const TuneResult t = measure(c);
    ++exhaustive_runs;
    if (t.status == TuneResult::Status::Ok) best_all = std::max(best_all, t.samples_per_s);
  }
  TuneSearch search(grid);
  std::vector<TuneResult> done;
  while (auto c = search.next(done)) {
    for (const auto& d : done) {
      ASSERT_FALSE(d.candidate == *c) << "ran twice: " << c->label();
      if (d.status == TuneResult::Status::OutOfMemory && d.candidate.strategy == c->strategy &&
          d.candidate.checkpointing == c->checkpointing && d.candidate.bucket_mib == c->bucket_mib)
        ASSERT_LT(c->micro_batch, d.candidate.micro_batch) << c->label() << " after " << d.candidate.label();
    }
    done.push_back(measure(*c));
    ASSERT_LE(done.size(), grid.runnable.size());
  }
  const auto order = ranked(done);
  ASSERT_EQ(order.front().status, TuneResult::Status::Ok);
  EXPECT_GE(order.front().samples_per_s, 0.95 * best_all) << order.front().candidate.label();
  EXPECT_LE(3 * done.size(), static_cast<std::size_t>(exhaustive_runs))
      << done.size() << " staged runs against " << exhaustive_runs;
}

// Re-measuring: a candidate run twice is one row with the mean of its runs; the fastest few within 10%
// of the best are re-measured (never one alone, never one further off), and a candidate whose second run
// ran out of memory does not fit.
TEST(TunePlan, TheFastestAreMeasuredAgainAndRankedByTheirMean) {
  auto run = [](const std::string& strategy, double samples_per_s, double peak,
                TuneResult::Status status = TuneResult::Status::Ok) {
    TuneResult t;
    t.candidate.strategy = strategy;
    t.status = status;
    t.samples_per_s = samples_per_s;
    t.step_ms = samples_per_s > 0 ? 1000 * 16 / samples_per_s : 0;
    t.peak_bytes = peak;
    t.wall_s = 10;
    return t;
  };
  std::vector<TuneResult> runs = {run("DDP", 30.0, 5e9), run("ZERO_1", 32.0, 4e9), run("ZERO_2", 29.5, 3e9),
                                  run("ZERO_3", 28.0, 2e9), run("DDP", 0, 0, TuneResult::Status::OutOfMemory)};
  runs.back().candidate.micro_batch = 8;
  // Within 10% of 32: ZERO_1 (32), DDP (30), ZERO_2 (29.5); ZERO_3 (28 < 28.8) is not, nor the run
  // that did not fit.
  const std::vector<TuneCandidate> again = confirm_candidates(runs, 3);
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(again[0].strategy, "ZERO_1");
  EXPECT_EQ(again[1].strategy, "DDP");
  EXPECT_EQ(again[2].strategy, "ZERO_2");
  EXPECT_EQ(confirm_candidates(runs, 2).size(), 2u);
  EXPECT_TRUE(confirm_candidates({run("DDP", 30.0, 1), run("ZERO_3", 20.0, 1)}, 3).empty());  // nothing close
  EXPECT_TRUE(confirm_candidates(runs, 0).empty());

  // Second runs: ZERO_1 was lucky (27.0 now: mean 29.5), DDP steady (31.0: mean 30.5), ZERO_2's second
  // run out of memory.
  runs.push_back(run("ZERO_1", 27.0, 4.5e9));
  runs.push_back(run("DDP", 31.0, 5e9));
  runs.push_back(run("ZERO_2", 0, 3.2e9, TuneResult::Status::OutOfMemory));
  const std::vector<TuneResult> m = merged(runs);
  ASSERT_EQ(m.size(), 5u);  // DDP, ZERO_1, ZERO_2, ZERO_3, DDP mb 8: in the order each first ran
  EXPECT_EQ(m[0].runs, 2);
  EXPECT_DOUBLE_EQ(m[0].samples_per_s, 30.5);
  EXPECT_DOUBLE_EQ(m[0].step_ms, (1000 * 16 / 30.0 + 1000 * 16 / 31.0) / 2);
  EXPECT_DOUBLE_EQ(m[1].samples_per_s, 29.5);
  EXPECT_DOUBLE_EQ(m[1].peak_bytes, 4.5e9);  // the larger peak
  EXPECT_DOUBLE_EQ(m[1].wall_s, 20);
  EXPECT_EQ(m[2].status, TuneResult::Status::OutOfMemory);
  EXPECT_EQ(m[2].runs, 2);
  EXPECT_EQ(m[3].runs, 1);
  const std::vector<TuneResult> order = ranked(m);
  EXPECT_EQ(order[0].candidate.strategy, "DDP");  // by the mean: 30.5 > 29.5 > 28
  EXPECT_EQ(order[1].candidate.strategy, "ZERO_1");
  EXPECT_EQ(order[2].candidate.strategy, "ZERO_3");
  EXPECT_NE(order[3].status, TuneResult::Status::Ok);
  EXPECT_NE(order[4].status, TuneResult::Status::Ok);
  // The table says how many runs each figure is the mean of.
  TuneGrid grid;
  const std::string table = tune_table(order, grid, tune_request(1e6, 2, 16));
  EXPECT_NE(table.find("| 1 | DDP mb 1 x acc 1, bucket 25 MiB | 30.50 | 524.7 | 2 |"), std::string::npos) << table;
}

TEST(TunePlan, CandidateConfigsSayWhatTheCandidateIs) {
  TuneRequest r = with_defaults(tune_request(1e6, 2, 16));
  r.precision = "bf16";
  r.gradient_clipping = 1.0;
  TuneCandidate c;
  c.strategy = "ZERO_3";
  c.micro_batch = 4;
  c.accumulation = 2;
  c.bucket_mib = 50;
  c.checkpointing = true;
  const AcceleratorConfig cfg = load_config_file(write_temp("c.json", candidate_config(c, r)));
  EXPECT_EQ(cfg.spec.strategy, zero::Strategy::Zero3);
  EXPECT_EQ(cfg.spec.bucket_bytes, 50LL << 20);
  EXPECT_TRUE(cfg.spec.activation_checkpointing);
  EXPECT_EQ(cfg.gradient_accumulation_steps, 2);
  EXPECT_EQ(cfg.batch.micro_batch_per_gpu, 4);
  EXPECT_EQ(cfg.mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(cfg.gradient_clipping, 1.0);
  // The winner as an Accelerate YAML: inline where the YAML can say it (FSDP's checkpointing key for
  // ZeRO-3, one micro-step a step), else naming the JSON written beside it (a bucket size); the
  // how-it-was-chosen lines on top.
  c.bucket_mib = 25;
  c.accumulation = 1;
  r.gradient_clipping = 0;  // (clipping has a key in DeepSpeed's section only: WinnersAreWhatTheirCandidatesRan)
  const std::string json_path = write_temp("w.json", "");
  const WinnerFiles inline_w = winner_accelerate(c, r, json_path, {"how: line one", "line two"});
  EXPECT_TRUE(inline_w.json.empty());
  EXPECT_EQ(inline_w.yaml.rfind("# how: line one\n# line two\n", 0), 0u) << inline_w.yaml;
  const AcceleratorConfig y = load_config_file(write_temp("w.yaml", inline_w.yaml));
  EXPECT_EQ(y.spec.strategy, zero::Strategy::Zero3);
  EXPECT_TRUE(y.spec.activation_checkpointing);
  EXPECT_EQ(y.gradient_accumulation_steps, 1);
  EXPECT_EQ(y.num_processes, 2);
  c.accumulation = 2;
  c.bucket_mib = 100;
  const WinnerFiles with_json = winner_accelerate(c, r, json_path, {"how"});
  ASSERT_FALSE(with_json.json.empty());
  std::ofstream(json_path) << with_json.json;
  const AcceleratorConfig yj = load_config_file(write_temp("wj.yaml", with_json.yaml));
  EXPECT_EQ(yj.spec.bucket_bytes, 100LL << 20);
  EXPECT_EQ(yj.spec.strategy, zero::Strategy::Zero3);
  // The DeepSpeed JSON carries the lines in "_comment", which accel reads past.
  const std::string ds = winner_deepspeed(c, r, {"chosen \"so\""});
  EXPECT_NE(ds.find("\"_comment\": [\n    \"chosen \\\"so\\\"\"\n  ]"), std::string::npos) << ds;
  EXPECT_EQ(load_config_file(write_temp("ds.json", ds)).spec.bucket_bytes, 100LL << 20);
  files::remove_tree(std::filesystem::path(json_path).parent_path().string());  // (not remove_all: base/files.h)
}

// A candidate's config and the winner's files resolve to the same training: strategy, offload, gradient
// clipping, checkpointing, accumulation and micro-steps (the Accelerator's default_sync_each_batch of
// the loaded config), for every strategy, accumulation, checkpointing, bucket, offload and base clipping
// the grid runs: a ZeRO-2/3 winner that ran its micro-steps reducing is not written as an FSDP config,
// which would run them NoSync (the whole gradient held on every rank: more memory than measured), and
// no winner loses the clipping or the offload its candidate ran with.
TEST(TunePlan, WinnersAreWhatTheirCandidatesRan) {
  TuneRequest r = with_defaults(tune_request(1e6, 4, 16));
  r.num_machines = 2;  // (HYBRID_SHARD candidates)
  r.device_cuda = true;
  const std::string json_path = write_temp("winner.json", "");
  int checked = 0;
  for (double clip : {0.0, 1.0})
    for (const char* s : {"DDP", "ZERO_1", "ZERO_2", "ZERO_3", "HYBRID_SHARD"})
      for (std::int64_t acc : {1, 2})
        for (bool ckpt : {false, true})
          for (double bucket : {25.0, 100.0})
            for (const char* off : {"none", "optimizer", "optimizer+params"}) {
              const std::string strategy = s, offload = off;
              // (what the grid prunes: tests above)
              if (strategy == "HYBRID_SHARD" && (bucket != 25.0 || offload == "optimizer")) continue;
              if (offload == "optimizer+params" && strategy != "ZERO_3" && strategy != "HYBRID_SHARD") continue;
              r.gradient_clipping = clip;
              TuneCandidate c;
              c.strategy = s;
              c.micro_batch = 2;
              c.accumulation = acc;
              c.checkpointing = ckpt;
              c.bucket_mib = bucket;
              c.offload = off;
              SCOPED_TRACE(::testing::Message() << s << " acc " << acc << " ckpt " << ckpt << " bucket " << bucket
                                                << " offload " << off << " clip " << clip);
              const std::string ext = candidate_is_json(c) ? ".json" : ".yaml";
              const AcceleratorConfig cand = load_config_file(write_temp("cand" + ext, candidate_config(c, r)));
              const bool ran = default_sync_each_batch(cand);
              EXPECT_EQ(ran, candidate_syncs_each_batch(c));
              EXPECT_EQ(ran, (strategy == "ZERO_2" || strategy == "ZERO_3"));
              EXPECT_EQ(cand.offload_optimizer_device, offload == "none" ? "none" : "cpu");
              EXPECT_EQ(cand.offload_param_device, offload == "optimizer+params" ? "cpu" : "none");
              const WinnerFiles w = winner_accelerate(c, r, json_path, {"how"});
              if (!w.json.empty()) std::ofstream(json_path) << w.json;
              const AcceleratorConfig written = load_config_file(write_temp("winner.yaml", w.yaml));
              EXPECT_EQ(written.spec.strategy, cand.spec.strategy) << w.yaml;
              EXPECT_EQ(written.offload_optimizer_device, cand.offload_optimizer_device) << w.yaml;
              EXPECT_EQ(written.offload_param_device, cand.offload_param_device) << w.yaml;
              EXPECT_EQ(written.gradient_clipping.value_or(0), cand.gradient_clipping.value_or(0)) << w.yaml;
              EXPECT_EQ(written.spec.activation_checkpointing, ckpt) << w.yaml;
              EXPECT_EQ(written.gradient_accumulation_steps, acc);
              if (acc > 1) EXPECT_EQ(default_sync_each_batch(written), ran) << w.yaml;
              // The base config's clipping: run and kept, except by HYBRID_SHARD, which says so.
              if (strategy != "HYBRID_SHARD") {
                EXPECT_EQ(cand.gradient_clipping.value_or(0), clip);
              } else if (clip > 0) {
                EXPECT_NE(w.yaml.find("has no key in FSDP's section"), std::string::npos) << w.yaml;
              }
              ++checked;
            }
  // Per clip: DDP, ZeRO-1, ZeRO-2 with 2 offloads, ZeRO-3 with 3 (x 2 x 2 x 2); HYBRID_SHARD with 2 (x 2 x 2).
  EXPECT_EQ(checked, 2 * ((3 * 2 + 3) * 8 + 2 * 4));
  files::remove_tree(std::filesystem::path(json_path).parent_path().string());
}

}  // namespace
}  // namespace accel::cli
