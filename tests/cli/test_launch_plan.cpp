// accel launch's rules (cli/launch_plan.h), hostfiles (cli/hostfile.h) and which hosts a job restarts
// on under --min_nodes (cli/elastic.h): pure functions, single process.
#include "cli/elastic.h"
#include "cli/hostfile.h"
#include "cli/launch_plan.h"
#include "mfu.h"
#include "support/errors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

using accel::test::message_of;

namespace accel::cli {
namespace {

using Words = std::vector<std::string>;

TEST(Hostfile, ParsesDeepSpeedFormatWithCommentsAndBlankLines) {
  const auto h = parse_hostfile("# cluster\n\nworker-1 slots=4\n  worker-2   slots=2 max_slots=8  # gpu box\n", "hf");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].host, "worker-1");
  EXPECT_EQ(h[0].slots, 4);
  EXPECT_EQ(h[1].host, "worker-2");
  EXPECT_EQ(h[1].slots, 2);
}

TEST(Hostfile, BadLinesNameFileLineAndProblem) {
  EXPECT_EQ(message_of([] { parse_hostfile("a slots=1\nb\n", "hf"); }),
            "hostfile hf, line 2: host 'b' has no slots=N (the number of ranks it may run)");
  EXPECT_EQ(message_of([] { parse_hostfile("a slots=0\n", "hf"); }),
            "hostfile hf, line 1: slots must be a positive integer, got 'slots=0'");
  EXPECT_EQ(message_of([] { parse_hostfile("a slots=x\n", "hf"); }),
            "hostfile hf, line 1: slots must be a positive integer, got 'slots=x'");
  EXPECT_EQ(message_of([] { parse_hostfile("a slots=2 gpus=1\n", "hf"); }),
            "hostfile hf, line 1: unknown entry 'gpus=1' after host 'a' (expected slots=N)");
  EXPECT_EQ(message_of([] { parse_hostfile("a slots=2\na slots=2\n", "hf"); }),
            "hostfile hf, line 2: host 'a' is listed twice");
  EXPECT_EQ(message_of([] { parse_hostfile("# nothing\n\n", "hf"); }),
            "hostfile hf lists no hosts (expected lines like 'node1 slots=4')");
  EXPECT_NE(
      message_of([] { read_hostfile("/nonexistent/hostfile"); }).find("cannot read hostfile /nonexistent/hostfile"),
      std::string::npos);
}

LaunchRequest request(Words program = {"./train", "--steps", "3"}) {
  LaunchRequest r;
  r.program = std::move(program);
  r.rank_wrapper = "/opt/accel/bin/accel-rank";
  return r;
}

TEST(LaunchPlan, OneMachineUsesMpirunWithTheRankWrapper) {
  auto r = request();
  r.num_processes = 3;
  r.env = {{"ACCEL_CONFIG_FILE", "/c/ddp.yaml"}};
  const LaunchPlan p = plan_launch(r);
  EXPECT_EQ(p.launcher, "mpirun");
  EXPECT_EQ(p.num_processes, 3);
  // (request() gives one core: 3 ranks oversubscribe it, so no binding and one thread each)
  EXPECT_EQ(p.argv, (Words{"mpirun", "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1", "-x",
                           "ACCEL_CONFIG_FILE=/c/ddp.yaml", "-np", "3", "/opt/accel/bin/accel-rank", "--node_rank", "0",
                           "--num_nodes", "1", "--", "./train", "--steps", "3"}));
}

// As root (containers, CI) Open MPI refuses to start without its own flag, as a user would otherwise
// learn from a 13-line refusal: the launcher passes it, and only then.
TEST(LaunchPlan, AsRootMpirunIsAllowedToRunAsRoot) {
  auto r = request();
  r.num_processes = 2;
  const Words plain = plan_launch(r).argv;
  EXPECT_EQ(std::count(plain.begin(), plain.end(), "--allow-run-as-root"), 0);
  r.as_root = true;
  const Words root = plan_launch(r).argv;
  ASSERT_GE(root.size(), 3u);
  EXPECT_EQ((Words{root[0], root[1], root[2]}), (Words{"mpirun", "--oversubscribe", "--allow-run-as-root"}));
  EXPECT_EQ(root.size(), plain.size() + 1);
}

