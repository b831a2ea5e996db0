// step_bench — one training step of a GPT-like model (~20M parameters) under a strategy: median step
// time (slowest rank), peak bytes per rank by category (counting allocator), and bytes moved per
// rank per step (bus bytes, as nccl-tests counts them: all_reduce 2(n-1)/n, reduce_scatter and
// all_gather (n-1)/n of the full size). `--strategy plain` is the same loop in plain libtorch (no
// accel: torch::optim::AdamW's own step), the 1-rank baseline; `--strategy NO` is what accel gives one
// process (Accelerate's distributed_type NO: the engine's passthrough at 1 rank, whose step takes the
// fused kernels). Weak scaling: each rank trains its own micro-batch. The engine picks the
// float32 CPU matmuls (ACCEL_CPU_GEMM, src/kernels/cpu_gemm.h): plain alone keeps libtorch's, and in a
// list with other strategies it computes with whatever their engines installed.
// `--strategy plain,DDP` (a list) interleaves the strategies' steps in one run: time ratios measured
// under the same conditions, which single runs on a noisy machine cannot give.
// Models are built through sharded construction (sharding::ShardedInit, as Accelerator::sharded_init
// does) for every strategy but plain: no rank ever holds the whole model before prepare, so a model
// that only fits sharded can be built. `--checkpoint` sets ShardingSpec::activation_checkpointing.
// `--accumulation K`: a step is K micro-batches (the same batch each time) before the optimizer's step,
// those before the last reducing and adding up (Engine::MoreMicroSteps) or unreduced (NoSync).
// The table's activations column is memory::Category::Activations (what the forward keeps for
// backward); `--json` prints, instead of the table row, one JSON line with the same figures in bytes
// plus the per-rank peak RSS (getrusage ru_maxrss, the largest over ranks) and the RSS before the
// model was built (the runtime's fixed cost); benchmarks/largest_model.sh reads it. It also has "moved"
// (the moved column in bytes), "nodes" and "ranks_per_node" (the topology); `accel bench` reads them.
// "node_shared_bytes": parameters held in node-shared memory (ACCEL_NODE_SHARED_PARAMS=1): counted in
// every rank's peak RSS, held once by the node. "node_shared_grad_bytes": this rank's node-shared
// gradient buffers (ACCEL_NODE_SHARED_GRADS=1, the default under ZeRO-2/3 and FSDP's sharded strategies on
// one node's CPUs): the node holds ranks x this, and every rank's RSS counts what the group has touched.
// Node-shared memory is counted as each rank's share (memory::ExternalCharge), so the table's "node
// MiB" (JSON "node_counted_peak": the ranks' counted peaks summed, per node) holds it once; "PSS
// MiB" (JSON "pss", with "node_pss" summed over the ranks) is /proc/self/smaps_rollup's proportional
// set size after the run, each shared page split among the ranks mapping it, where RSS counts it in
// each. `--pss-every-ms N` samples it while the run lasts (JSON "peak_pss", the largest over ranks).
// "wait ms" (JSON "wait_ms", with "wait_share" of the step): per step, the time a rank spent blocked
// in Work::wait on the step's collectives (comm::Counters::wait_seconds over every group the step
// talks over), the mean over ranks, median over steps: the communication the step did not hide.
// `--precision fp32|bf16|fp16|fp8` sets the ShardingSpec dtypes (param / reduce / master):
//   fp32  the model's own (fp32 everywhere)
//   bf16  bf16 / fp32 / fp32
//   fp16  fp16 / fp32 / fp32, the loss multiplied by a static 1024 before backward and the master
//         gradients unscaled (mixed_precision::unscale_and_clip) before the step
//   fp8   bf16 / fp32 / fp32 with the blocks' linear layers in Float8Linear (GPTConfig::fp8), and
//         ShardingSpec::fp8_all_gather where parameters are sharded (ZeRO-3, FULL_SHARD, HYBRID_SHARD);
//         --fp8-recipe rowwise: the rowwise recipe instead, without the fp8 all-gather. On CUDA, stderr
//         says how many fp8 products a step at::_scaled_mm computed (JSON
//         "scaled_mm_products_per_step"): none means the device or the shapes had them emulated.
// The loss is computed in fp32 (logits cast) for every low precision. A list (fp32,bf16) interleaves
// too: every strategy x precision pair is one model in the same run. `plain` runs fp32 only.
// `--device cuda` (the default where CUDA is usable and ACCEL_USE_CPU is unset) trains on
// cuda:(local rank): the model is built whole on the CPU and moved (sharded construction is CPU-only),
// the data lives on the device, and each step ends with a device synchronize before its clock stops.
// `--device_memory GB` caps each rank's CUDA caching allocator there (setMemoryFraction of the device's
// memory): a model that does not fit fails with out of memory, as on a device of that size.
//
//   mpirun --oversubscribe -np 2 build/bin/step_bench --strategy ZERO_3
//   mpirun --oversubscribe -np 2 build/bin/step_bench --strategy ZERO_3 --precision bf16
//   bash benchmarks/run_step_bench.sh      # docs/performance.md's table: every strategy at 1, 2 and 4 ranks
//   bash benchmarks/run_step_bench.sh --precision-table   # DDP and ZERO_3 at 2 ranks, each precision
//   mpirun --oversubscribe -np 2 build/bin/step_bench --strategy ZERO_3 --checkpoint --d-model 1024 --json
#include "base/check_args.h"
#include "base/files.h"
#include "base/memory.h"
#include "comm/communicator.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "kernels/cpu_gemm.h"
#include "mfu.h"
#include "mixed_precision/cross_entropy.h"
#include "mixed_precision/float8_linear.h"
#include "mixed_precision/loss_scaler.h"
#include "models/gpt.h"
#include "sharding/sharded_init.h"
#include "step_profile.h"
#include "zero/plan.h"
#include "zero/sharded_optimizer.h"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#if __has_include(<c10/cuda/CUDACachingAllocator.h>) && __has_include(<cuda_runtime_api.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define STEP_BENCH_CUDA_STATS 1
#endif
#if defined(STEP_BENCH_CUDA_STATS) && defined(STEP_BENCH_CUDART)
#define STEP_BENCH_DEVICE_MEMORY 1  // (the device's total memory comes from the CUDA runtime)
#include <cuda_runtime_api.h>       // (and its name, for the MFU's peak)
#endif
#include <fmt/core.h>
#include <sys/resource.h>
#include <torch/optim/adamw.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace accel;
using Clock = std::chrono::steady_clock;

