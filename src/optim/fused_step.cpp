// The fused CPU optimizer step (fused_step.h): torch::optim's scalar arithmetic (bias corrections,
// step sizes, in double) done once per tensor here, the per-element work in the kernel of the
// instruction set ATen dispatches to (fused_kernels.cpp), split across threads with at::parallel_for.
#include "optim/fused_step.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>
#include <typeinfo>

#include "optim/fused_kernels.h"
#include "optim/multi_tensor_step.h"
#include "optim/torch_state.h"

// MKL's C functions used here (mkl_vml_functions.h, mkl_service.h), exported by a libtorch_cpu built
// with MKL; weak, so that a libtorch without them links and leaves them null.
extern "C" void vmsSqrt(int n, const float* a, float* r, long long mode) __attribute__((weak));
extern "C" int MKL_Set_Num_Threads_Local(int nt) __attribute__((weak));

namespace accel::optim {
namespace {

// Elements per task: large enough that a task's work dwarfs its scheduling, small enough that two
// threads share a tensor of a few hundred thousand elements. A multiple of every vector width.
constexpr std::int64_t kGrain = 32768;

enum class Isa { Default, Avx2, Avx512 };

// The instruction set of ATen's own CPU kernels (ATEN_CPU_CAPABILITY and the CPU decide it), clamped
// to the kernels this build has: FMA is used exactly where ATen uses it.
Isa kernel_isa() {
  static const Isa isa = [] {
    const std::string cap = at::get_cpu_capability();
#if defined(ACCEL_OPTIM_HAVE_AVX512)
    if (cap == "AVX512") return Isa::Avx512;
#endif
#if defined(ACCEL_OPTIM_HAVE_AVX2)
    if (cap == "AVX512" || cap == "AVX2") return Isa::Avx2;
#endif
    return Isa::Default;
  }();
  return isa;
}

// The kernels of kernel_isa().
struct Kernels {
  decltype(&detail::isa_default::adam_moments) adam_moments;
  decltype(&detail::isa_default::adam_params) adam_params;
  decltype(&detail::isa_default::sqrt) sqrt;
  decltype(&detail::isa_default::ones_for_zeros) ones_for_zeros;
  decltype(&detail::isa_default::zeros_for_zeros) zeros_for_zeros;
  decltype(&detail::isa_default::sgd) sgd;
};

const Kernels& kernels() {
  static const Kernels k = []() -> Kernels {
    switch (kernel_isa()) {
#if defined(ACCEL_OPTIM_HAVE_AVX512)
      case Isa::Avx512:
        return {detail::isa_avx512::adam_moments,   detail::isa_avx512::adam_params,     detail::isa_avx512::sqrt,
                detail::isa_avx512::ones_for_zeros, detail::isa_avx512::zeros_for_zeros, detail::isa_avx512::sgd};
#endif
#if defined(ACCEL_OPTIM_HAVE_AVX2)
      case Isa::Avx2:
        return {detail::isa_avx2::adam_moments,   detail::isa_avx2::adam_params,     detail::isa_avx2::sqrt,
                detail::isa_avx2::ones_for_zeros, detail::isa_avx2::zeros_for_zeros, detail::isa_avx2::sgd};
#endif
      default:
        return {detail::isa_default::adam_moments,   detail::isa_default::adam_params,     detail::isa_default::sqrt,
                detail::isa_default::ones_for_zeros, detail::isa_default::zeros_for_zeros, detail::isa_default::sgd};
    }
  }();
  return k;
}

// The square root, as ATen's float sqrt kernel takes it. Built with MKL, ATen calls MKL's vmsSqrt in
// its high-accuracy mode (ATen/cpu/vml.h), which is not always correctly rounded (about 1 element in
// 6 differs by an ulp from the instruction's result on this machine), so the step calls the same
// function with the same mode, found in libtorch_cpu at load time (weak: a libtorch without MKL
// leaves it null). Without MKL, ATen takes Vectorized's sqrt: the kernels' own.
using SqrtFn = void (*)(const float* in, float* out, std::int64_t n);

void mkl_sqrt(const float* in, float* out, std::int64_t n) {
  // mkl_vml_defines.h: VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE, the mode ATen passes.
  constexpr long long kMode = 0x00000002 | 0x00140000 | 0x00000100;
  vmsSqrt(static_cast<int>(n), in, out, kMode);
}

// ATen's own sqrt on the block (for a libtorch built with MKL that does not export vmsSqrt): the
// same function as torch's step calls, whatever it is, at the price of an operator call per block.
void aten_sqrt(const float* in, float* out, std::int64_t n) {
  at::Tensor src = at::from_blob(const_cast<float*>(in), {n}, at::kFloat);
  at::Tensor dst = at::from_blob(out, {n}, at::kFloat);
  at::sqrt_out(dst, src);
}

SqrtFn sqrt_fn() {
  static const SqrtFn fn = []() -> SqrtFn {
    if (!at::hasMKL()) return kernels().sqrt;
    return vmsSqrt != nullptr ? mkl_sqrt : aten_sqrt;
  }();
  return fn;
}

// Elements per block of the Adam step: its moments, their square root and the parameter update go
// through one block at a time, so the block (p, g, m, v, vmax and the roots: 6 x 2 KiB) is still in
// the core's L1 cache between the three phases and memory is read and written once. (Measured on
// 30M parameters at 2 threads: 512 is 20 ms a step, 4096 is 28.)
constexpr std::int64_t kBlock = 512;

// mkl_sqrt on a block (at most kBlock) holding `zeros` zeros. A second moment is exactly zero
// wherever every gradient so far was (an embedding's rows no batch has used), and vmsSqrt takes each
// zero through its rare-case path, several times slower than a normal element (torch.sqrt over 4M
// floats at one thread: 1.4 ms, all of them zero 6.8). The root of a zero is that zero (+0 or -0,
// as IEEE 754 and vmsSqrt have it), so MKL sees a 1 in its place and the zero itself is written
// back as the root (vmsSqrt's results are per element); a block of zeros skips the call.
void mkl_sqrt_of_zeros(const float* in, float* out, std::int64_t n, std::int64_t zeros) {
  const Kernels& k = kernels();
  if (zeros == n) {
    std::copy(in, in + n, out);
    return;
  }
  alignas(64) float patched[kBlock];
  k.ones_for_zeros(in, patched, n);
  mkl_sqrt(patched, out, n);
  k.zeros_for_zeros(in, out, n);
}

// Inside a parallel region MKL still opens a (nested, one-thread) OpenMP region on every vmsSqrt
// call, about a microsecond each; telling it this thread runs it alone skips that (the results are
// per element, whoever computes them). Restores the thread's own setting on exit.
class MklSequential {
 public:
  explicit MklSequential(bool on) : prev_(on && MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : -1) {}
  ~MklSequential() {
    if (prev_ >= 0) MKL_Set_Num_Threads_Local(prev_);
  }
  MklSequential(const MklSequential&) = delete;
  MklSequential& operator=(const MklSequential&) = delete;