TEST(LaunchPlan, FlagBeatsConfigBeatsHostfileBeatsDefault) {
  auto r = request();
  EXPECT_EQ(plan_launch(r).num_processes, 1);
  r.hosts = {{"a", 2}, {"b", 2}};
  EXPECT_EQ(plan_launch(r).num_processes, 4);
  EXPECT_EQ(plan_launch(r).num_machines, 2);
  r.config_num_processes = 2;
  r.config_num_machines = 1;
  EXPECT_EQ(plan_launch(r).num_processes, 2);
  EXPECT_EQ(plan_launch(r).num_machines, 1);
  r.num_processes = 4;
  r.num_machines = 2;
  EXPECT_EQ(plan_launch(r).num_processes, 4);
  EXPECT_EQ(plan_launch(r).per_machine, 2);
}

// Without counts, a hostfile's ranks are those of the hosts used: the first num_machines, each taking
// as many as the one with the fewest slots has.
TEST(LaunchPlan, AHostfilesRanksAreThoseOfTheHostsUsed) {
  auto r = request();
  r.hosts = {{"h1", 2}, {"h2", 2}, {"h3", 2}};
  r.hostfile = "hf3";
  r.num_machines = 2;
  LaunchPlan p = plan_launch(r);
  EXPECT_EQ(p.num_processes, 4);
  EXPECT_EQ(p.machines.size(), 2u);
  r.hosts = {{"a", 4}, {"b", 2}};
  r.num_machines.reset();
  p = plan_launch(r);
  EXPECT_EQ(p.num_processes, 4);
  EXPECT_EQ(p.per_machine, 2);
}

TEST(LaunchPlan, HostfileGivesOneAppContextPerMachine) {
  auto r = request({"prog"});
  r.hosts = {{"10.0.0.1", 2}, {"10.0.0.2", 4}, {"10.0.0.3", 2}};
  r.hostfile = "hf";
  r.num_processes = 4;
  r.num_machines = 2;
  r.cores_per_machine = 2;
  const LaunchPlan p = plan_launch(r);
  ASSERT_EQ(p.machines.size(), 2u);
  EXPECT_EQ(p.argv, (Words{"mpirun",
                           "--oversubscribe",
                           "--map-by",
                           "ppr:2:node:PE=1",
                           "--bind-to",
                           "core",
                           "-x",
                           "OMP_NUM_THREADS=1",
                           "-np",
                           "2",
                           "--host",
                           "10.0.0.1:2",
                           "/opt/accel/bin/accel-rank",
                           "--node_rank",
                           "0",
                           "--num_nodes",
                           "2",
                           "--",
                           "prog",
                           ":",
                           "-np",
                           "2",
                           "--host",
                           "10.0.0.2:2",
                           "/opt/accel/bin/accel-rank",
                           "--node_rank",
                           "1",
                           "--num_nodes",
                           "2",
                           "--",
                           "prog"}));
}

TEST(LaunchPlan, MoreRanksThanSlotsIsRefused) {
  auto r = request();
  r.hosts = {{"a", 2}, {"b", 1}};
  r.hostfile = "hf";
  r.num_processes = 4;
  EXPECT_EQ(message_of([&] { plan_launch(r); }),
            "4 processes on 2 machine(s) need 2 slots per host, but 'b' in hf has slots=1");
  r.num_machines = 3;
  r.num_processes = 3;
  EXPECT_EQ(message_of([&] { plan_launch(r); }), "3 machines requested but hostfile hf lists only 2");
}

TEST(LaunchPlan, BadCountsAndMissingPiecesAreRefused) {
  auto r = request();
  r.num_processes = 0;
  EXPECT_EQ(message_of([&] { plan_launch(r); }), "--num_processes must be at least 1, got 0");
  r.num_processes = 3;
  r.num_machines = 2;
  EXPECT_EQ(message_of([&] { plan_launch(r); }),
            "3 processes do not spread evenly over 2 machines (num_processes is the total over all machines)");
  r.num_processes = 4;
  EXPECT_EQ(message_of([&] { plan_launch(r); }),
            "2 machines need --hostfile (lines like 'node1 slots=4'), or run inside a Slurm allocation");
  EXPECT_EQ(message_of([] { plan_launch(request({})); }), "no program given: accel launch [flags] PROGRAM [ARGS...]");
  auto l = request();
  l.launcher = "ssh";
  EXPECT_EQ(message_of([&] { plan_launch(l); }), "--launcher must be auto, mpirun or srun, got 'ssh'");
  l.launcher = "srun";
  EXPECT_NE(message_of([&] { plan_launch(l); }).find("needs a Slurm allocation"), std::string::npos);
}

