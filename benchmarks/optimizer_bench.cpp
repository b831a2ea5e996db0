// optimizer_bench — the CPU optimizer step on flat fp32 parameters (issue 16's "Done when"):
//   1. memory bandwidth at --threads: a copy and an in-place axpy (y += a * x), the bounds a step that
//      streams its bytes once can approach;
//   2. fused vs torch: accel::optim::fused_step against the same optimizer's own torch::optim step on
//      --params parameters (two copies, one gradient shared), alternating, --reps steps each after a
//      warm-up step that creates the state; prints the median ms per step of each, the ratio, and the
//      fused step's bandwidth over the bytes it must move (AdamW/Adam: p, g, m, v read and p, m, v
//      written = 28 bytes per parameter; SGD with momentum 20) against the axpy bandwidth.
//   3. with --offload DIR: the step with its state on disk (zero::OptimizerOffload, AdamW: master and
//      two moments, 12 bytes per parameter, in --sub-group-size chunks through 4 buffers) against the
//      disk's own sequential bandwidth measured first under DIR (offload::measure_disk over the
//      file's bytes): bound = bytes read / read GB/s + bytes written / write GB/s; prints the ratio.
//   build/bin/optimizer_bench --offload /var/tmp --params 100000000
// `--json` prints one JSON line with every figure instead of the text.
//
//   build/bin/optimizer_bench                                   # AdamW, 100M parameters, 2 threads
//   build/bin/optimizer_bench --optimizer sgd --params 20000000 --threads 1 --reps 3
//   build/bin/optimizer_bench --zero-fraction 0.5      # half the gradient zero, as unused embedding rows
#include "offload/async_file.h"
#include "optim/fused_step.h"
#include "zero/optimizer_offload.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/core.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Options {
  std::int64_t params = 100'000'000;
  int threads = 2;
  int reps = 5;
  std::string optimizer = "adamw";
  double zero_fraction = 0;
  bool json = false;
};

// Section 1: the memory bandwidth of two simple streams over n floats, split across the threads as
// the fused step splits its work (at::parallel_for), bytes per second, the best of 5:
//   copy  memcpy (read n, write n floats: 8 bytes per element counted);
//   axpy  y += a * x in place (read 2, write 1: 12 bytes). Every line the optimizer writes it has
//         read first, as axpy does, so axpy is the closer bound (a copy also pays for reading the
//         destination lines it writes, which it does not count).
struct Bandwidth {
  double copy_bps = 0, axpy_bps = 0;
};

Bandwidth memory_bandwidth(std::int64_t n) {
  at::Tensor xt = at::rand({n}), yt = at::zeros({n});
  const float* x = xt.const_data_ptr<float>();
  float* y = yt.data_ptr<float>();
  auto best_of = [](const std::function<void()>& f) {
    f();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) best = std::min(best, seconds_of(f));
    return best;
  };
  const double copy_s = best_of([&] {
    at::parallel_for(0, n, 32768, [&](std::int64_t b, std::int64_t e) {
      std::memcpy(y + b, x + b, static_cast<std::size_t>(e - b) * sizeof(float));
    });
  });
  const double axpy_s = best_of([&] {
    at::parallel_for(0, n, 32768, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) y[i] += 1e-3f * x[i];
    });
  });
  const double elems = static_cast<double>(n);
  return {8.0 * elems / copy_s, 12.0 * elems / axpy_s};
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<at::Tensor> params) {
  if (name == "adamw") return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
  if (name == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3).weight_decay(0.01));
  if (name == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-2).momentum(0.9));
  throw std::invalid_argument("--optimizer: adamw, adam or sgd, not " + name);
}

// Bytes a step must move per parameter (read + write, once each).
double bytes_per_param(const std::string& name) { return name == "sgd" ? 20.0 : 28.0; }

struct FusedVsTorch {
  double fused_s = 0, torch_s = 0;
};

