// accel bench's rules (cli/bench_plan.h): its lists, its runs and their machines, the accel launch
// command of a run, the formulas its records carry, and a record's derived columns.
#include "cli/bench_plan.h"
#include "support/errors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using accel::test::message_of;

namespace accel::cli {
namespace {

using Words = std::vector<std::string>;

TEST(BenchPlan, RankListsParseSortedAndBadOnesNameTheFlagAndAFix) {
  EXPECT_EQ(parse_rank_list("4,1,2"), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(parse_rank_list(" 8 "), (std::vector<int>{8}));
  EXPECT_EQ(message_of<BenchError>([] { parse_rank_list("1,x,4"); }),
            "--num_processes '1,x,4': 'x' is not a whole number of ranks (1 or more); give a comma-separated list "
            "of rank counts, e.g. --num_processes 1,2,4");
  for (const char* bad : {"", "1,,2", "0", "2,-1", "1.5", "1,2,", "3,3"})
    EXPECT_NE(message_of<BenchError>([&] { parse_rank_list(bad); }).find("--num_processes '"), std::string::npos)
        << bad;
  EXPECT_NE(message_of<BenchError>([] { parse_rank_list("3,3"); }).find("3 is listed twice"), std::string::npos);
}

TEST(BenchPlan, StrategiesTakeStepBenchNamesAndShortSpellings) {
  EXPECT_EQ(parse_strategy_list("ddp,zero2,Zero-3,full_shard,ZERO_1,zero2"),
            (Words{"DDP", "ZERO_2", "ZERO_3", "FULL_SHARD", "ZERO_1"}));
  EXPECT_EQ(normalize_strategy("hybrid_shard"), "HYBRID_SHARD");
  const std::string m = message_of<BenchError>([] { normalize_strategy("zero4"); });
  EXPECT_NE(m.find("unknown strategy 'zero4'"), std::string::npos) << m;
  EXPECT_NE(m.find("DDP, ZERO_1, ZERO_2, ZERO_3, FULL_SHARD"), std::string::npos) << m;
  EXPECT_NE(message_of<BenchError>([] { normalize_strategy("plain"); }).find("not a strategy that scales"),
            std::string::npos);
  EXPECT_EQ(parse_precision_list("no,BF16,fp8"), (Words{"fp32", "bf16", "fp8"}));
  EXPECT_NE(message_of<BenchError>([] { parse_precision_list("fp64"); }).find("unknown precision 'fp64'"),
            std::string::npos);
}

TEST(BenchPlan, RunsGoByWorldSizeThenStrategyThenPrecision) {
  BenchRequest req;
  req.ranks = {1, 2};
  req.strategies = {"DDP", "ZERO_3"};
  req.precisions = {"fp32", "bf16"};
  auto runs = plan_bench(req);
  ASSERT_EQ(runs.size(), 8u);
  EXPECT_EQ(runs[0].label(), "DDP fp32, 1 rank");
  EXPECT_EQ(runs[1].label(), "DDP bf16, 1 rank");
  EXPECT_EQ(runs[3].label(), "ZERO_3 bf16, 1 rank");
  EXPECT_EQ(runs[4].label(), "DDP fp32, 2 ranks");
  EXPECT_EQ(runs[7].slug(), "ZERO_3_bf16_n2");
  EXPECT_FALSE(runs[7].machines);  // no hostfile: accel launch decides
}

TEST(BenchPlan, HostfileRunsFillMachinesInOrder) {
  BenchRequest req;
  req.ranks = {1, 2, 4};
  req.strategies = {"DDP"};
  req.precisions = {"fp32"};
  req.hosts = {{"h0", 2}, {"h1", 2}};
  req.hostfile = "/hf";
  auto runs = plan_bench(req);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(*runs[0].machines, 1);
  EXPECT_EQ(*runs[1].machines, 1);
  EXPECT_EQ(*runs[2].machines, 2);
  EXPECT_EQ(runs[2].label(), "DDP fp32, 4 ranks on 2 machines");
  req.ranks = {8};
  EXPECT_EQ(message_of<BenchError>([&] { plan_bench(req); }),
            "--num_processes 8 needs 4 machines (hostfile /hf, 2 slots each), but hostfile /hf lists 2; add hosts "
            "or drop 8 from --num_processes");
  req.ranks = {3};
  EXPECT_NE(message_of<BenchError>([&] { plan_bench(req); }).find("does not split evenly over the 2 machines"),
            std::string::npos);
  // Without a hostfile (Slurm), --ranks_per_machine fills nodes the same way.
  req.hosts.clear();
  req.hostfile.clear();
  req.ranks = {2, 4, 8};
  req.ranks_per_machine = 4;
  runs = plan_bench(req);
  EXPECT_EQ(*runs[0].machines, 1);
  EXPECT_EQ(*runs[1].machines, 1);
  EXPECT_EQ(*runs[2].machines, 2);
  req.ranks = {1, 4};
  req.num_machines = 2;
  EXPECT_NE(message_of<BenchError>([&] { plan_bench(req); }).find("--num_processes 1 does not split evenly"),
            std::string::npos);
}

TEST(BenchPlan, LaunchCommandPassesHostfileLauncherAndModelFlags) {
  BenchRequest req;
  req.ranks = {4};
  req.strategies = {"ZERO_3"};
  req.precisions = {"bf16"};
  req.hosts = {{"h0", 2}, {"h1", 2}};
  req.hostfile = "/hf";
  req.launch_args = {"--launcher", "mpirun"};
  req.step_bench = "/b/step_bench";
  req.step_args = {"--steps", "3", "--d-model", "64"};
  EXPECT_EQ(launch_argv(req, plan_bench(req)[0]),
            (Words{"launch", "--num_processes", "4", "--num_machines", "2", "--hostfile", "/hf", "--launcher", "mpirun",
                   "/b/step_bench", "--strategy", "ZERO_3", "--precision", "bf16", "--json", "--steps", "3",
                   "--d-model", "64"}));
}

// The traffic test's formula (tests/zero/test_engine.cpp): (shards parameters ? 3 : 2) Psi (N-1)/N 4 B.
TEST(BenchPlan, TrafficFormulaIsTheEngineTestsOne) {
  const double psi = 1000;
  for (const char* s : {"DDP", "NO_SHARD", "ZERO_1", "ZERO_2", "SHARD_GRAD_OP"})
    EXPECT_DOUBLE_EQ(traffic_formula_bytes(s, "fp32", psi, 4), 2 * psi * 0.75 * 4) << s;
  for (const char* s : {"ZERO_3", "FULL_SHARD"})
    EXPECT_DOUBLE_EQ(traffic_formula_bytes(s, "fp32", psi, 2), 3 * psi * 0.5 * 4);
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("ZERO_3", "fp32", psi, 1), 0.0);
  // Node-shared parameters gather nothing: the reduce-scatter alone.
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("ZERO_3", "fp32", psi, 2, true), psi * 0.5 * 4);
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("FULL_SHARD", "bf16", psi, 4, true), psi * 0.75 * 4);
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("ZERO_2", "fp32", psi, 2, true), 2 * psi * 0.5 * 4);  // (not sharded)
  EXPECT_FALSE(traffic_formula("HYBRID_SHARD", "fp32", psi, 4));
  // Low precision: fp32 reductions, gathers in the parameters' dtype (fp8 where parameters are sharded).
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("DDP", "bf16", psi, 2), 2 * psi * 0.5 * 4);
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("ZERO_2", "bf16", psi, 2), (4 + 2) * psi * 0.5);
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("ZERO_3", "fp16", psi, 2), (4 + 2 * 2) * psi * 0.5);
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("ZERO_3", "fp8", psi, 2), (4 + 2 * 1) * psi * 0.5);
  EXPECT_DOUBLE_EQ(traffic_formula_bytes("ZERO_2", "fp8", psi, 2), (4 + 2) * psi * 0.5);
}