TEST(LaunchPlan, SrunInsideSlurm) {
  auto r = request({"prog"});
  r.in_slurm = true;
  r.num_processes = 8;
  r.num_machines = 2;
  r.launcher_args = {"--partition=gpu"};
  const LaunchPlan p = plan_launch(r);
  EXPECT_EQ(p.launcher, "srun");
  EXPECT_EQ(p.argv, (Words{"srun", "--ntasks=8", "--nodes=2", "--ntasks-per-node=4", "--kill-on-bad-exit=1",
                           "--quit-on-interrupt", "--partition=gpu", "/opt/accel/bin/accel-rank", "--num_nodes", "2",
                           "--", "prog"}));
  // Slurm binds the ranks: --bind core|none would be ignored there, so it is refused, naming srun's way.
  r.bind = "core";
  EXPECT_NE(message_of([&] { plan_launch(r); }).find("under srun, Slurm binds the ranks"), std::string::npos);
  r.bind = "auto";
  r.hosts = {{"a", 4}, {"b", 4}};
  EXPECT_EQ(plan_launch(r).launcher, "mpirun");  // a hostfile means mpirun even inside Slurm
}

// The flags that place ranks and the OMP_NUM_THREADS they get, as they appear in argv.
Words placement(const LaunchPlan& p) {
  Words w;
  for (std::size_t i = 1; i < p.argv.size() && p.argv[i] != "-np"; ++i) w.push_back(p.argv[i]);
  return w;
}

TEST(LaunchPlan, EachRankGetsItsShareOfTheMachinesCores) {
  auto r = request();
  r.cores_per_machine = 8;
  for (auto [n, pe] : {std::pair{1, 8}, {2, 4}, {3, 2}, {8, 1}}) {
    r.num_processes = n;
    const LaunchPlan p = plan_launch(r);
    EXPECT_EQ(placement(p), (Words{"--oversubscribe", "--map-by", fmt::format("ppr:{}:node:PE={}", n, pe), "--bind-to",
                                   "core", "-x", fmt::format("OMP_NUM_THREADS={}", pe)}))
        << n << " ranks";
    EXPECT_EQ(p.binding, "core");
    EXPECT_EQ(p.cores_per_rank, pe);
    EXPECT_EQ(p.threads_per_rank, pe);
    EXPECT_FALSE(p.threads_from_user);
  }
  // Per machine, not in all: 2 machines x 2 ranks of 8 cores each.
  r.hosts = {{"a", 2}, {"b", 2}};
  r.num_processes = 4;
  EXPECT_EQ(plan_launch(r).cores_per_rank, 4);
}

TEST(LaunchPlan, MoreRanksThanCoresAreNotBoundAndGetOneThread) {
  auto r = request();
  r.cores_per_machine = 2;
  r.num_processes = 4;
  const LaunchPlan p = plan_launch(r);
  EXPECT_EQ(placement(p), (Words{"--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"}));
  EXPECT_EQ(p.binding, "none");
  EXPECT_EQ(p.cores_per_rank, 0);
  EXPECT_EQ(p.threads_per_rank, 1);
  r.bind = "core";
  EXPECT_EQ(message_of([&] { plan_launch(r); }), "--bind core needs at most 2 ranks per machine (its cores), got 4");
}

TEST(LaunchPlan, TheUsersThreadsAndPlacementWin) {
  auto r = request();
  r.cores_per_machine = 4;
  r.num_processes = 2;
  r.env = {{"OMP_NUM_THREADS", "3"}};
  LaunchPlan p = plan_launch(r);  // bound as usual, the user's thread count forwarded as it is
  EXPECT_EQ(placement(p),
            (Words{"--oversubscribe", "--map-by", "ppr:2:node:PE=2", "--bind-to", "core", "-x", "OMP_NUM_THREADS=3"}));
  EXPECT_TRUE(p.threads_from_user);
  EXPECT_EQ(p.threads_per_rank, 3);
  r.env.clear();
  r.bind = "none";
  EXPECT_EQ(placement(plan_launch(r)), (Words{"--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=2"}));
  r.bind = "auto";
  r.launcher_args = {"--map-by", "socket"};
  p = plan_launch(r);
  EXPECT_EQ(p.binding, "launcher_args");
  EXPECT_EQ(placement(p), (Words{"--oversubscribe", "-x", "OMP_NUM_THREADS=2", "--map-by", "socket"}));
  r.bind = "tight";
  EXPECT_EQ(message_of([&] { plan_launch(r); }), "--bind must be auto, core or none, got 'tight'");
}