 private:
  int prev_;
};

// A double option as ATen hands it to a float kernel (Scalar::to<float>: a plain conversion).
float f32(double x) { return static_cast<float>(x); }

detail::AdamCoeffs adam_coeffs(std::int64_t step, const AdamHyper& h) {
  // torch: bias_correction = 1 - std::pow(beta, state.step()), denom = sqrt(v) / sqrt(bc2) + eps,
  // step_size = lr / bc1 and p.addcdiv_(exp_avg, denom, -step_size).
  const double bias_correction1 = 1 - std::pow(h.beta1, step);
  const double bias_correction2 = 1 - std::pow(h.beta2, step);
  detail::AdamCoeffs c;
  c.decoupled = h.decoupled_weight_decay && h.weight_decay != 0;
  c.l2 = !h.decoupled_weight_decay && h.weight_decay != 0;
  c.decay = f32(1 - h.lr * h.weight_decay);
  c.weight_decay = f32(h.weight_decay);
  c.beta1 = f32(h.beta1);
  c.one_minus_beta1 = f32(1 - h.beta1);
  c.beta2 = f32(h.beta2);
  c.one_minus_beta2 = f32(1 - h.beta2);
  c.sqrt_bias_correction2 = f32(std::sqrt(bias_correction2));
  c.eps = f32(h.eps);
  c.neg_step_size = f32(-(h.lr / bias_correction1));
  c.amsgrad = h.amsgrad;
  return c;
}

detail::SgdCoeffs sgd_coeffs(bool first, const SgdHyper& h) {
  detail::SgdCoeffs c;
  c.has_weight_decay = h.weight_decay != 0;
  c.has_momentum = h.momentum != 0;
  c.nesterov = h.nesterov;
  c.first = first;
  c.weight_decay = f32(h.weight_decay);
  c.momentum = f32(h.momentum);
  c.one_minus_dampening = f32(1 - h.dampening);
  c.neg_lr = f32(-1 * h.lr);
  return c;
}

// A tensor the kernels can step in place: dense, contiguous, float32, on the CPU, n elements.
bool flat_f32(const at::Tensor& t, std::int64_t n) {
  return t.defined() && t.device().is_cpu() && t.layout() == c10::kStrided && t.scalar_type() == at::kFloat &&
         t.is_contiguous() && !t.is_neg() && !t.is_conj() && t.numel() == n;
}

// torch's in-place ops bump a tensor's version counter (autograd's check that a saved tensor is
// unchanged); writing through data_ptr does not, so the step bumps it once per tensor it writes.
void bump(const at::Tensor& t) {
  if (t.defined() && !t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

// Whether every parameter the step touches (gradient defined), its gradient and its existing state
// are flat_f32 (the state of the optimizer's own type): then the fused step does all of it, else none.
// `only`: when set, the step looks at that parameter alone (fused_step_param).
template <class Options, class State>
bool fusable(torch::optim::Optimizer& opt, const c10::TensorImpl* only) {
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      if (only && p.unsafeGetTensorImpl() != only) continue;  // (before p.grad(): another thread may set it)
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (!flat_f32(p, p.numel()) || !flat_f32(g, p.numel())) return false;
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;
      auto* st = dynamic_cast<State*>(it->second.get());
      if (st == nullptr) return false;
      if constexpr (std::is_same_v<State, torch::optim::SGDParamState>) {
        if (!flat_f32(st->momentum_buffer(), p.numel())) return false;
      } else {
        if (!flat_f32(st->exp_avg(), p.numel()) || !flat_f32(st->exp_avg_sq(), p.numel())) return false;
        // amsgrad switched on after the state was made without its max: torch's max_out throws.
        const bool amsgrad = static_cast<const Options&>(group.options()).amsgrad();
        if (amsgrad && !flat_f32(st->max_exp_avg_sq(), p.numel())) return false;
      }
    }
  }
  return true;
}

template <class Options, class State>
bool adam_like(torch::optim::Optimizer& opt, bool decoupled, const c10::TensorImpl* only) {
  if (!fusable<Options, State>(opt, only)) return false;
  at::NoGradGuard no_grad;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    AdamHyper h;
    h.lr = o.lr();
    h.beta1 = std::get<0>(o.betas());
    h.beta2 = std::get<1>(o.betas());
    h.eps = o.eps();
    h.weight_decay = o.weight_decay();
    h.amsgrad = o.amsgrad();
    h.decoupled_weight_decay = decoupled;
    for (auto& p : group.params()) {
      if ((only && p.unsafeGetTensorImpl() != only) || !p.grad().defined()) continue;
      auto& st = detail::adam_state<State>(opt, p, h.amsgrad);
      st.step(st.step() + 1);
      at::Tensor vmax = h.amsgrad ? st.max_exp_avg_sq() : at::Tensor();
      adam_step(p.data_ptr<float>(), p.grad().const_data_ptr<float>(), st.exp_avg().template data_ptr<float>(),
                st.exp_avg_sq().template data_ptr<float>(), vmax.defined() ? vmax.data_ptr<float>() : nullptr,
                p.numel(), st.step(), h);
      bump(p);
      bump(st.exp_avg());
      bump(st.exp_avg_sq());
      bump(vmax);
    }
  }
  return true;
}

bool sgd(torch::optim::SGD& opt, const c10::TensorImpl* only) {
  if (!fusable<torch::optim::SGDOptions, torch::optim::SGDParamState>(opt, only)) return false;
  at::NoGradGuard no_grad;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    SgdHyper h;
    h.lr = o.lr();
    h.momentum = o.momentum();
    h.dampening = o.dampening();
    h.weight_decay = o.weight_decay();
    h.nesterov = o.nesterov();
    for (auto& p : group.params()) {
      if (only && p.unsafeGetTensorImpl() != only) continue;
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      at::Tensor buf;
      bool first = false;
      if (h.momentum != 0) {
        auto it = opt.state().find(p.unsafeGetTensorImpl());
        if (it == opt.state().end()) {  // torch: buf = d_p.clone(), d_p the (decayed) gradient
          first = true;
          buf = at::empty_like(g, at::MemoryFormat::Preserve);
          auto st = std::make_unique<torch::optim::SGDParamState>();
          st->momentum_buffer(buf);
          opt.state()[p.unsafeGetTensorImpl()] = std::move(st);
        } else {
          buf = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
        }
      }
      sgd_step(p.data_ptr<float>(), g.const_data_ptr<float>(), buf.defined() ? buf.data_ptr<float>() : nullptr,
               p.numel(), first, h);
      bump(p);
      if (!first) bump(buf);
    }
  }
  return true;
}

}  // namespace

