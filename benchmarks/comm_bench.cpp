// comm_bench — collective bandwidth in the manner of nccl-tests: for each size, the mean time per
// call (slowest rank), algbw = size / time and busbw = algbw x the collective's factor
// (all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n). "size" is the larger buffer:
// all_reduce's tensor, reduce_scatter's input, all_gather's output. Then one overlap figure: the
// time of a compute loop alone, with a large async all_reduce in flight, and the two in sequence.
#include "comm/communicator.h"

#include <ATen/ATen.h>
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>

using namespace accel::comm;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Slowest rank's value: what a synchronous job waits for.
double max_over_ranks(Communicator& c, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  c.all_reduce(t, {ReduceOp::Max});
  return t.item<double>();
}

struct Row {
  double us, algbw, busbw;
};

Row measure(Communicator& c, const std::string& op, int64_t bytes, at::ScalarType dtype, int warmup, int iters) {
  const int n = c.size();
  const int64_t esize = at::elementSize(dtype);
  int64_t count = bytes / esize;
  if (op != "all_reduce") count = count / n * n;  // divisible into n shards
  const int64_t shard = count / n;
  at::Tensor big = at::ones({count}, dtype), small = at::ones({shard}, dtype);
  auto once = [&] {
    if (op == "all_reduce")
      c.all_reduce(big);
    else if (op == "reduce_scatter")
      c.reduce_scatter(big, small);
    else
      c.all_gather(small, big);
  };
  for (int i = 0; i < warmup; ++i) once();
  c.barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) once();
  double t = max_over_ranks(c, seconds_since(t0) / iters);
  double size = static_cast<double>(count * esize);
  double algbw = size / t / 1e9;
  double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
  return {t * 1e6, algbw, algbw * factor};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comm_bench: all_reduce / reduce_scatter / all_gather bandwidth (nccl-tests style)"};
  int64_t min_bytes = 1 << 10, max_bytes = 256ll << 20;
  int factor = 4, warmup = 2, max_iters = 20;
  double budget = 0.5;
  std::string dtype_name = "float32";
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather"};
  app.add_option("-b,--min-bytes", min_bytes, "smallest size in bytes")->capture_default_str();
  app.add_option("-e,--max-bytes", max_bytes, "largest size in bytes")->capture_default_str();
  app.add_option("-f,--step-factor", factor, "size multiplier between rows")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  app.add_option("-w,--warmup", warmup, "warm-up calls per size")->capture_default_str();
  app.add_option("-n,--max-iters", max_iters, "most timed calls per size")->capture_default_str();
  app.add_option("--budget", budget, "target seconds of timed calls per size (fewer iterations for large sizes)")
      ->capture_default_str();
  app.add_option("-d,--dtype", dtype_name, "float32, bfloat16, float16 or float64")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16", "float16", "float64"}));
  app.add_option("--ops", ops, "collectives to measure")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather"}));
  CLI11_PARSE(app, argc, argv);
  const at::ScalarType dtype = dtype_name == "float32"    ? at::kFloat
                               : dtype_name == "bfloat16" ? at::kBFloat16
                               : dtype_name == "float16"  ? at::kHalf
                                                          : at::kDouble;

  auto world = Communicator::world();
  const bool root = world->rank() == 0;
  if (root)
    fmt::print("# comm_bench: {} ranks, {} ({}), dtype {}, sizes {}..{} B x{}\n", world->size(), world->backend_name(at::ones({1})),
               world->topology().to_string(), dtype_name, min_bytes, max_bytes, factor);
  for (const auto& op : ops) {
    if (root) {
      fmt::print("#\n# {}\n", op);
      fmt::print("# {:>12} {:>12} {:>6} {:>12} {:>10} {:>10}\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)",
                 "busbw(GB/s)");
    }
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      // iterations from a one-call probe, so each size takes about `budget` seconds
      Row probe = measure(*world, op, bytes, dtype, 1, 1);
      int iters = static_cast<int>(std::clamp(budget / (probe.us * 1e-6), 1.0, static_cast<double>(max_iters)));
      Row r = measure(*world, op, bytes, dtype, warmup, iters);
      if (root)
        fmt::print("  {:>12} {:>12} {:>6} {:>12.1f} {:>10.3f} {:>10.3f}\n", bytes, bytes / at::elementSize(dtype),
                   iters, r.us, r.algbw, r.busbw);
    }
  }

  // Overlap: compute (matmuls) alone, with a 64 MiB async all_reduce in flight, and both in sequence.
  at::Tensor a = at::randn({256, 256}), acc = at::zeros({256, 256});
  at::Tensor payload = at::ones({16 << 20}, at::kFloat);
  auto compute = [&] {
    for (int i = 0; i < 60; ++i) acc.add_(at::mm(a, a));
  };
  compute();
  world->barrier();
  auto t0 = Clock::now();
  compute();
  double t_compute = max_over_ranks(*world, seconds_since(t0));
  world->barrier();
  t0 = Clock::now();
  world->all_reduce(payload);
  double t_comm = max_over_ranks(*world, seconds_since(t0));
  world->barrier();
  t0 = Clock::now();
  auto w = world->all_reduce_async(payload);
  compute();
  w->wait();
  double t_both = max_over_ranks(*world, seconds_since(t0));
  if (root)
    fmt::print(
        "#\n# overlap: compute {:.1f} ms, all_reduce(64 MiB) {:.1f} ms, sequential sum {:.1f} ms, "
        "async all_reduce during compute {:.1f} ms (hidden: {:.0f}% of the all_reduce)\n",
        t_compute * 1e3, t_comm * 1e3, (t_compute + t_comm) * 1e3, t_both * 1e3,
        100.0 * std::clamp((t_compute + t_comm - t_both) / t_comm, 0.0, 1.0));
  return 0;
}