namespace {

double max_over_ranks(comm::Communicator& c, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  c.all_reduce(t, {comm::ReduceOp::Max});
  return t.item<double>();
}

double sum_over_ranks(comm::Communicator& c, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  c.all_reduce(t, {comm::ReduceOp::Sum});
  return t.item<double>();
}

double mean_over_ranks(comm::Communicator& c, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  c.all_reduce(t, {comm::ReduceOp::Avg});
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
  if (s == "DDP" || s == "NO") return zero::ShardingSpec::ddp();  // (NO: what the Accelerator prepares for it)
  if (s == "ZERO_1") return zero::ShardingSpec::zero(1);
  if (s == "ZERO_2") return zero::ShardingSpec::zero(2);
  if (s == "ZERO_3") return zero::ShardingSpec::zero(3);
  return zero::ShardingSpec::fsdp(s);  // FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD
}

// What one --precision value changes: the spec's dtypes, the model's linear layers, the loss scale.
struct Precision {
  std::string name;
  std::optional<c10::ScalarType> param, reduce, master;
  bool fp8 = false;       // Float8Linear blocks and, where parameters are sharded, fp8 all-gathers
  double loss_scale = 0;  // > 0: static loss scaling (fp16)
  bool low() const { return name != "fp32"; }
};

Precision precision_for(const std::string& p) {
  Precision x{p};
  if (p == "fp32") return x;
  x.reduce = x.master = at::kFloat;
  if (p == "bf16") {
    x.param = at::kBFloat16;
  } else if (p == "fp16") {
    x.param = at::kHalf;
    x.loss_scale = 1024;
  } else if (p == "fp8") {
    x.param = at::kBFloat16;
    x.fp8 = true;
  } else {
    throw std::invalid_argument("--precision '" + p + "' is not one of fp32, bf16, fp16, fp8");
  }
  return x;
}

// This process's peak resident set so far, in bytes (Linux reports ru_maxrss in KiB).
double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

// This process's proportional set size now, in bytes (/proc/self/smaps_rollup's Pss: each page
// divided by the number of processes mapping it, so node-shared memory counts 1/N in each rank); 0
// where the kernel has no smaps_rollup.
double pss_bytes() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "Pss: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024.0;
}