// accel estimate-memory's rows (the ZeRO paper's): fp32 AdamW 16 B per parameter in all;
// bf16 AdamW p 2, g 2, K 12.
TEST(BenchPlan, MemoryFormulaIsEstimateMemorysOne) {
  const double psi = 1000;
  EXPECT_DOUBLE_EQ(memory_formula_bytes("DDP", "fp32", psi, 4, 4), 16 * psi);
  EXPECT_DOUBLE_EQ(memory_formula_bytes("ZERO_1", "fp32", psi, 4, 4), (8 + 8.0 / 4) * psi);
  EXPECT_DOUBLE_EQ(memory_formula_bytes("ZERO_2", "fp32", psi, 4, 4), (4 + 12.0 / 4) * psi);
  EXPECT_DOUBLE_EQ(memory_formula_bytes("FULL_SHARD", "fp32", psi, 4, 4), 16.0 / 4 * psi);
  EXPECT_DOUBLE_EQ(memory_formula_bytes("ZERO_2", "bf16", psi, 4, 4), (2 + 14.0 / 4) * psi);
  EXPECT_DOUBLE_EQ(memory_formula_bytes("HYBRID_SHARD", "fp32", psi, 8, 2), 16.0 / 2 * psi);
}

const char* kStepLine =
    "{\"strategy\": \"ZERO_2\", \"precision\": \"fp32\", \"ranks\": 2, \"checkpoint\": false, \"params\": 1000, "
    "\"vocab\": 256, \"d_model\": 64, \"heads\": 4, \"layers\": 2, \"seq\": 16, \"batch\": 4, \"step_ms\": 20.000, "
    "\"wait_ms\": 1.000, \"wait_share\": 0.05, \"peak_rss\": 5e8, \"rss_base\": 1, \"rss_built\": 2, "
    "\"counted_peak\": 30000, \"parameters\": 4000, \"gradients\": 2000, \"optimizer\": 4000, \"gathered\": 0, "
    "\"activations\": 9000, \"other\": 100, \"device\": \"cpu\", \"cuda_peak\": 0, \"disk_bytes\": 0, "
    "\"disk_read\": 0, \"disk_written\": 0, \"moved\": 4100, \"nodes\": 1, \"ranks_per_node\": 2}";

