// accel::optim internals: the per-element kernels of the fused optimizer step, compiled once per
// instruction set (fused_kernels.cpp, built as one object library per ISA: src/CMakeLists.txt), and
// the float coefficients they take. fused_step.cpp computes the coefficients in double exactly as
// torch::optim does, converts them to float as ATen converts a Scalar for a float tensor, calls the
// kernels of the instruction set ATen itself dispatches to on this machine, and takes the square root
// the way ATen's sqrt does (fused_step.cpp: MKL's vmsSqrt where ATen uses it).
#pragma once

#include <cstdint>

namespace accel::optim::detail {

// One Adam/AdamW update, per element, in torch::optim's order (torch/csrc/api/src/optim/adam.cpp), in
// two phases around the square root (which ATen may take from MKL, not from an instruction):
//   moments:  g   = fma(p, wd, g)                          Adam, weight_decay != 0 (grad.add(p, wd))
//             m   = fma(g, 1 - beta1, m * beta1)           exp_avg.mul_(beta1).add_(grad, 1 - beta1)
//             v   = fma((1 - beta2) * g, g, v * beta2)     exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
//             vm  = max(v, vm)                             amsgrad (max_out(vm, v, vm))
//   (sqrt):   s   = sqrt(amsgrad ? vm : v)                 exp_avg_sq.sqrt()
//   params:   p   = p * decay                              AdamW, weight_decay != 0 (p.mul_(1 - lr * wd))
//             den = s / sqrt(bc2) + eps                    (... / sqrt(bias_correction2)).add_(eps)
//             p   = p + (-step_size * m) / den             p.addcdiv_(exp_avg, denom, -step_size)
// (AdamW decays p before the moments in torch; the moments never read p under AdamW, so the order
// is the same.)
struct AdamCoeffs {
  float decay = 1.0f;  // decoupled only
  float weight_decay = 0.0f;
  float beta1 = 0.0f, one_minus_beta1 = 0.0f, beta2 = 0.0f, one_minus_beta2 = 0.0f;
  float sqrt_bias_correction2 = 1.0f;
  float eps = 0.0f;
  float neg_step_size = 0.0f;
  bool decoupled = false;  // AdamW: p *= decay (when weight_decay != 0)
  bool l2 = false;         // Adam with weight_decay != 0: g += wd * p
  bool amsgrad = false;
};

// One SGD update, per element (torch/csrc/api/src/optim/sgd.cpp):
//   d   = fma(p, wd, g)                          weight_decay != 0
//   buf = d                                      momentum != 0, first step (clone)
//   buf = fma(d, 1 - dampening, buf * momentum)  momentum != 0, later steps
//   d   = nesterov ? fma(buf, momentum, d) : buf
//   p   = fma(d, -lr, p)
struct SgdCoeffs {
  float weight_decay = 0.0f, momentum = 0.0f, one_minus_dampening = 0.0f, neg_lr = 0.0f;
  bool has_weight_decay = false, has_momentum = false, nesterov = false, first = false;
};

// The kernels of one instruction set; each works on [0, n) of its pointers, on the calling thread.
// adam_moments: m, v (and vmax under amsgrad) in place; p is read only for Adam's L2 decay. Returns
//               how many of the n elements whose square root the step takes next (vmax under
//               amsgrad, else v) compare equal to zero, counted as it writes them (fused_step.cpp
//               takes those roots itself: MKL's vmsSqrt handles a zero on a slow path).
// adam_params:  p in place from m and s = the square root of the second moment (or of its max).
// sqrt:         out = sqrt(in), correctly rounded (ATen's sqrt where it is built without MKL).
// ones_for_zeros:  out = in, with 1 for every zero (fused_step.cpp: MKL's square root of a block
//                  holding zeros, which it would take on its slow path);
// zeros_for_zeros: out = in wherever in is a zero (+0 or -0), else out unchanged (the roots of those
//                  zeros).
#define ACCEL_OPTIM_DECLARE_KERNELS(ISA)                                                                     \
  namespace ISA {                                                                                            \
  std::int64_t adam_moments(const float* p, const float* g, float* m, float* v, float* vmax, std::int64_t n, \
                            const AdamCoeffs& c);                                                            \
  void adam_params(float* p, const float* m, const float* s, std::int64_t n, const AdamCoeffs& c);           \
  void sqrt(const float* in, float* out, std::int64_t n);                                                    \
  void ones_for_zeros(const float* in, float* out, std::int64_t n);                                          \
  void zeros_for_zeros(const float* in, float* out, std::int64_t n);                                         \
  void sgd(float* p, const float* g, float* buf, std::int64_t n, const SgdCoeffs& c);                        \
  }

// src/CMakeLists.txt builds the AVX2 and AVX-512 variants on x86-64 (CMAKE_SYSTEM_PROCESSOR).
#if defined(__x86_64__) || defined(_M_X64)
#define ACCEL_OPTIM_HAVE_AVX2 1
#define ACCEL_OPTIM_HAVE_AVX512 1
#endif

ACCEL_OPTIM_DECLARE_KERNELS(isa_default)
#if defined(ACCEL_OPTIM_HAVE_AVX2)
ACCEL_OPTIM_DECLARE_KERNELS(isa_avx2)
#endif
#if defined(ACCEL_OPTIM_HAVE_AVX512)
ACCEL_OPTIM_DECLARE_KERNELS(isa_avx512)
#endif

#undef ACCEL_OPTIM_DECLARE_KERNELS

}  // namespace accel::optim::detail