// Section 2: the fused step and torch's, alternating on two copies of the same parameters.
FusedVsTorch fused_vs_torch(const Options& o) {
  at::Tensor grad = at::randn({o.params});
  // An embedding's unused rows: zero at every step (so are their second moments, under AdamW).
  grad.narrow(0, 0, static_cast<std::int64_t>(o.zero_fraction * static_cast<double>(o.params))).zero_();
  at::Tensor p_fused = at::randn({o.params}).set_requires_grad(true);
  at::Tensor p_torch = p_fused.detach().clone().set_requires_grad(true);
  p_fused.mutable_grad() = grad;
  p_torch.mutable_grad() = grad;
  auto fused = make_optimizer(o.optimizer, {p_fused});
  auto reference = make_optimizer(o.optimizer, {p_torch});
  // Warm-up: creates the state (zeros, or SGD's momentum buffer) outside the timed steps.
  if (!accel::optim::fused_step(*fused)) throw std::runtime_error("fused_step refused the optimizer");
  reference->step();
  std::vector<double> tf, tt;
  for (int r = 0; r < o.reps; ++r) {
    tt.push_back(seconds_of([&] { reference->step(); }));
    tf.push_back(seconds_of([&] { accel::optim::fused_step(*fused); }));
  }
  // Same inputs, same number of steps: the two copies agree (a benchmark of a wrong step is no figure).
  if (!torch::equal(p_fused, p_torch)) throw std::runtime_error("fused and torch parameters differ after the steps");
  return {median(tf), median(tt)};
}

