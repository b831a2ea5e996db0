#include "kernels/cpu_gemm.h"
#include "base/error.h"

#include "base/env.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>

namespace accel::cpu_gemm {
namespace {

// mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
// computes X @ W^T + B with oneDNN (its matmul or inner-product primitives): W as it lies (strided),
// X made contiguous first.
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

// The path the registered kernels take. They are registered once, at the first install(onednn), and
// never removed (changing a dispatcher slot races with calls reading it); Path::libtorch afterwards
// makes them call libtorch's own kernels.
std::atomic<Path> g_path{Path::libtorch};
std::atomic<std::uint64_t> g_calls{0};

bool plain_f32(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.layout() == at::kStrided && t.device().is_cpu() && !t.is_neg() &&
         !t.is_conj() && !t.has_names();
}

// a @ b goes to oneDNN (anything else, including every shape error, to libtorch's kernel).
bool eligible(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || !plain_f32(a) || !plain_f32(b)) return false;
  const std::int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  // Skinny products (a dimension under 16) are no faster there, or slower.
  if (b.size(0) != K || std::min({M, N, K}) < 16) return false;
  // b becomes oneDNN's weight as it lies: only dense row- or column-major (a padded leading
  // dimension or a strided vector sends oneDNN to its reference kernel, ~1000x slower). a is copied
  // when not contiguous: row- or column-major with any leading dimension (a transposed gradient, a
  // slice of a wider activation).
  if (!b.is_contiguous() && !b.t().is_contiguous()) return false;
  const std::int64_t s0 = a.stride(0), s1 = a.stride(1);
  if (!(s1 == 1 && s0 >= K) && !(s0 == 1 && s1 >= M)) return false;
  std::int64_t mk = 0, work = 0;
  const bool huge = __builtin_mul_overflow(M, K, &mk) || __builtin_mul_overflow(mk, N, &work);
  if (!huge && work < kMinWork) return false;
  // libtorch's own switches for oneDNN: off when the user turned oneDNN off, and strict float32 only
  // (NONE is the default, IEEE; TF32/BF16 would let oneDNN round the operands down).
  const auto& ctx = at::globalContext();
  const auto prec = ctx.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  return ctx.userEnabledMkldnn() && (prec == at::Float32Precision::NONE || prec == at::Float32Precision::IEEE);
}

bool onednn_on() { return g_path.load(std::memory_order_relaxed) == Path::onednn; }

at::Tensor onednn_product(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return linear_op()->redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), a, b.t(), bias, "none",
                                 c10::List<std::optional<c10::Scalar>>(), std::nullopt);
}

at::Tensor mm_kernel(const at::Tensor& a, const at::Tensor& b) {
  if (!onednn_on() || !eligible(a, b)) return at::cpu::mm(a, b);
  return onednn_product(a, b, std::nullopt);
}

at::Tensor addmm_kernel(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha) {
  // nn::Linear's form: a bias vector added to every row, beta = alpha = 1.
  if (onednn_on() && eligible(a, b) && self.dim() == 1 && self.size(0) == b.size(1) && plain_f32(self) &&
      self.is_contiguous() && beta.equal(1) && alpha.equal(1))
    return onednn_product(a, b, self);
  return at::cpu::addmm(self, a, b, beta, alpha);
}

std::once_flag g_registered;
torch::Library* g_lib = nullptr;  // set once, never freed (a global keeps it reachable for leak checkers)

void register_kernels() {
  // Registering over libtorch's own CPU kernels makes the dispatcher warn once per operator; that
  // replacement is the point here, so the warnings are swallowed. The library is never destroyed (not
  // even at exit, when other threads may still run matmuls).
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  g_lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
  g_lib->impl("mm", TORCH_FN(mm_kernel));
  g_lib->impl("addmm", TORCH_FN(addmm_kernel));
}

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
  throw accel::InvalidArgumentError("ACCEL_CPU_GEMM=" + v + ": expected auto, onednn or libtorch");
}

Path install(Path p) {
  if (p == Path::onednn && onednn_available()) {
    std::call_once(g_registered, register_kernels);
    g_path.store(Path::onednn);
  } else {
    g_path.store(Path::libtorch);
  }
  return installed();
}

Path install_from_env() { return install(from_env()); }

Path installed() { return g_path.load(); }

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