TEST(LaunchPlan, SrunLeavesCoresToSlurm) {
  auto r = request({"prog"});
  r.in_slurm = true;
  r.cores_per_machine = 8;
  r.num_processes = 2;
  const LaunchPlan p = plan_launch(r);
  EXPECT_EQ(p.binding, "slurm");
  EXPECT_EQ(p.threads_per_rank, 0);  // accel-rank takes SLURM_CPUS_PER_TASK
  EXPECT_TRUE(p.bind_args.empty());
}

TEST(LaunchPlan, ShellJoinQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_join({"mpirun", "-x", "A=b c", "it's", ""}), "mpirun -x 'A=b c' 'it'\\''s' ''");
}

// --launcher_args are split as a shell splits them, and shell_join gives the same words back.
TEST(LaunchPlan, LauncherArgsSplitAsAShellSplitsThem) {
  EXPECT_EQ(split_shell_words("--mca plm_rsh_args '-p 2222' -x FOO=\"a b\""),
            (Words{"--mca", "plm_rsh_args", "-p 2222", "-x", "FOO=a b"}));
  EXPECT_EQ(split_shell_words("  a\tb\\ c \"q\\\"uote\" 'it'\\''s' ''  "), (Words{"a", "b c", "q\"uote", "it's", ""}));
  EXPECT_EQ(split_shell_words(""), Words{});
  const Words odd = {"-x", "A=b c", "it's", "\\back", "\"", "$HOME", ""};
  EXPECT_EQ(split_shell_words(shell_join(odd)), odd);
  EXPECT_EQ(message_of([] { split_shell_words("--prefix '/opt/x"); }),
            "--launcher_args: unterminated ' in: --prefix '/opt/x");
  EXPECT_NE(message_of([] { split_shell_words("-x \"A=b"); }).find("unterminated \""), std::string::npos);
  // The host probe keeps what reaching a host takes and leaves out where ranks go.
  EXPECT_EQ(without_placement_args({"--prefix", "/opt/ompi", "--map-by", "ppr:4:node", "--bind-to=core", "-npernode",
                                    "4", "--mca", "plm_rsh_agent", "ssh"}),
            (Words{"--prefix", "/opt/ompi", "--mca", "plm_rsh_agent", "ssh"}));
}

std::vector<std::string> hosts_of(const ShrinkPlan& p) {
  std::vector<std::string> h;
  for (const auto& m : p.machines) h.push_back(m.host + ":" + std::to_string(m.slots));
  return h;
}

TEST(MinNodes, ADroppedHostLeavesTheRestInHostfileOrder) {
  const std::vector<HostSlots> four = {{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}};
  // Two gone of four: the other two, in order.
  ShrinkPlan p = plan_shrink({four, {"", "rank 2 was killed by signal 9 first", "", "no answer"}, 4, 1});
  EXPECT_TRUE(p.ok);
  EXPECT_EQ(hosts_of(p), (Words{"a:2", "c:2"}));
  EXPECT_EQ(p.why, "dropped b (rank 2 was killed by signal 9 first), d (no answer); 2 of 4 host(s)");
  // One gone of four: 3 usable, but only 2 keep the global batch (4 / 3 is no whole accumulation).
  p = plan_shrink({four, {"", "", "gone", ""}, 4, 1});
  EXPECT_TRUE(p.ok);
  EXPECT_EQ(hosts_of(p), (Words{"a:2", "b:2"}));
  EXPECT_NE(p.why.find("3 usable, but the global batch needs a host count dividing 4: 1 left out"), std::string::npos)
      << p.why;
  // A job already shrunk to 2 of 4 loses one more: 1 host still divides 4.
  p = plan_shrink({{{"a", 2}, {"c", 2}}, {"gone", ""}, 4, 1});
  EXPECT_TRUE(p.ok);
  EXPECT_EQ(hosts_of(p), (Words{"c:2"}));
  // Nothing dropped (a probe found every host): the same hosts.
  p = plan_shrink({four, {"", "", "", ""}, 4, 2});
  EXPECT_TRUE(p.ok);
  EXPECT_EQ(p.machines.size(), 4u);
}