void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
               std::int64_t n, std::int64_t step, const AdamHyper& h) {
  if (n <= 0) return;
  const detail::AdamCoeffs c = adam_coeffs(step, h);
  const Kernels& k = kernels();
  const SqrtFn root = sqrt_fn();
  float* vmax = h.amsgrad ? max_exp_avg_sq : nullptr;
  const bool mkl = root == mkl_sqrt;
  at::parallel_for(0, n, kGrain, [&](std::int64_t begin, std::int64_t end) {
    MklSequential sequential(mkl);
    alignas(64) float roots[kBlock];
    for (std::int64_t b = begin; b < end; b += kBlock) {
      const std::int64_t len = std::min(kBlock, end - b);
      const std::int64_t zeros =
          k.adam_moments(param + b, grad + b, exp_avg + b, exp_avg_sq + b, vmax ? vmax + b : nullptr, len, c);
      const float* sq = (vmax ? vmax : exp_avg_sq) + b;
      if (mkl && zeros > 0)
        mkl_sqrt_of_zeros(sq, roots, len, zeros);
      else
        root(sq, roots, len);
      k.adam_params(param + b, exp_avg + b, roots, len, c);
    }
  });
}

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, bool first, const SgdHyper& h) {
  if (n <= 0) return;
  const detail::SgdCoeffs c = sgd_coeffs(first, h);
  const Kernels& k = kernels();
  float* buf = h.momentum != 0 ? momentum_buffer : nullptr;
  at::parallel_for(0, n, kGrain, [&](std::int64_t b, std::int64_t e) {
    k.sgd(param + b, grad + b, buf ? buf + b : nullptr, e - b, c);
  });
}

