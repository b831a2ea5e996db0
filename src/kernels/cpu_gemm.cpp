#include "kernels/cpu_gemm.h"

#include "base/env.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>

namespace accel::cpu_gemm {
namespace {

// mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
// computes X @ W^T + B with oneDNN's matmul, on strided (dense) tensors as they lie.
using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   std::string_view, c10::List<std::optional<c10::Scalar>>,
                                   std::optional<std::string_view>);

const c10::TypedOperatorHandle<LinearPointwise>* linear_op() {
  static const std::optional<c10::TypedOperatorHandle<LinearPointwise>> op =
      []() -> std::optional<c10::TypedOperatorHandle<LinearPointwise>> {
#if defined(__x86_64__)
    if (!at::hasMKLDNN()) return std::nullopt;
    auto h = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!h || !h->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return std::nullopt;
    return h->typed<LinearPointwise>();
#else
    return std::nullopt;
#endif
  }();
  return op ? &*op : nullptr;
}

std::atomic<std::uint64_t> g_calls{0};

// Row- or column-major with a leading dimension oneDNN takes (no broadcast or doubly strided views).
bool plain_2d(const at::Tensor& t) {
  const auto r = t.size(0), c = t.size(1), s0 = t.stride(0), s1 = t.stride(1);
  return (s1 == 1 && s0 >= std::max<std::int64_t>(c, 1)) || (s0 == 1 && s1 >= std::max<std::int64_t>(r, 1));
}

bool plain_f32(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.layout() == at::kStrided && t.device().is_cpu() && !t.is_neg() &&
         !t.is_conj();
}

// a @ b goes to oneDNN (anything else, including every shape error, to libtorch's kernel).
bool eligible(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || !plain_f32(a) || !plain_f32(b)) return false;
  const auto M = a.size(0), K = a.size(1), N = b.size(1);
  if (b.size(0) != K || M == 0 || N == 0 || K == 0 || M * N * K < kMinWork) return false;
  return plain_2d(a) && plain_2d(b);
}

at::Tensor onednn_product(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return linear_op()->call(a, b.t(), bias, "none", c10::List<std::optional<c10::Scalar>>(), std::nullopt);
}

at::Tensor mm_kernel(const at::Tensor& a, const at::Tensor& b) {
  if (!eligible(a, b)) return at::cpu::mm(a, b);
  return onednn_product(a, b, std::nullopt);
}

at::Tensor addmm_kernel(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha) {
  // nn::Linear's form: a bias vector added to every row, beta = alpha = 1.
  if (eligible(a, b) && self.dim() == 1 && self.size(0) == b.size(1) && plain_f32(self) && self.is_contiguous() &&
      beta.equal(1) && alpha.equal(1))
    return onednn_product(a, b, self);
  return at::cpu::addmm(self, a, b, beta, alpha);
}

std::mutex g_mu;
std::unique_ptr<torch::Library> g_lib;  // held while Path::onednn is in force; guarded by g_mu

#if defined(__x86_64__)
bool cpu_has_avx512f() { return __builtin_cpu_supports("avx512f"); }
bool cpu_is_intel() { return __builtin_cpu_is("intel"); }
#else
bool cpu_has_avx512f() { return false; }
bool cpu_is_intel() { return false; }
#endif

}  // namespace

bool onednn_available() { return linear_op() != nullptr; }

bool onednn_beneficial() { return onednn_available() && cpu_has_avx512f() && !cpu_is_intel(); }

Path from_env() {
  const std::string v = env::get("ACCEL_CPU_GEMM");
  if (v == "auto") return onednn_beneficial() ? Path::onednn : Path::libtorch;
  if (v == "onednn") return onednn_available() ? Path::onednn : Path::libtorch;
  if (v == "libtorch") return Path::libtorch;
  throw std::invalid_argument("ACCEL_CPU_GEMM=" + v + ": expected auto, onednn or libtorch");
}

Path install(Path p) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (p == Path::onednn && onednn_available()) {
    if (!g_lib) {
      // Registering over libtorch's own CPU kernels makes the dispatcher warn once per operator;
      // that replacement is the point here, so the warnings are swallowed.
      struct Quiet : c10::WarningHandler {
        void process(const c10::Warning&) override {}
      } quiet;
      c10::WarningUtils::WarningHandlerGuard guard(&quiet);
      auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__,
                                                  __LINE__);
      lib->impl("mm", TORCH_FN(mm_kernel));
      lib->impl("addmm", TORCH_FN(addmm_kernel));
      g_lib = std::move(lib);
    }
  } else {
    g_lib.reset();  // deregistering brings libtorch's kernels back
  }
  return g_lib ? Path::onednn : Path::libtorch;
}

Path install_from_env() { return install(from_env()); }

Path installed() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_lib ? Path::onednn : Path::libtorch;
}

const char* name(Path p) { return p == Path::onednn ? "onednn" : "libtorch"; }

std::string describe(Path p) {
  std::string s = std::string(name(p)) + " (ACCEL_CPU_GEMM=" + env::get("ACCEL_CPU_GEMM") + "; ";
  if (!onednn_available())
    s += "oneDNN's matmul is not in this libtorch";
  else if (onednn_beneficial())
    s += "AVX-512 on a non-Intel CPU: MKL's sgemm would run its AVX2 kernels";
  else if (cpu_is_intel())
    s += "an Intel CPU: MKL's sgemm uses its best kernels";
  else
    s += "no AVX-512: oneDNN and MKL use the same instructions";
  return s + ")";
}

std::uint64_t onednn_calls() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace accel::cpu_gemm
