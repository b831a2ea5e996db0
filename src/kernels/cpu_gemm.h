// accel::cpu_gemm — float32 matrix products on the CPU through oneDNN instead of libtorch's BLAS.
//
// libtorch's CPU mm/addmm call MKL's sgemm, and MKL takes its AVX-512 kernels only on Intel CPUs: on
// an AMD CPU with AVX-512 (Zen 4, Zen 5) it runs its AVX2 kernels, about half the machine's float32
// rate. oneDNN, which libtorch carries too, uses AVX-512 there (benchmarks/gemm_bench: 2.2x on the
// GPT's shapes on a Zen 5 core). install(Path::onednn) registers accel's own CPU kernels for aten::mm
// and aten::addmm with the dispatcher; they send float32 products of at least kMinWork multiply-adds
// (no dimension under 16, the right operand dense) to oneDNN (mkldnn::_linear_pointwise), only while
// libtorch's oneDNN float32 precision is strict (the default: no bf16/tf32 down-conversion) and
// oneDNN is enabled, and everything else to libtorch's own kernel. Autograd sits above the CPU key, so forward and backward
// of nn::Linear, matmul and the tied head all take it. Results differ from sgemm's by rounding only
// (another summation order), and are deterministic for a given shape, layout and thread count.
//
// Process-wide. The engine installs what ACCEL_CPU_GEMM asks for when it is built (auto: oneDNN
// exactly where MKL would not use AVX-512), so every strategy, and the Accelerator, computes with it;
// plain libtorch code in a process that never builds an engine is untouched.
//
// Layering: below zero/ (the engine installs it); depends on ATen and base/env only.
#pragma once

#include <cstdint>
#include <string>

namespace accel::cpu_gemm {

enum class Path { libtorch, onednn };

// Products smaller than this (M*N*K) stay on libtorch's kernel: oneDNN's call costs ~10 us more.
constexpr std::int64_t kMinWork = std::int64_t{1} << 20;

// oneDNN's matmul is reachable in this libtorch (built with MKLDNN), and this is x86-64.
bool onednn_available();
// auto's rule: oneDNN is available, the CPU has AVX-512F, and it is not an Intel CPU (where MKL
// itself uses AVX-512).
bool onednn_beneficial();

// ACCEL_CPU_GEMM: "auto" (default: onednn_beneficial()), "onednn" (Path::onednn where available, else
// libtorch) or "libtorch". Throws std::invalid_argument naming the variable for any other value.
Path from_env();

// Routes the process's float32 CPU mm/addmm to oneDNN (Path::onednn) or to libtorch's own kernels
// (Path::libtorch). The first onednn registers accel's kernels with the dispatcher, once and for good;
// after that a path is an atomic switch those kernels read, so install may be called from any thread
// at any time. Until the first onednn nothing is registered at all. onednn where
// !onednn_available() stays libtorch. Returns the path now in force.
Path install(Path p);
// install(from_env()).
Path install_from_env();
Path installed();
const char* name(Path p);
// One line for `accel env` and logs: the path p, ACCEL_CPU_GEMM, and why auto picks what it picks here.
std::string describe(Path p);

// Products computed by oneDNN since the process started (tests and benchmarks).
std::uint64_t onednn_calls();

}  // namespace accel::cpu_gemm