// The largest PSS seen while it lives: a thread that reads it every `every_ms` (each read walks the
// process's page tables: some milliseconds at gigabytes, so only when asked for).
class PssSampler {
 public:
  explicit PssSampler(int every_ms) {
    if (every_ms <= 0) return;
    thread_ = std::thread([this, every_ms] {
      while (!stop_.load()) {
        const double now = pss_bytes();
        double seen = peak_.load();
        while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(every_ms));
      }
    });
  }
  ~PssSampler() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double peak() const { return peak_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<double> peak_{0};
  std::thread thread_;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= s.size();) {
    std::size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int run_bench(int argc, char** argv) {
  CLI::App app{"step_bench: step time, memory and traffic of one strategy"};
  std::string strategy = "DDP", precision = "fp32";
  int steps = 6, warmup = 2, batch = 4, seq = 64, pss_every_ms = 0;
  double device_memory_gb = 0;
  bool show_loss = false, checkpoint = false, json = false;
  std::string profile_trace;  // --profile: "-" without a trace file
  const bool cuda_usable = at::detail::getCUDAHooks().hasCUDA() && std::getenv("ACCEL_USE_CPU") == nullptr;
  std::string device_name = cuda_usable ? "cuda" : "cpu";
  examples::GPTConfig cfg{4096, 384, 6, 10, 64};
  app.add_option("--strategy", strategy,
                 "plain | NO | DDP | ZERO_1 | ZERO_2 | ZERO_3 | FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD; "
                 "a comma-separated list interleaves their steps in one run and prints time ratios");
  app.add_option("--precision", precision,
                 "fp32 | bf16 | fp16 | fp8 (param/reduce/master dtypes; fp8: Float8Linear blocks and fp8 "
                 "all-gathers); a comma-separated list interleaves too");
  app.add_option("--steps", steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "unmeasured steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_flag("--show-loss", show_loss, "print rank 0's loss of every step to stderr (a sanity check)");
  app.add_option("--layers", cfg.layers, "transformer blocks (each a unit)");
  app.add_option("--d-model,--d_model", cfg.d, "width")->check(CLI::PositiveNumber);
  app.add_option("--heads", cfg.heads, "attention heads (must divide the width)")->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--vocab", cfg.vocab, "vocabulary size")->check(CLI::PositiveNumber);
  double peak_tflops = 0;
  app.add_option("--peak_tflops", peak_tflops,
                 "one device's peak TFLOP/s at the precision, for the MFU (default: the data sheet's for known GPUs, "
                 "benchmarks/mfu.h; on the CPU, per rank, none unless given)")
      ->check(CLI::NonNegativeNumber);
  std::string fp8_recipe = "tensorwise";
  app.add_option("--fp8-recipe,--fp8_recipe", fp8_recipe,
                 "with --precision fp8: tensorwise (and the fp8 all-gather where parameters are sharded) or rowwise")
      ->check(CLI::IsMember({"tensorwise", "rowwise"}));
  std::string attention = "auto";
  app.add_option(
         "--attention", attention,
         "eager (written out), sdpa (at::scaled_dot_product_attention) or auto (sdpa on CUDA, eager on the CPU)")
      ->check(CLI::IsMember({"auto", "eager", "sdpa"}));
  std::string loss_path = "fused";
  app.add_option("--loss", loss_path,
                 "fused (accel::nn::cross_entropy: one kernel each way on CUDA, ATen's composite elsewhere) or "
                 "composite (the logits in fp32, log_softmax, nll_loss, as torch_anchor.py computes it)")
      ->check(CLI::IsMember({"fused", "composite"}));
  app.add_flag("--checkpoint", checkpoint,
               "activation checkpointing of every block (ShardingSpec::activation_checkpointing)");
  app.add_option("--device", device_name, "cpu | cuda (default: cuda where usable and ACCEL_USE_CPU is unset)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--profile{-}", profile_trace,
               "after the measured steps, N more of each run (--profile-steps, default 3) under libtorch's "
               "profiler: rank 0 prints the device's kernels a step, its busy share, the top kernels, accel's "
               "scopes and the top host ops on stderr (--profile=TRACE.json also writes the Chrome trace); with "
               "--json on CUDA, \"device_busy_share\" and \"device_compute_share\" (kernels alone, no copies) of "
               "those steps' wall time");
  int profile_steps = 3;
  app.add_option("--profile-steps,--profile_steps", profile_steps,
                 "with --profile: the steps of each run under the profiler (default 3)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print one JSON line (bytes, peak RSS) instead of the table row");
  app.add_option("--device_memory,--device-memory", device_memory_gb,
                 "with --device cuda: cap each rank's CUDA caching allocator at this many GB (1e9 bytes), as on a "
                 "device that small (setMemoryFraction); past it an allocation fails with out of memory")
      ->check(CLI::PositiveNumber);
  app.add_option("--pss-every-ms", pss_every_ms,
                 "sample this rank's PSS (/proc/self/smaps_rollup) every N ms for the JSON's peak_pss (0: do not)")
      ->check(CLI::NonNegativeNumber);
  std::string offload_optimizer, offload_param;
  bool step_in_backward = false;
  app.add_flag("--step-in-backward,--step_in_backward", step_in_backward,
               "the optimizer steps each shard's master as its gradient is final, during backward "
               "(ShardingSpec::step_in_backward; sharded strategies, fp32 masters of their own or in host memory)");
  std::int64_t sub_group_size = 100'000'000;
  app.add_option("--offload-optimizer", offload_optimizer,
                 "DIR: the optimizer's masters and state in files under DIR (offload_optimizer.device nvme); cpu: "
                 "in host memory, from --device cuda (offload_optimizer.device cpu)");
  app.add_option("--offload-param", offload_param,
                 "DIR: ZeRO-3 parameter shards in files under DIR (offload_param.device nvme); cpu: in pinned host "
                 "memory, from --device cuda (offload_param.device cpu)");
  app.add_option("--sub-group-size", sub_group_size, "elements stepped per sub-group when the optimizer is offloaded")
      ->check(CLI::PositiveNumber);
  int accumulation = 1;
  app.add_option("--accumulation", accumulation,
                 "micro-batches of --batch sequences per optimizer step (gradient accumulation; a step's time, "
                 "tokens and MFU cover all of them)")
      ->check(CLI::PositiveNumber);
  std::string sync_each_batch = "auto";
  app.add_option("--sync-each-batch,--sync_each_batch", sync_each_batch,
                 "with --accumulation: on (every micro-batch reduces and adds to the pending gradients, "
                 "zero::Engine::MoreMicroSteps), off (they accumulate unreduced, NoSync) or auto (on for ZERO_2 and "
                 "ZERO_3, as DeepSpeed and the Accelerator's default)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  std::string grad_accum_dtype = "reduce";
  app.add_option("--grad-accum-dtype,--grad_accum_dtype", grad_accum_dtype,
                 "with --accumulation: the dtype a window's gradients add up in where it is wider than the "
                 "parameters' (ShardingSpec::accumulate_dtype, DeepSpeed's data_types.grad_accum_dtype): reduce "
                 "(the reduction's, fp32 under bf16/fp16: the default), fp32, bf16 or fp16")
      ->check(CLI::IsMember({"reduce", "fp32", "bf16", "fp16"}));
  CLI11_PARSE(app, argc, argv);
  cfg.seq = seq;
  cfg.attention = examples::attention_from_string(attention);
  // What the arguments alone refuse, before any rank or device exists (the message; empty: nothing).
  auto refusal = [&]() -> std::string {
    if (cfg.d % cfg.heads != 0) return fmt::format("--heads {} does not divide --d-model {}", cfg.heads, cfg.d);
    if (device_name != "cuda" && (offload_optimizer == "cpu" || offload_param == "cpu"))
      return "offload to cpu moves state off a device: give --device cuda";
    if (device_memory_gb > 0 && device_name != "cuda") return "--device_memory caps a CUDA device: give --device cuda";
    std::vector<Precision> precs;
    try {
      for (const auto& p : split_list(precision)) precs.push_back(precision_for(p));
      for (const auto& name : split_list(strategy))
        if (name != "plain") (void)spec_for(name);
    } catch (const std::exception& e) {
      return e.what();
    }
    if (json && (split_list(strategy).size() > 1 || precs.size() > 1))
      return "--json prints one run's line: give one --strategy and one --precision (a list interleaves runs and "
             "prints their ratios instead)";
    // plain is libtorch's loop: no engine to offload, step in backward or reduce micro-batches. Beside
    // accel strategies (an interleaved list) those options are theirs; alone, nothing would take them.
    bool only_plain = true;
    for (const auto& name : split_list(strategy)) only_plain = only_plain && name == "plain";
    if (only_plain) {
      if (!offload_optimizer.empty() || !offload_param.empty())
        return "--offload-optimizer and --offload-param need an accel strategy (ZERO_1-3, FULL_SHARD, ...), not "
               "plain alone";
      if (step_in_backward) return "--step-in-backward needs an accel strategy, not plain alone";
      if (sync_each_batch != "auto") return "--sync-each-batch needs an accel strategy, not plain alone";
    }
    for (const auto& name : split_list(strategy)) {
      if (name != "plain") continue;
      if (checkpoint) return "--checkpoint needs an accel strategy, not plain";
      for (const auto& prec : precs)
        if (prec.low())
          // plain is the libtorch loop without accel: there is no engine to keep fp32 masters of
          // low-precision parameters, so it has no precision axis.
          return fmt::format(
              "--strategy plain runs in fp32 only (got --precision {}); use --strategy DDP at 1 rank for a "
              "low-precision single-process step",
              prec.name);
    }
    return "";
  };
  if (check_args::active()) {
    if (const std::string why = refusal(); !why.empty()) {
      fmt::print(stderr, "step_bench: {}\n", why);
      return 2;
    }
    check_args::stop_here("step_bench");
  }

  memory::install_counting_allocator();
  auto world = comm::Communicator::world();
  const int n = world->size(), r = world->rank();
  if (const std::string why = refusal(); !why.empty()) {
    if (r == 0) fmt::print(stderr, "step_bench: {}\n", why);
    return 2;
  }
  if (device_name == "cuda" && !at::detail::getCUDAHooks().hasCUDA()) {
    if (r == 0) fmt::print(stderr, "step_bench: --device cuda but CUDA is not usable here\n");
    return 2;
  }
  const bool on_cuda = device_name == "cuda";
  // The Accelerator's rule: a simulated topology (ACCEL_RANKS_PER_NODE) puts every rank on this machine.
  const auto& topo = world->topology();
  const c10::Device device =
      on_cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(topo.rank_on_this_machine() %
                                                                      at::detail::getCUDAHooks().deviceCount()))
              : c10::Device(c10::kCPU);
  if (on_cuda) c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(device);  // (as the Accelerator does)
  auto sync_device = [&] {
    if (on_cuda) at::detail::getCUDAHooks().deviceSynchronize(device.index());
  };
  // On CUDA the counting allocator sees nothing: the peak is the caching allocator's peak of
  // allocated bytes over the measured steps, and with --profile the profiled steps after them
  // (torch.cuda.max_memory_allocated).
  auto reset_cuda_peak = [&] {
#ifdef STEP_BENCH_CUDA_STATS
    if (on_cuda) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  };
  auto cuda_peak_bytes = [&]() -> double {
#ifdef STEP_BENCH_CUDA_STATS
    if (on_cuda)
      return static_cast<double>(
          c10::cuda::CUDACachingAllocator::getDeviceStats(device.index())
              .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
              .peak);
#endif
    return 0.0;
  };
  if (device_memory_gb > 0) {
#ifdef STEP_BENCH_DEVICE_MEMORY
    (void)at::empty({1}, at::TensorOptions().device(device));  // the caching allocator starts lazily
    const std::size_t total = c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(device.index()).second;
    const double fraction = device_memory_gb * 1e9 / static_cast<double>(total);
    if (fraction > 1) {
      if (r == 0)
        fmt::print(stderr, "step_bench: --device_memory {} GB is more than the device's {:.1f} GB\n", device_memory_gb,
                   static_cast<double>(total) / 1e9);
      return 2;
    }
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
#else
    if (r == 0) fmt::print(stderr, "step_bench: --device_memory needs a build with the CUDA runtime\n");
    return 2;
#endif
  }
  // The runtime's fixed cost (libtorch, MPI), before any model exists.
  const double rss_base = peak_rss_bytes();
  PssSampler pss_sampler(pss_every_ms);
  // Share the cores among the ranks of this machine, unless OMP_NUM_THREADS says how many (accel launch
  // sets each rank's share; a user's own setting wins).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    int cores = static_cast<int>(std::thread::hardware_concurrency());
    at::set_num_threads(std::max(1, cores / world->topology().local_world_size));
  }

  // One model per strategy x precision named; with several, their steps are interleaved round-robin
  // in this one run, so their time ratio is measured under the same conditions (memory columns need
  // one alone).
  const std::vector<std::string> names = split_list(strategy);
  std::vector<Precision> precisions;
  try {
    for (const auto& p : split_list(precision)) precisions.push_back(precision_for(p));
  } catch (const std::invalid_argument& e) {
    if (r == 0) fmt::print(stderr, "step_bench: {}\n", e.what());
    return 2;
  }
  struct Run {
    std::string name;
    Precision prec;
    std::shared_ptr<examples::GPTImpl> model;
    std::unique_ptr<torch::optim::AdamW> user_opt;
    zero::EngineAndOptimizer prepared;
    torch::optim::Optimizer* opt = nullptr;
    std::vector<double> times, waits;
    double moved = 0, disk_read = 0, disk_written = 0;
    double busy_share = -1, compute_share = -1;  // --profile on CUDA (bench::StepProfile)
    std::int64_t scaled_mm_products = 0;         // fp8 products at::_scaled_mm computed in the measured steps
  };
  std::vector<Run> runs;
  std::int64_t psi = 0;
  for (const auto& name : names)
    for (const auto& prec : precisions) {
      if ((name == "plain" || name == "NO") && n != 1) {
        if (r == 0) fmt::print(stderr, "step_bench: --strategy {} runs on 1 rank\n", name);
        return 2;
      }
      Run run;
      run.name = name;
      run.prec = prec;
      examples::GPTConfig c = cfg;
      c.fp8 = prec.fp8;
      at::manual_seed(0);
      std::optional<zero::ShardingSpec> spec;
      if (name != "plain") {
        spec = spec_for(name);
        spec->param_dtype = prec.param;
        spec->reduce_dtype = prec.reduce;
        spec->master_dtype = prec.master;
        if (grad_accum_dtype != "reduce")
          spec->accumulate_dtype = grad_accum_dtype == "fp32"   ? c10::kFloat
                                   : grad_accum_dtype == "bf16" ? c10::kBFloat16
                                                                : c10::kHalf;
        spec->fp8_all_gather = prec.fp8 && spec->shards_parameters() && fp8_recipe == "tensorwise";
        spec->activation_checkpointing = checkpoint;
        if (offload_optimizer == "cpu")
          spec->offload.optimizer = zero::OffloadDevice::Cpu;
        else if (!offload_optimizer.empty())
          spec->offload.optimizer = zero::OffloadDevice::Nvme, spec->offload.optimizer_nvme_path = offload_optimizer;
        if (offload_param == "cpu")
          spec->offload.param = zero::OffloadDevice::Cpu;
        else if (!offload_param.empty())
          spec->offload.param = zero::OffloadDevice::Nvme, spec->offload.param_nvme_path = offload_param;
        spec->offload.sub_group_size = sub_group_size;
        spec->step_in_backward = step_in_backward;
        if (on_cuda) {
          // Built whole in host memory: place_model then moves sharded units as this rank's shards.
          // (Sharded construction works there too, Accelerator::sharded_init's; these runs keep the path
          // their GPU figures were measured on.)
          run.model = std::make_shared<examples::GPTImpl>(c);
        } else {
          // Sharded construction: each block is sharded as soon as it is built (rank 0's values).
          sharding::ShardedInit scope(world, zero::groups_for(*spec, world).shard);
          run.model = std::make_shared<examples::GPTImpl>(c);
        }
      } else {
        run.model = std::make_shared<examples::GPTImpl>(c);
      }
      if (on_cuda && spec)
        zero::place_model(*run.model, *spec, device,
                          zero::groups_for(*spec, world).shard->size());  // (parameters sharded: moved flat by flat)
      else if (on_cuda)
        run.model->to(device);
      if (prec.fp8) nn::set_float8_recipe(*run.model, mixed_precision::float8_recipe_from_string(fp8_recipe));
      psi = 0;
      for (const auto& p : run.model->parameters()) psi += p.numel();
      run.user_opt = std::make_unique<torch::optim::AdamW>(run.model->parameters(), torch::optim::AdamWOptions(1e-4));
      run.opt = run.user_opt.get();
      if (spec) {
        run.prepared = zero::prepare(run.model, *run.user_opt, *spec, world);
        run.opt = run.prepared.optimizer.get();
      }
      runs.push_back(std::move(run));
    }

  // Peak RSS once every model is built and prepared (before the first step).
  const double rss_built = peak_rss_bytes();
  at::manual_seed(100 + r);
  at::Tensor x = at::randint(cfg.vocab, {batch, seq}).to(device), y = at::randint(cfg.vocab, {batch, seq}).to(device);
  // Whether a run's micro-steps before the last reduce (--sync-each-batch; auto: the Accelerator's
  // default, on where DeepSpeed's ZeRO-2/3 reduce every micro-step).
  auto reduces_each = [&](const Run& run) {
    return run.prepared.engine &&
           (sync_each_batch == "on" || (sync_each_batch == "auto" && run.name.rfind("ZERO_", 0) == 0 &&
                                        run.prepared.engine->spec().shards_gradients()));
  };
  // One training step of a run: per micro-batch (--accumulation) forward, the loss in fp32 and backward,
  // then the optimizer step; the last micro-batch's loss.
  auto train_step = [&](Run& run) {
    at::Tensor loss;
    for (int m = 0; m < accumulation; ++m) {
      const at::Tensor logits = run.model->forward(x);  // (the loss in fp32 from the logits' dtype)
      loss = loss_path == "composite" ? nn::cross_entropy_composite(logits, y) : examples::lm_loss(logits, y);
      if (accumulation > 1) loss = loss / accumulation;
      if (run.prec.loss_scale > 0) loss = loss * run.prec.loss_scale;
      if (run.name == "plain") {
        loss.backward();
        continue;
      }
      zero::Engine& engine = *run.prepared.engine;
      std::optional<zero::Engine::NoSync> no_sync;
      std::optional<zero::Engine::MoreMicroSteps> more;
      if (m + 1 < accumulation) {
        if (reduces_each(run))
          more.emplace(engine);
        else
          no_sync.emplace(engine);
      }
      engine.backward(loss);
    }
    if (accumulation > 1) loss = loss * accumulation;  // (the micro-batch's own loss, for --show-loss)
    if (run.prec.loss_scale > 0) {
      // Unscale the master gradients (the ones the step reads); the norm's partial sums are
      // all-reduced over the shard group where gradients or optimizer state are sharded.
      auto& engine = *run.prepared.engine;
      std::vector<at::Tensor> grads = engine.step_grads();
      comm::Communicator* sg = engine.plan().state_split ? engine.shard_group().get() : nullptr;
      mixed_precision::unscale_and_clip(grads, run.prec.loss_scale, std::nullopt, sg);
      engine.grads_scaled(1.0 / run.prec.loss_scale);
    }
    run.opt->step();
    run.opt->zero_grad();
    return loss;
  };
  for (int s = 0; s < warmup + steps; ++s)
    for (auto& run : runs) {
      if (s == warmup) {
        memory::reset_peaks();
        reset_cuda_peak();
      }
      world->barrier();
      // Every group the step talks over (HYBRID_SHARD: the node and cross-node groups).
      std::vector<comm::Communicator*> groups{world.get()};
      if (run.prepared.engine)
        for (auto* g : {run.prepared.engine->shard_group().get(), run.prepared.engine->gather_group().get(),
                        run.prepared.engine->replicate_group().get()})
          if (g && std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
      std::vector<comm::Counters> c0;
      for (auto* g : groups) c0.push_back(g->counters());
      // Disk traffic of offloaded state (this rank's files).
      auto disk = [&](bool read) {
        std::uint64_t b = 0;
        if (const auto* e = run.prepared.engine.get()) {
          if (const auto* o = e->optimizer_offload()) b += read ? o->bytes_read() : o->bytes_written();
          if (const auto* o = e->param_offload()) b += read ? o->bytes_read() : o->bytes_written();
        }
        return b;
      };
      const std::uint64_t read0 = disk(true), written0 = disk(false);
      sync_device();
      const std::int64_t products0 = mixed_precision::float8_scaled_mm_products();
      auto t0 = Clock::now();
      at::Tensor loss = train_step(run);
      sync_device();
      double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (show_loss && r == 0)
        fmt::print(stderr, "step {:>2} {:<13} {:<4} loss {:.5f}\n", s, run.name, run.prec.name,
                   loss.item<double>() / (run.prec.loss_scale > 0 ? run.prec.loss_scale : 1.0));
      if (s >= warmup) {
        run.scaled_mm_products += mixed_precision::float8_scaled_mm_products() - products0;
        run.moved = 0;  // read before max_over_ranks, whose all_reduce is not the step's
        double waited = 0;
        for (std::size_t g = 0; g < groups.size(); ++g) {
          comm::Counters c1 = groups[g]->counters();
          run.moved += bus_bytes(c0[g], c1, groups[g]->size());
          waited += c1.wait_seconds - c0[g].wait_seconds;
        }
        run.times.push_back(max_over_ranks(*world, t));
        run.disk_read = static_cast<double>(disk(true) - read0);
        run.disk_written = static_cast<double>(disk(false) - written0);
        run.waits.push_back(mean_over_ranks(*world, waited));
      }
    }
  // --profile: --profile-steps more steps of each run under the profiler (benchmarks/step_profile.h); every
  // rank steps, rank 0 records and prints.
  if (!profile_trace.empty()) {
    for (auto& run : runs) {
      std::string trace = profile_trace == "-" ? "" : profile_trace;
      if (!trace.empty() && runs.size() > 1)  // trace.json -> trace.ZERO_3_fp32.json
        trace = files::without_extension(trace) + "." + run.name + "_" + run.prec.name + files::extension(trace);
      world->barrier();
      sync_device();
      std::optional<bench::StepProfile> p;
      if (r == 0) p.emplace(on_cuda);
      const auto t0 = Clock::now();
      for (int k = 0; k < profile_steps; ++k) train_step(run);
      sync_device();
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      if (p) {
        fmt::print(stderr, "{}", p->finish("profile " + run.name + " " + run.prec.name, profile_steps, wall, trace));
        run.busy_share = p->busy_share();
        run.compute_share = p->compute_share();
      }
      world->barrier();
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // MFU: the GPT's training FLOPs per step (benchmarks/mfu.h, all ranks' tokens) over the devices'
  // peak in the step's time. The devices: the GPUs the ranks run on (ranks sharing one count it once),
  // or on the CPU one per rank (--peak_tflops is then a rank's share of the machine).
  std::string device_label = "cpu";
#ifdef STEP_BENCH_DEVICE_MEMORY
  if (on_cuda) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) device_label = prop.name;
  }
#endif
  const int devices = on_cuda ? std::max(1, std::min(world->topology().local_world_size, comm::cuda_device_count())) *
                                    std::max(1, world->topology().num_nodes)
                              : n;
  const double model_flops =
      bench::gpt_train_flops(psi, cfg.layers, seq, cfg.d, static_cast<std::int64_t>(batch) * accumulation * seq * n);
  auto peak_of = [&](const Run& run) {
    return peak_tflops > 0 ? peak_tflops : bench::device_peak_tflops(device_label, run.prec.name).value_or(0.0);
  };
  auto mfu_of = [&](const Run& run, double step_s) {
    const double peak = peak_of(run);
    return peak > 0 && step_s > 0 ? model_flops / step_s / (peak * 1e12 * devices) : -1.0;
  };
  auto share_text = [](double share) { return share >= 0 ? fmt::format("{:.4f}", share) : std::string("null"); };
  // The strategy alone when every run is fp32 (the original lines), else "strategy precision".
  const bool show_prec = precisions.size() > 1 || precisions[0].low();
  auto label = [&](const Run& run) { return show_prec ? run.name + " " + run.prec.name : run.name; };
  if (on_cuda && r == 0)
    fmt::print(stderr, "step_bench: the loss through {}\n",
               loss_path == "composite" || !nn::fused_cross_entropy(at::empty({1}, at::TensorOptions().device(device)))
                   ? "ATen's composite (fp32 logits, log_softmax, nll_loss)"
                   : "accel's fused cross entropy kernels");
  // fp8 on the device: how many of its products cuBLASLt computed (none: every one emulated in fp32, a
  // device or shapes that _scaled_mm refused, which the step time alone would not say).
  for (const auto& run : runs)
    if (run.prec.fp8 && on_cuda && r == 0) {
      const double per_step = static_cast<double>(run.scaled_mm_products) / std::max(1, steps);
      fmt::print(stderr, "step_bench: {}: {:g} fp8 products a step through at::_scaled_mm{}\n", label(run), per_step,
                 per_step == 0 ? " (none: every fp8 product was emulated in fp32)" : "");
    }
  if (runs.size() > 1) {
    double base = median(runs[0].times);
    for (auto& run : runs)
      if (r == 0)
        fmt::print(
            "{} ranks, interleaved: {:<18} median {:>8.1f} ms = {:.3f} x {} (waiting on collectives {:.1f} ms){}\n", n,
            label(run), median(run.times) * 1e3, median(run.times) / base, label(runs[0]), median(run.waits) * 1e3,
            mfu_of(run, median(run.times)) >= 0
                ? fmt::format(", MFU {:.1f}% of {:.0f} TFLOP/s x {}", 100 * mfu_of(run, median(run.times)),
                              peak_of(run), devices)
                : std::string());
    return 0;
  }
  // Which float32 CPU matmuls the engine chose (src/kernels/cpu_gemm.h), and how many went to oneDNN.
  const std::string gemm = cpu_gemm::name(cpu_gemm::installed());
  const auto onednn_products = static_cast<unsigned long long>(cpu_gemm::onednn_calls());
  if (show_loss && r == 0)
    fmt::print(stderr, "cpu gemm {}, {} products through oneDNN on rank 0\n", cpu_gemm::describe(cpu_gemm::installed()),
               onednn_products);
  Run& run = runs[0];
  pss_sampler.stop();
  auto snap = memory::snapshot();
  using memory::Category;
  // Per-rank peaks: the largest over ranks.
  auto peak = [&](std::int64_t b) { return max_over_ranks(*world, static_cast<double>(b)); };
  auto mib = [&](std::int64_t b) { return peak(b) / 1048576.0; };
  const double step_ms = median(run.times) * 1e3, wait_ms = median(run.waits) * 1e3;
  const double rss = max_over_ranks(*world, peak_rss_bytes()), rss0 = max_over_ranks(*world, rss_base),
               rss1 = max_over_ranks(*world, rss_built);
  const double cuda_peak = max_over_ranks(*world, cuda_peak_bytes());  // every rank takes part
  // Offloaded state: bytes in this rank's files and moved in the last step (the largest over ranks).
  double disk_bytes = 0;
  if (const auto* e = run.prepared.engine.get()) {
    if (const auto* o = e->optimizer_offload()) disk_bytes += static_cast<double>(o->bytes());
    if (const auto* o = e->param_offload(); o && !o->in_host_memory()) disk_bytes += static_cast<double>(o->bytes());
  }
  disk_bytes = max_over_ranks(*world, disk_bytes);
  const double disk_read = max_over_ranks(*world, run.disk_read),
               disk_written = max_over_ranks(*world, run.disk_written);
  // Bus bytes of the last measured step, the largest over ranks (accel bench holds it against the
  // ZeRO formula).
  const double moved = max_over_ranks(*world, run.moved);
  // The node's ranks together (one node: the world): the counted peaks summed (node-shared memory is
  // counted once, as each rank's share) and the PSS summed (each shared page split among its mappers).
  const double pss_now = pss_bytes();
  const double pss = max_over_ranks(*world, pss_now), node_pss = sum_over_ranks(*world, pss_now),
               peak_pss = max_over_ranks(*world, pss_sampler.peak()),
               node_counted_peak = sum_over_ranks(*world, static_cast<double>(snap.total.peak)) /
                                   std::max(1, world->topology().num_nodes);
  if (json) {
    double b_total = peak(snap.total.peak), b_param = peak(snap[Category::Parameters].peak),
           b_grad = peak(snap[Category::Gradients].peak), b_opt = peak(snap[Category::OptimizerState].peak),
           b_gath = peak(snap[Category::Gathered].peak), b_act = peak(snap[Category::Activations].peak),
           b_other = peak(snap[Category::Other].peak);
    if (r == 0)
      fmt::print(
          "{{\"strategy\": \"{}\", \"precision\": \"{}\", \"ranks\": {}, \"checkpoint\": {}, \"params\": {}, "
          "\"vocab\": {}, \"d_model\": {}, \"heads\": {}, \"layers\": {}, \"seq\": {}, \"batch\": {}, "
          "\"accumulation\": {}, \"sync_each_batch\": {}, \"grad_accum_dtype\": \"{}\", "
          "\"step_ms\": {:.3f}, \"wait_ms\": {:.3f}, \"wait_share\": {:.3f}, \"peak_rss\": {:.0f}, \"rss_base\": "
          "{:.0f}, \"rss_built\": {:.0f}, \"counted_peak\": "
          "{:.0f}, "
          "\"parameters\": {:.0f}, \"gradients\": {:.0f}, \"optimizer\": {:.0f}, \"gathered\": {:.0f}, "
          "\"activations\": {:.0f}, \"other\": {:.0f}, \"device\": \"{}\", \"cuda_peak\": {:.0f}, \"disk_bytes\": "
          "{:.0f}, "
          "\"disk_read\": {:.0f}, \"disk_written\": {:.0f}, \"moved\": {:.0f}, \"nodes\": {}, \"ranks_per_node\": "
          "{}, \"cpu_gemm\": \"{}\", \"onednn_products\": {}, \"node_shared_bytes\": {}, "
          "\"node_shared_grad_bytes\": {}, \"pss\": {:.0f}, \"peak_pss\": {:.0f}, \"node_pss\": {:.0f}, "
          "\"node_counted_peak\": {:.0f}, \"model_flops\": {:.6e}, \"devices\": {}, \"device_name\": \"{}\", "
          "\"peak_tflops\": {}, \"mfu\": {}, \"device_busy_share\": {}, \"device_compute_share\": {}, "
          "\"scaled_mm_products_per_step\": {:g}}}\n",
          run.name, run.prec.name, n, checkpoint ? "true" : "false", psi, cfg.vocab, cfg.d, cfg.heads, cfg.layers, seq,
          batch, accumulation, reduces_each(run) ? "true" : "false", grad_accum_dtype, step_ms, wait_ms,
          step_ms > 0 ? wait_ms / step_ms : 0.0, rss, rss0, rss1, b_total, b_param, b_grad, b_opt, b_gath, b_act,
          b_other, device_name, cuda_peak, disk_bytes, disk_read, disk_written, moved, world->topology().num_nodes,
          world->topology().local_world_size, gemm, onednn_products,
          run.prepared.engine ? run.prepared.engine->node_shared_bytes() : 0,
          run.prepared.engine ? run.prepared.engine->node_shared_grad_bytes() : 0, pss, peak_pss, node_pss,
          node_counted_peak, model_flops, devices, device_label,
          peak_of(run) > 0 ? fmt::format("{:.1f}", peak_of(run)) : std::string("null"),
          mfu_of(run, step_ms / 1e3) >= 0 ? fmt::format("{:.5f}", mfu_of(run, step_ms / 1e3)) : std::string("null"),
          share_text(run.busy_share), share_text(run.compute_share),
          static_cast<double>(run.scaled_mm_products) / std::max(1, steps));
    return 0;
  }
  // On CUDA: the device's peak (the category columns count host memory only).
  double p_total = on_cuda ? cuda_peak / 1048576.0 : mib(snap.total.peak),
         p_param = mib(snap[Category::Parameters].peak), p_grad = mib(snap[Category::Gradients].peak),
         p_opt = mib(snap[Category::OptimizerState].peak), p_gath = mib(snap[Category::Gathered].peak),
         p_act = mib(snap[Category::Activations].peak);
  if (r == 0)
    fmt::print(
        "| {:<13} | {:<9} | {} | {:>8.1f} | {:>8.1f} | {:>8.1f} | {:>7.1f} | {:>7.1f} | {:>7.1f} | {:>7.1f} | {:>7.1f} "
        "| {:>7.2f} | {:>6.2f} | {:>7.1f} | {:>7.1f} | {:>7.1f} |\n",
        run.name + (checkpoint ? "+ckpt" : ""), run.prec.name, n, step_ms, p_total,
        on_cuda ? 0.0 : node_counted_peak / 1048576.0, p_param, p_grad, p_opt, p_gath, p_act, run.moved / 1048576.0,
        n > 1 ? run.moved / (psi * 4.0 * (n - 1) / n) : 0.0, rss / 1048576.0, pss / 1048576.0, wait_ms);
  if (r == 0 && mfu_of(run, step_ms / 1e3) >= 0)
    fmt::print(
        "model FLOPs per step {:.3g} (6 x {} params + attention, {} tokens); MFU {:.1f}% of {:.1f} TFLOP/s x {} "
        "device(s) ({})\n",
        model_flops, psi, static_cast<std::int64_t>(batch) * accumulation * seq * n, 100 * mfu_of(run, step_ms / 1e3),
        peak_of(run), devices, device_label);
  if (r == 0 && disk_bytes > 0)
    fmt::print("offloaded: {:.2f} GB in files per rank; last step read {:.2f} GB, wrote {:.2f} GB per rank\n",
               disk_bytes / 1e9, disk_read / 1e9, disk_written / 1e9);
  return 0;
}

int main(int argc, char** argv) {
  check_args::started(argc, argv);
  try {
    return run_bench(argc, argv);
  } catch (const c10::OutOfMemoryError& e) {  // (--device_memory: a model over the cap; its first line says so)
    const std::string what = e.what();
    fmt::print(stderr, "step_bench: out of memory on the device: {}\n", what.substr(0, what.find('\n')));
    return 3;
  }
}
