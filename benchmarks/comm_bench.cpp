// comm_bench — collective bandwidth in the manner of nccl-tests: for each size, the mean time per
// call (slowest rank), algbw = size / time and busbw = algbw x the collective's factor
// (all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n). "size" is the larger buffer:
// all_reduce's tensor, reduce_scatter's input, all_gather's output. Each size is measured for every
// implementation in turn, in the same run (a noisy machine shifts them alike): `accel` (the
// Communicator), `mpi` (Open MPI's blocking MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather
// called directly) and `mpi_nb` (MPI_Iallreduce, ... then MPI_Wait). benchmarks/gloo_bench.py prints
// torch.distributed gloo's rows in the same format; benchmarks/run_comm_bench.sh tabulates them all.
// `accel_ns` (reduce_scatter only, not in the default list) is accel with its input in node-shared
// memory (Communicator::node_shared_empty), which the shm transport's peers read in place: ZeRO-2/3's
// gradient buffers on one node.
// Then one overlap figure: the time of a compute loop alone, with a large async all_reduce in
// flight, and the two in sequence.
//
//   mpirun --oversubscribe --bind-to none -np 2 build/bin/comm_bench
//   ACCEL_COMM_SHM=0 mpirun ... build/bin/comm_bench --impls accel   # accel over MPI
#include "comm/communicator.h"

#include <mpi.h>

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

MPI_Datatype mpi_type(at::ScalarType t) { return t == at::kDouble ? MPI_DOUBLE : MPI_FLOAT; }

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed");
}

// One call of `op` by implementation `impl` ("accel", "mpi", "mpi_nb") on the tensors.
void call_once(Communicator& c, MPI_Comm mc, const std::string& impl, const std::string& op, at::Tensor& big,
               at::Tensor& small) {
  if (impl == "accel" || impl == "accel_ns") {
    if (op == "all_reduce")
      c.all_reduce(big);
    else if (op == "reduce_scatter")
      c.reduce_scatter(big, small);
    else
      c.all_gather(small, big);
    return;
  }
  const MPI_Datatype t = mpi_type(big.scalar_type());
  const int count = static_cast<int>(big.numel()), shard = static_cast<int>(small.numel());
  const bool nb = impl == "mpi_nb";
  MPI_Request req = MPI_REQUEST_NULL;
  if (op == "all_reduce") {
    mpi_check(nb ? MPI_Iallreduce(MPI_IN_PLACE, big.data_ptr(), count, t, MPI_SUM, mc, &req)
                 : MPI_Allreduce(MPI_IN_PLACE, big.data_ptr(), count, t, MPI_SUM, mc),
              "MPI all_reduce");
  } else if (op == "reduce_scatter") {
    mpi_check(nb ? MPI_Ireduce_scatter_block(big.data_ptr(), small.data_ptr(), shard, t, MPI_SUM, mc, &req)
                 : MPI_Reduce_scatter_block(big.data_ptr(), small.data_ptr(), shard, t, MPI_SUM, mc),
              "MPI reduce_scatter");
  } else {
    mpi_check(nb ? MPI_Iallgather(small.data_ptr(), shard, t, big.data_ptr(), shard, t, mc, &req)
                 : MPI_Allgather(small.data_ptr(), shard, t, big.data_ptr(), shard, t, mc),
              "MPI all_gather");
  }
  if (nb) mpi_check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
}

Row measure(Communicator& c, MPI_Comm mc, const std::string& impl, const std::string& op, int64_t bytes,
            at::ScalarType dtype, int warmup, int iters) {
  const int n = c.size();
  const int64_t esize = at::elementSize(dtype);
  int64_t count = bytes / esize;
  if (op != "all_reduce") count = count / n * n;  // divisible into n shards
  const int64_t shard = count / n;
  at::Tensor big = at::ones({count}, dtype), small = at::ones({shard}, dtype);
  if (impl == "accel_ns") {
    big = c.node_shared_empty(count, dtype);
    if (!big.defined()) return {0, 0, 0};  // (the same on every rank) no shared memory: no row
    big.fill_(1);
  }
  for (int i = 0; i < warmup; ++i) call_once(c, mc, impl, op, big, small);
  c.barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) call_once(c, mc, impl, op, big, small);
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
  std::vector<std::string> impls = {"accel", "mpi", "mpi_nb"};
  app.add_option("-b,--min-bytes", min_bytes, "smallest size in bytes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-e,--max-bytes", max_bytes, "largest size in bytes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
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
  app.add_option("--impls", impls, "implementations to measure, each size in turn")
      ->check(CLI::IsMember({"accel", "accel_ns", "mpi", "mpi_nb"}));
  CLI11_PARSE(app, argc, argv);
  const at::ScalarType dtype = dtype_name == "float32"    ? at::kFloat
                               : dtype_name == "bfloat16" ? at::kBFloat16
                               : dtype_name == "float16"  ? at::kHalf
                                                          : at::kDouble;

  auto world = Communicator::world();
  const bool root = world->rank() == 0;
  // Open MPI called directly from this thread, beside accel's own MPI thread: needs MPI_THREAD_MULTIPLE.
  int level = 0;
  MPI_Query_thread(&level);
  MPI_Comm mc = MPI_COMM_NULL;
  const bool mpi_rows = level == MPI_THREAD_MULTIPLE && (dtype == at::kFloat || dtype == at::kDouble);
  if (mpi_rows) {
    MPI_Comm_dup(MPI_COMM_WORLD, &mc);
  } else {
    impls.erase(std::remove_if(impls.begin(), impls.end(), [](const auto& i) { return i.rfind("accel", 0) != 0; }),
                impls.end());
    if (root)
      fmt::print("# (no Open MPI rows: {})\n", level != MPI_THREAD_MULTIPLE ? "no MPI_THREAD_MULTIPLE" : "dtype");
  }
  if (root)
    fmt::print("# comm_bench: {} ranks, accel transport {} ({}), dtype {}, sizes {}..{} B x{}\n", world->size(),
               world->backend_name(at::ones({1})), world->topology().to_string(), dtype_name, min_bytes, max_bytes,
               factor);
  for (const auto& op : ops) {
    if (root) {
      fmt::print("#\n# {}\n", op);
      fmt::print("# {:<8} {:>12} {:>12} {:>6} {:>12} {:>10} {:>10}\n", "impl", "size(B)", "count", "iters", "time(us)",
                 "algbw(GB/s)", "busbw(GB/s)");
    }
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      for (const auto& impl : impls) {
        if (impl == "accel_ns" && op != "reduce_scatter") continue;
        // iterations from a one-call probe, so each size takes about `budget` seconds
        Row probe = measure(*world, mc, impl, op, bytes, dtype, 1, 1);
        int iters = static_cast<int>(std::clamp(budget / (probe.us * 1e-6), 1.0, static_cast<double>(max_iters)));
        Row r = measure(*world, mc, impl, op, bytes, dtype, warmup, iters);
        if (root && r.us > 0)
          fmt::print("  {:<8} {:>12} {:>12} {:>6} {:>12.1f} {:>10.3f} {:>10.3f}\n", impl, bytes,
                     bytes / at::elementSize(dtype), iters, r.us, r.algbw, r.busbw);
      }
    }
  }
  if (mc != MPI_COMM_NULL) MPI_Comm_free(&mc);

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