TEST(MinNodes, FewerUsableHostsThanTheMinimumStopTheJob) {
  const std::vector<HostSlots> three = {{"a", 1}, {"b", 1}, {"c", 1}};
  ShrinkPlan p = plan_shrink({three, {"gone", "", ""}, 3, 2});  // 2 usable, but 2 does not divide 3
  EXPECT_FALSE(p.ok);
  EXPECT_TRUE(p.machines.empty());
  EXPECT_EQ(p.why,
            "dropped a (gone); 2 usable host(s) left, fewer than --min_nodes 2 that can keep the global batch (a "
            "count dividing 3)");
  p = plan_shrink({three, {"x", "y", "z"}, 3, 1});
  EXPECT_FALSE(p.ok);
  EXPECT_EQ(p.why, "dropped a (x), b (y), c (z); 0 usable host(s) left, fewer than --min_nodes 1");
}

// Which failure came first, and which hosts a restart under --min_nodes leaves out.
TEST(MinNodes, TheRanksMpirunStoppedAreNotTheFailure) {
  auto rec = [](int rank, int node, int exit, int signal, long long t) {
    return RankFailure{.rank = rank, .node = node, .exit = exit, .signal = signal, .time_ns = t};
  };
  // Node 1's rank exited with 7 later by its clock than mpirun's SIGTERM of node 0's: still first.
  std::vector<RankFailure> f = {rec(0, 0, 143, 15, 100), rec(1, 0, 143, 15, 101), rec(2, 1, 7, 0, 500)};
  ASSERT_NE(first_failure(f), nullptr);
  EXPECT_EQ(first_failure(f)->rank, 2);
  const std::vector<bool> both = {true, true};
  EXPECT_EQ(hosts_failed(f, both), (Words{"", ""}));  // the program's failure: the same hosts
  // A crash by a signal of its own: that host.
  f.push_back(rec(3, 1, 137, 9, 50));
  EXPECT_EQ(first_failure(f)->rank, 3);
  EXPECT_EQ(hosts_failed(f, both), (Words{"", "rank 3 was killed by signal 9 first"}));
  // Only node 0's ranks, stopped by mpirun, reported: node 1, whose ranks had started, went away.
  f = {rec(0, 0, 143, 15, 100), rec(1, 0, 143, 15, 101)};
  EXPECT_EQ(first_failure(f)->rank, 0);
  EXPECT_EQ(hosts_failed(f, both),
            (Words{"", "its ranks started, then none reported; the others were stopped (signal 15)"}));
  // Node 1 never reached the status directory (not a shared filesystem): its silence says nothing.
  EXPECT_EQ(hosts_failed(f, {true, false}), (Words{"", ""}));
  // Every rank stopped (a scheduler's SIGTERM to all): nothing to drop. No record: nothing either.
  f.push_back(rec(2, 1, 143, 15, 99));
  EXPECT_EQ(hosts_failed(f, both), (Words{"", ""}));
  EXPECT_EQ(first_failure({}), nullptr);
  EXPECT_EQ(hosts_failed({}, both), (Words{"", ""}));
}

// benchmarks/mfu.h's data-sheet peaks by the names the CUDA runtime reports (step_bench's MFU).
TEST(DevicePeak, KnownGpusByNameAndPrecision) {
  using bench::device_peak_tflops;
  EXPECT_EQ(device_peak_tflops("NVIDIA H100 80GB HBM3", "bf16"), 989.4);
  EXPECT_EQ(device_peak_tflops("NVIDIA H100 80GB HBM3", "fp8"), 1978.9);
  EXPECT_EQ(device_peak_tflops("NVIDIA H100 80GB HBM3", "fp32"), 66.9);
  EXPECT_EQ(device_peak_tflops("NVIDIA H100 PCIe", "bf16"), 756.0);
  EXPECT_EQ(device_peak_tflops("NVIDIA H200", "fp16"), 989.4);
  EXPECT_EQ(device_peak_tflops("NVIDIA A100-SXM4-80GB", "fp8"), std::nullopt);  // no fp8 there
  EXPECT_EQ(device_peak_tflops("cpu", "fp32"), std::nullopt);
  EXPECT_EQ(device_peak_tflops("NVIDIA H100 80GB HBM3", "int4"), std::nullopt);
  // PaLM's count for the default step_bench GPT (19,331,328 parameters, 10 layers, seq 64, d 384) over
  // 256 tokens.
  EXPECT_EQ(bench::gpt_train_flops(19331328, 10, 64, 384, 256), (6.0 * 19331328 + 12.0 * 10 * 64 * 384) * 256);
}

}  // namespace
}  // namespace accel::cli
