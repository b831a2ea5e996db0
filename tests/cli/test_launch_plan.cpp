// accel launch's rules (cli/launch_plan.h) and hostfiles (cli/hostfile.h): pure functions, single process.
#include "cli/hostfile.h"
#include "cli/launch_plan.h"
#include "support/errors.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(p.argv, (Words{"mpirun", "--oversubscribe", "-x", "ACCEL_CONFIG_FILE=/c/ddp.yaml", "-np", "3",
                           "/opt/accel/bin/accel-rank", "--node_rank", "0", "--num_nodes", "1", "--", "./train",
                           "--steps", "3"}));
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

TEST(LaunchPlan, HostfileGivesOneAppContextPerMachine) {
  auto r = request({"prog"});
  r.hosts = {{"10.0.0.1", 2}, {"10.0.0.2", 4}, {"10.0.0.3", 2}};
  r.hostfile = "hf";
  r.num_processes = 4;
  r.num_machines = 2;
  const LaunchPlan p = plan_launch(r);
  ASSERT_EQ(p.machines.size(), 2u);
  EXPECT_EQ(p.argv, (Words{"mpirun",
                           "--oversubscribe",
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
                           "--partition=gpu", "/opt/accel/bin/accel-rank", "--num_nodes", "2", "--", "prog"}));
  r.hosts = {{"a", 4}, {"b", 4}};
  EXPECT_EQ(plan_launch(r).launcher, "mpirun");  // a hostfile means mpirun even inside Slurm
}

TEST(LaunchPlan, ShellJoinQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_join({"mpirun", "-x", "A=b c", "it's", ""}), "mpirun -x 'A=b c' 'it'\\''s' ''");
}

}  // namespace
}  // namespace accel::cli
