// gemm_bench — the float32 products of step_bench's GPT through libtorch's CPU kernel (MKL's sgemm)
// and through accel's oneDNN path (src/kernels/cpu_gemm.h), at --threads: for each linear layer of a
// block (qkv, proj, fc1, fc2) and the tied head, the forward (x W^T), input-gradient (g W) and
// weight-gradient (g^T x) products on --tokens rows, timed on both paths (median of --reps, after a
// warm-up), with GFLOP/s, the ratio, and the sum over one step's products (the layers'
// products times --layers, plus the head's). Each product alternates between the paths, --reps times.
//   build/bin/gemm_bench                      # step_bench's default GPT: 256 tokens, d 384, vocab 4096
//   build/bin/gemm_bench --threads 2 --tokens 512
#include "kernels/cpu_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace cg = accel::cpu_gemm;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Median seconds of a @ b on libtorch's path and on oneDNN's, alternating product by product (a
// path switch is an atomic store once the kernels are registered).
std::pair<double, double> time_both(const at::Tensor& a, const at::Tensor& b, int reps) {
  std::vector<double> t[2];
  const cg::Path paths[2] = {cg::Path::libtorch, cg::Path::onednn};
  for (cg::Path p : paths) cg::install(p), at::mm(a, b);  // warm-up (oneDNN: creates the primitive)
  for (int i = 0; i < reps; ++i)
    for (int k = 0; k < 2; ++k) {
      cg::install(paths[k]);
      const auto t0 = Clock::now();
      at::Tensor y = at::mm(a, b);
      t[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  return {median(t[0]), median(t[1])};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gemm_bench: float32 CPU products, libtorch's kernel against oneDNN's"};
  int threads = 1, reps = 15, layers = 10;
  std::int64_t tokens = 256, d = 384, vocab = 4096;
  app.add_option("--threads", threads, "intra-op threads")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed products per path and shape")->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "rows (batch x sequence)")->check(CLI::PositiveNumber);
  app.add_option("--d-model", d, "width")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "vocabulary (the tied head's width)")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "blocks (for the per-step sum)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (!cg::onednn_available()) {
    fmt::print(stderr, "gemm_bench: oneDNN's matmul is not in this libtorch\n");
    return 2;
  }
  at::set_num_threads(threads);
  at::manual_seed(0);
  fmt::print("{} thread(s); ACCEL_CPU_GEMM=auto here would pick: {}\n", threads,
             cg::describe(cg::onednn_beneficial() ? cg::Path::onednn : cg::Path::libtorch));
  fmt::print("| layer | in x out | product | libtorch GFLOP/s | oneDNN GFLOP/s | oneDNN / libtorch time |\n");
  fmt::print("|---|---|---|---:|---:|---:|\n");
  struct Layer {
    const char* name;
    std::int64_t in, out, times;
  };
  const std::vector<Layer> all = {{"qkv", d, 3 * d, layers},
                                  {"proj", d, d, layers},
                                  {"fc1", d, 4 * d, layers},
                                  {"fc2", 4 * d, d, layers},
                                  {"head", d, vocab, 1}};
  double step_lib = 0, step_dnn = 0;
  for (const Layer& l : all) {
    at::Tensor x = at::randn({tokens, l.in}), w = at::randn({l.out, l.in}), g = at::randn({tokens, l.out});
    struct Product {
      const char* what;
      at::Tensor a, b;
    };
    for (const Product& p : {Product{"x W^T", x, w.t()}, Product{"g W", g, w}, Product{"g^T x", g.t(), x}}) {
      const double flop = 2.0 * p.a.size(0) * p.a.size(1) * p.b.size(1);
      const auto [lib, dnn] = time_both(p.a, p.b, reps);
      step_lib += lib * static_cast<double>(l.times);
      step_dnn += dnn * static_cast<double>(l.times);
      fmt::print("| {} | {} x {} | {} | {:.1f} | {:.1f} | {:.2f} |\n", l.name, l.in, l.out, p.what, flop / lib / 1e9,
                 flop / dnn / 1e9, dnn / lib);
    }
  }
  cg::install(cg::Path::libtorch);
  fmt::print("one step's products ({} blocks and the head, forward and backward): libtorch {:.1f} ms, oneDNN {:.1f} ms "
             "({:.2f}x)\n",
             layers, step_lib * 1e3, step_dnn * 1e3, step_dnn / step_lib);
  return 0;
}
