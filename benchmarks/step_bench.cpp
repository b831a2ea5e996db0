// step_bench — one training step of a GPT-like model (~20M parameters) under a strategy: median step
// time (slowest rank), peak bytes per rank by category (counting allocator), and bytes moved per
// rank per step (bus bytes, as nccl-tests counts them: all_reduce 2(n-1)/n, reduce_scatter and
// all_gather (n-1)/n of the full size). `--strategy plain` is the same loop in plain libtorch (no
// accel), the 1-rank baseline. Weak scaling: each rank trains its own micro-batch.
// `--strategy plain,DDP` (a list) interleaves the strategies' steps in one run: time ratios measured
// under the same conditions, which single runs on a noisy machine cannot give.
//
//   mpirun --oversubscribe -np 2 build/bin/step_bench --strategy ZERO_3
//   bash benchmarks/run_step_bench.sh      # the README table: every strategy at 1, 2 and 4 ranks
#include "base/memory.h"
#include "comm/communicator.h"
#include "sharding/models.h"
#include "zero/sharded_optimizer.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <thread>

using namespace accel;
using Clock = std::chrono::steady_clock;

namespace {

double max_over_ranks(comm::Communicator& c, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  c.all_reduce(t, {comm::ReduceOp::Max});
  return t.item<double>();
}

double bus_bytes(const comm::Counters& a, const comm::Counters& b, int n) {
  using comm::Collective;
  if (n == 1) return 0;
  double f = (n - 1.0) / n;
  return (b[Collective::AllReduce].bytes_sent - a[Collective::AllReduce].bytes_sent) * 2 * f +
         (b[Collective::ReduceScatter].bytes_sent - a[Collective::ReduceScatter].bytes_sent) * f +
         (b[Collective::AllGather].bytes_received - a[Collective::AllGather].bytes_received) * f;
}

zero::ShardingSpec spec_for(const std::string& s) {
  if (s == "DDP") return zero::ShardingSpec::ddp();
  if (s == "ZERO_1") return zero::ShardingSpec::zero(1);
  if (s == "ZERO_2") return zero::ShardingSpec::zero(2);
  if (s == "ZERO_3") return zero::ShardingSpec::zero(3);
  return zero::ShardingSpec::fsdp(s);  // FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"step_bench: step time, memory and traffic of one strategy"};
  std::string strategy = "DDP";
  int steps = 6, warmup = 2, batch = 4, seq = 64;
  test::GPTConfig cfg{4096, 384, 6, 10, 64};
  app.add_option("--strategy", strategy,
                 "plain | DDP | ZERO_1 | ZERO_2 | ZERO_3 | FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD; "
                 "a comma-separated list interleaves their steps in one run and prints time ratios");
  app.add_option("--steps", steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "unmeasured steps first");
  app.add_option("--batch", batch, "sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--layers", cfg.layers, "transformer blocks (each a unit)");
  app.add_option("--d-model", cfg.d, "width");
  CLI11_PARSE(app, argc, argv);
  cfg.seq = seq;

  memory::install_counting_allocator();
  auto world = comm::Communicator::world();
  const int n = world->size(), r = world->rank();
  // Share the cores among the ranks of this machine.
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(std::max(1, cores / world->topology().local_world_size));

  // One model per strategy named; with several, their steps are interleaved round-robin in this one
  // run, so their time ratio is measured under the same conditions (memory columns need one alone).
  std::vector<std::string> names;
  for (std::size_t at = 0; at <= strategy.size();) {
    std::size_t comma = std::min(strategy.find(',', at), strategy.size());
    names.push_back(strategy.substr(at, comma - at));
    at = comma + 1;
  }
  struct Run {
    std::string name;
    std::shared_ptr<test::GPTImpl> model;
    std::unique_ptr<torch::optim::AdamW> user_opt;
    zero::Prepared prepared;
    torch::optim::Optimizer* opt = nullptr;
    std::vector<double> times;
    double moved = 0;
  };
  std::vector<Run> runs;
  std::int64_t psi = 0;
  for (const auto& name : names) {
    if (name == "plain" && n != 1) {
      if (r == 0) fmt::print(stderr, "step_bench: --strategy plain runs on 1 rank\n");
      return 2;
    }
    Run run;
    run.name = name;
    at::manual_seed(0);
    run.model = std::make_shared<test::GPTImpl>(cfg);
    psi = 0;
    for (const auto& p : run.model->parameters()) psi += p.numel();
    run.user_opt = std::make_unique<torch::optim::AdamW>(run.model->parameters(), torch::optim::AdamWOptions(1e-4));
    run.opt = run.user_opt.get();
    if (name != "plain") {
      run.prepared = zero::prepare(run.model, *run.user_opt, spec_for(name), world);
      run.opt = run.prepared.optimizer.get();
    }
    runs.push_back(std::move(run));
  }

  at::manual_seed(100 + r);
  at::Tensor x = at::randint(cfg.vocab, {batch, seq}), y = at::randint(cfg.vocab, {batch, seq});
  for (int s = 0; s < warmup + steps; ++s)
    for (auto& run : runs) {
      if (s == warmup) memory::reset_peaks();
      world->barrier();
      // Every group the step talks over (HYBRID_SHARD: the node and cross-node groups).
      std::vector<comm::Communicator*> groups{world.get()};
      if (run.prepared.engine)
        for (auto* g : {run.prepared.engine->shard_group().get(), run.prepared.engine->gather_group().get(),
                        run.prepared.engine->replicate_group().get()})
          if (g && std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
      std::vector<comm::Counters> c0;
      for (auto* g : groups) c0.push_back(g->counters());
      auto t0 = Clock::now();
      at::Tensor loss = test::lm_loss(run.model->forward(x), y);
      if (run.name == "plain")
        loss.backward();
      else
        run.prepared.engine->backward(loss);
      run.opt->step();
      run.opt->zero_grad();
      double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s >= warmup) {
        run.moved = 0;  // read before max_over_ranks, whose all_reduce is not the step's
        for (std::size_t g = 0; g < groups.size(); ++g) run.moved += bus_bytes(c0[g], groups[g]->counters(), groups[g]->size());
        run.times.push_back(max_over_ranks(*world, t));
      }
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  if (runs.size() > 1) {
    double base = median(runs[0].times);
    for (auto& run : runs)
      if (r == 0)
        fmt::print("{} ranks, interleaved: {:<13} median {:>8.1f} ms = {:.3f} x {}\n", n, run.name,
                   median(run.times) * 1e3, median(run.times) / base, runs[0].name);
    return 0;
  }
  Run& run = runs[0];
  auto snap = memory::snapshot();
  using memory::Category;
  // Per-rank peaks: the largest over ranks.
  auto mib = [&](std::int64_t b) { return max_over_ranks(*world, static_cast<double>(b)) / 1048576.0; };
  double p_total = mib(snap.total.peak), p_param = mib(snap[Category::Parameters].peak),
         p_grad = mib(snap[Category::Gradients].peak), p_opt = mib(snap[Category::OptimizerState].peak),
         p_gath = mib(snap[Category::Gathered].peak);
  if (r == 0)
    fmt::print("| {:<13} | {} | {:>8.1f} | {:>8.1f} | {:>7.1f} | {:>7.1f} | {:>7.1f} | {:>7.1f} | {:>7.2f} | {:>6.2f} |\n",
               run.name, n, median(run.times) * 1e3, p_total, p_param, p_grad, p_opt, p_gath, run.moved / 1048576.0,
               n > 1 ? run.moved / (psi * 4.0 * (n - 1) / n) : 0.0);
  return 0;
}