// Section 3: the offloaded AdamW step against the disk.
struct OffloadResult {
  double step_s = 0, bound_s = 0, read_gbps = 0, write_gbps = 0;
  std::uint64_t bytes = 0, read = 0, written = 0;
  bool direct = true;
};
OffloadResult offloaded_step(const std::string& dir, std::int64_t params, std::int64_t sub_group, int reps) {
  accel::zero::OffloadSpec spec;
  spec.optimizer = accel::zero::OffloadDevice::Nvme;
  spec.optimizer_nvme_path = dir;
  spec.sub_group_size = sub_group;
  accel::zero::OffloadRule rule;
  rule.adam = {1e-3, 0.9, 0.999, 1e-8, 0.01, false, true};
  OffloadResult out;
  out.bytes = accel::zero::OptimizerOffload::file_bytes(spec, {{params, rule}});
  const accel::offload::DiskBandwidth disk = accel::offload::measure_disk(dir, out.bytes);
  out.read_gbps = disk.read_gbps, out.write_gbps = disk.write_gbps, out.direct = disk.direct;
  accel::zero::OptimizerOffload opt(spec, 0, {{params, rule}});
  at::manual_seed(0);
  opt.init(0, at::randn({params}));
  at::Tensor grad = at::randn({params});
  at::Tensor compute = at::empty({params});
  auto updated = [&](std::size_t, std::int64_t begin, const at::Tensor& v) {
    compute.narrow(0, begin, v.numel()).copy_(v);
  };
  opt.step({grad}, {rule}, updated);  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const std::uint64_t r0 = opt.bytes_read(), w0 = opt.bytes_written();
    auto t0 = std::chrono::steady_clock::now();
    opt.step({grad}, {rule}, updated);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    out.read = opt.bytes_read() - r0, out.written = opt.bytes_written() - w0;
  }
  std::sort(t.begin(), t.end());
  out.step_s = t[t.size() / 2];
  out.bound_s = out.read / (out.read_gbps * 1e9) + out.written / (out.write_gbps * 1e9);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"The CPU optimizer step: fused (accel::optim) against torch::optim on flat fp32 parameters"};
  app.add_option("--params", o.params, "parameters (fp32) in the one flat tensor")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "at::set_num_threads")->check(CLI::PositiveNumber);
  app.add_option("--reps", o.reps, "timed steps of each (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", o.optimizer, "adamw (default), adam (with weight decay) or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adamw", "adam", "sgd"}));
  app.add_option("--zero-fraction", o.zero_fraction,
                 "fraction of the gradient that is zero at every step (its first elements, as an embedding's "
                 "unused rows)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--json", o.json, "print one JSON line instead of the text");
  std::string offload_dir;
  std::int64_t sub_group = 10'000'000;
  app.add_option("--offload", offload_dir, "DIR: also time the AdamW step with its state in a file under DIR");
  app.add_option("--sub-group-size", sub_group, "elements per sub-group of the offloaded step")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(o.threads);

  // Section 1.
  const Bandwidth bw = memory_bandwidth(o.params);

  // Section 2.
  const FusedVsTorch r = fused_vs_torch(o);
  const double bytes = bytes_per_param(o.optimizer) * static_cast<double>(o.params);
  const double fused_bps = bytes / r.fused_s;

  // Section 3.
  OffloadResult off;
  if (!offload_dir.empty()) off = offloaded_step(offload_dir, o.params, sub_group, o.reps);

  if (o.json) {
    fmt::print(
        "{{\"optimizer\":\"{}\",\"params\":{},\"zero_fraction\":{},\"threads\":{},\"reps\":{},\"copy_gbps\":{:.3f},"
        "\"axpy_gbps\":{:.3f},\"fused_ms\":{:.3f},\"torch_ms\":{:.3f},\"speedup\":{:.3f},"
        "\"fused_gbps\":{:.3f},\"fused_share_of_axpy\":{:.3f},\"offload_step_ms\":{:.1f},\"offload_bound_ms\":{:.1f},"
        "\"disk_read_gbps\":{:.3f},\"disk_write_gbps\":{:.3f}}}\n",
        o.optimizer, o.params, o.zero_fraction, o.threads, o.reps, bw.copy_bps / 1e9, bw.axpy_bps / 1e9,
        r.fused_s * 1e3, r.torch_s * 1e3, r.torch_s / r.fused_s, fused_bps / 1e9, fused_bps / bw.axpy_bps,
        off.step_s * 1e3, off.bound_s * 1e3, off.read_gbps, off.write_gbps);
    return 0;
  }
  fmt::print("optimizer_bench: {} on {} fp32 parameters{}, {} threads, median of {} steps\n", o.optimizer, o.params,
             o.zero_fraction > 0 ? fmt::format(" ({:.0f}% of the gradient zero)", 100 * o.zero_fraction) : "",
             o.threads, o.reps);
  fmt::print("  memory bandwidth      {:8.2f} GB/s copy, {:.2f} GB/s axpy (y += a * x)\n", bw.copy_bps / 1e9,
             bw.axpy_bps / 1e9);
  fmt::print("  torch::optim step     {:8.1f} ms\n", r.torch_s * 1e3);
  fmt::print("  fused step            {:8.1f} ms   {:.2f}x faster, {:.2f} GB/s ({:.0f} B/param, {:.0f}% of axpy)\n",
             r.fused_s * 1e3, r.torch_s / r.fused_s, fused_bps / 1e9, bytes_per_param(o.optimizer),
             100 * fused_bps / bw.axpy_bps);
  if (!offload_dir.empty()) {
    fmt::print("  disk under {}  {:.2f} GB/s read, {:.2f} GB/s write ({}, {:.2f} GB file)\n", offload_dir,
               off.read_gbps, off.write_gbps, off.direct ? "O_DIRECT" : "buffered", off.bytes / 1e9);
    fmt::print(
        "  offloaded AdamW step  {:8.1f} ms   reads {:.2f} GB, writes {:.2f} GB; the disk's bound {:.1f} ms: "
        "{:.2f}x the bound\n",
        off.step_s * 1e3, off.read / 1e9, off.written / 1e9, off.bound_s * 1e3, off.step_s / off.bound_s);
  }
  return 0;
}