TEST(BenchPlan, StepOutputIsItsLastJsonLine) {
  const std::string out = std::string("warning: something\n{\"step_ms\": 1, \"ranks\": 9}\n") + kStepLine + "\ndone\n";
  StepResult r = parse_step_output(out);
  EXPECT_EQ(r.get("ranks"), 2);
  EXPECT_EQ(r.get("checkpoint"), 0);
  EXPECT_EQ(r.str.at("device"), "cpu");
  EXPECT_NE(message_of<BenchError>([&] { r.get("nope"); }).find("no 'nope'"), std::string::npos);
  EXPECT_EQ(message_of<BenchError>([] { parse_step_output("| DDP | fp32 | 1 |\n{broken\n"); }),
            "step_bench printed no JSON line with step_ms");
}

TEST(BenchPlan, RecordDerivesThroughputEfficiencyAndFormulas) {
  StepResult r = parse_step_output(kStepLine);
  StepResult base = r;
  base.num["ranks"] = 1;
  base.num["step_ms"] = 16;  // 4 samples / 16 ms = 250 samples/s on 1 rank
  BenchRun run{"ZERO_2", "fp32", 2, std::nullopt};
  auto j = nlohmann::json::parse(bench_record(run, r, base));
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["nodes"], 1);
  EXPECT_EQ(j["model"]["d_model"], 64);
  EXPECT_DOUBLE_EQ(j["samples_per_s"].get<double>(), 400.0);  // 4 x 2 samples in 20 ms
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 6400.0);
  EXPECT_DOUBLE_EQ(j["efficiency"].get<double>(), 0.8);  // 200 per rank against 250
  EXPECT_EQ(j["efficiency_base_ranks"], 1);
  EXPECT_DOUBLE_EQ(j["model_states_bytes"].get<double>(), 10000.0);
  EXPECT_DOUBLE_EQ(j["model_states_formula_bytes"].get<double>(), (4 + 12.0 / 2) * 1000);
  EXPECT_DOUBLE_EQ(j["moved_formula_bytes"].get<double>(), 2 * 1000 * 0.5 * 4);
  EXPECT_DOUBLE_EQ(j["moved_ratio"].get<double>(), 4100.0 / 4000.0);
  EXPECT_DOUBLE_EQ(j["peak_bytes"]["activations"].get<double>(), 9000.0);
  EXPECT_TRUE(j["mfu"].is_null());          // step_bench knew no peak (the CPU without --peak_tflops)
  EXPECT_TRUE(j["model_flops"].is_null());  // (an older step_bench: no figure at all)
  StepResult with_mfu = r;
  with_mfu.num["model_flops"] = 3e10;
  with_mfu.num["mfu"] = 0.25;
  auto k = nlohmann::json::parse(bench_record(run, with_mfu, base));
  EXPECT_DOUBLE_EQ(k["model_flops"].get<double>(), 3e10);
  EXPECT_DOUBLE_EQ(k["mfu"].get<double>(), 0.25);
  const std::string table = summary_table({j.dump()});
  EXPECT_NE(table.find("| ZERO_2 | fp32 | 2 | 1 | 20.0 | 400.00 | 0.80 | 0.0 (0.0) | 0.00 (1.025) |"),
            std::string::npos)
      << table;
}

}  // namespace
}  // namespace accel::cli