bool fused_step(torch::optim::Optimizer& opt) {
  // The exact types only: a subclass may override step() with other arithmetic.
  return fused_step_as(opt, typeid(opt));
}

namespace {
std::atomic<std::uint64_t> g_fused_steps{0};
bool counted(bool stepped) {
  if (stepped) g_fused_steps.fetch_add(1, std::memory_order_relaxed);
  return stepped;
}
}  // namespace

std::uint64_t fused_steps() { return g_fused_steps.load(std::memory_order_relaxed); }

namespace {
// The CPU kernels' step for `type` (one of the three), of every parameter or of `only`.
bool cpu_step(torch::optim::Optimizer& opt, const std::type_info& type, const c10::TensorImpl* only) {
  if (type == typeid(torch::optim::AdamW))
    return adam_like<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt, true, only);
  if (type == typeid(torch::optim::Adam))
    return adam_like<torch::optim::AdamOptions, torch::optim::AdamParamState>(opt, false, only);
  if (type == typeid(torch::optim::SGD)) return sgd(dynamic_cast<torch::optim::SGD&>(opt), only);
  return false;
}
}  // namespace

bool fused_step_as(torch::optim::Optimizer& opt, const std::type_info& type) {
  if (cpu_step(opt, type, nullptr)) return counted(true);
  // Not CPU float32: parameters on a device go through PyTorch's fused multi-tensor kernels.
  return counted(multi_tensor_step(opt, type));
}

bool fused_step_param(torch::optim::Optimizer& opt, const std::type_info& type, const at::Tensor& param) {
  // (Only param's own gradient is looked at: another thread may be setting the others'.)
  if (!param.defined() || !param.grad().defined()) return false;
  const c10::TensorImpl* only = param.unsafeGetTensorImpl();
  bool known = false;  // one of opt's parameters
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params()) known = known || p.unsafeGetTensorImpl() == only;
  return known && cpu_step(opt, type, only);
}

}  // namespace accel::optim
