// The fused optimizer kernels (declared in fused_kernels.h), written once over at::vec::Vectorized<float>
// and compiled once per instruction set: ACCEL_OPTIM_ISA names the namespace (isa_default, isa_avx2,
// isa_avx512) and CPU_CAPABILITY_* selects Vectorized's implementation, as ATen builds its own kernels.
//
// Bitwise equality with torch::optim rests on three things:
// - each operation is the one ATen's kernel applies (Vectorized's operators, fmadd, maximum), in the
//   same order, with every intermediate rounded to float where ATen stores a tensor;
// - ATen fuses a multiply and an add only where its vector code says so (add's alpha: fmadd) or where
//   GCC contracts it in ATen's own build (addcmul's self + value * t1 * t2): this file is compiled with
//   -ffp-contract=off and writes every fused operation out as fmadd;
// - the last partial vector goes through the same vector code (on a zero-padded copy), so an element's
//   result never depends on where a block or a thread's range ends.
// Without FMA (the default build) Vectorized's fmadd is a * b + c, two roundings, as ATen's DEFAULT
// kernels compute it.
#include <ATen/cpu/vec/vec.h>

#include <cstring>

#include "optim/fused_kernels.h"

#ifndef ACCEL_OPTIM_ISA
#error "fused_kernels.cpp is compiled once per instruction set with ACCEL_OPTIM_ISA defined (src/CMakeLists.txt)"
#endif

namespace accel::optim::detail::ACCEL_OPTIM_ISA {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr std::int64_t kLanes = Vec::size();

// Runs op(ptrs..., i) on every whole vector of [0, n), then once more on zero-padded copies of the
// remainder, copied back for the streams op writes (Out: one flag per stream). Null streams stay null.
template <int N>
struct Streams {
  float* ptr[N];
  bool out[N];
};

template <int N, class Op>
void for_each_vector(Streams<N> s, std::int64_t n, const Op& op) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) op(s.ptr, i);
  const std::int64_t r = n - i;
  if (r == 0) return;
  alignas(64) float tail[N][kLanes] = {};
  float* tp[N];
  const std::size_t bytes = static_cast<std::size_t>(r) * sizeof(float);
  for (int k = 0; k < N; ++k) {
    tp[k] = s.ptr[k] == nullptr ? nullptr : tail[k];
    if (tp[k] != nullptr) std::memcpy(tail[k], s.ptr[k] + i, bytes);
  }
  op(tp, 0);
  for (int k = 0; k < N; ++k)
    if (s.out[k] && s.ptr[k] != nullptr) std::memcpy(s.ptr[k] + i, tail[k], bytes);
}

template <bool L2, bool Amsgrad>
std::int64_t moments(const float* p, const float* g, float* m, float* v, float* vmax, std::int64_t n,
                     const AdamCoeffs& c) {
  const Vec wd(c.weight_decay), b1(c.beta1), omb1(c.one_minus_beta1), b2(c.beta2), omb2(c.one_minus_beta2);
  const Vec zero(0.0f);
  Vec zeros(0.0f);  // per lane: how many roots to take are of a zero (1.0f per one: exact below 2^24)
  Streams<5> s{{const_cast<float*>(p), const_cast<float*>(g), m, v, vmax}, {false, false, true, true, true}};
  if (!L2) s.ptr[0] = nullptr;
  for_each_vector(s, n, [&](float* const* x, std::int64_t i) {
    Vec gv = Vec::loadu(x[1] + i);
    if constexpr (L2) gv = at::vec::fmadd(Vec::loadu(x[0] + i), wd, gv);
    Vec mv = Vec::loadu(x[2] + i) * b1;
    mv = at::vec::fmadd(gv, omb1, mv);
    Vec vv = Vec::loadu(x[3] + i) * b2;
    vv = at::vec::fmadd(omb2 * gv, gv, vv);
    mv.store(x[2] + i);
    vv.store(x[3] + i);
    if constexpr (Amsgrad) {
      vv = at::vec::maximum(vv, Vec::loadu(x[4] + i));
      vv.store(x[4] + i);
    }
    zeros = zeros + vv.eq(zero);
  });
  alignas(64) float lanes[kLanes];
  zeros.store(lanes);
  std::int64_t count = 0;
  for (float z : lanes) count += static_cast<std::int64_t>(z);
  // The padded lanes of the last partial vector (zeros in, so zeros out) are not elements.
  return n % kLanes == 0 ? count : count - (kLanes - n % kLanes);
}

template <bool Decoupled>
void params(float* p, const float* m, const float* sq, std::int64_t n, const AdamCoeffs& c) {
  const Vec decay(c.decay), bc2(c.sqrt_bias_correction2), eps(c.eps), nss(c.neg_step_size);
  Streams<3> s{{p, const_cast<float*>(m), const_cast<float*>(sq)}, {true, false, false}};
  for_each_vector(s, n, [&](float* const* x, std::int64_t i) {
    Vec pv = Vec::loadu(x[0] + i);
    if constexpr (Decoupled) pv = pv * decay;
    const Vec denom = Vec::loadu(x[2] + i) / bc2 + eps;
    pv = pv + nss * Vec::loadu(x[1] + i) / denom;
    pv.store(x[0] + i);
  });
}

template <bool WeightDecay, bool Momentum, bool Nesterov, bool First>
void sgd_t(float* p, const float* g, float* buf, std::int64_t n, const SgdCoeffs& c) {
  const Vec wd(c.weight_decay), mom(c.momentum), omd(c.one_minus_dampening), nlr(c.neg_lr);
  Streams<3> s{{p, const_cast<float*>(g), Momentum ? buf : nullptr}, {true, false, true}};
  for_each_vector(s, n, [&](float* const* x, std::int64_t i) {
    Vec pv = Vec::loadu(x[0] + i);
    Vec dv = Vec::loadu(x[1] + i);
    if constexpr (WeightDecay) dv = at::vec::fmadd(pv, wd, dv);
    if constexpr (Momentum) {
      Vec bv = dv;
      if constexpr (!First) bv = at::vec::fmadd(dv, omd, Vec::loadu(x[2] + i) * mom);
      bv.store(x[2] + i);
      dv = Nesterov ? at::vec::fmadd(bv, mom, dv) : bv;
    }
    pv = at::vec::fmadd(dv, nlr, pv);
    pv.store(x[0] + i);
  });
}

template <bool WeightDecay>
void sgd_wd(float* p, const float* g, float* buf, std::int64_t n, const SgdCoeffs& c) {
  if (!c.has_momentum)
    sgd_t<WeightDecay, false, false, false>(p, g, buf, n, c);
  else if (c.nesterov)
    c.first ? sgd_t<WeightDecay, true, true, true>(p, g, buf, n, c)
            : sgd_t<WeightDecay, true, true, false>(p, g, buf, n, c);
  else
    c.first ? sgd_t<WeightDecay, true, false, true>(p, g, buf, n, c)
            : sgd_t<WeightDecay, true, false, false>(p, g, buf, n, c);
}

}  // namespace

std::int64_t adam_moments(const float* p, const float* g, float* m, float* v, float* vmax, std::int64_t n,
                          const AdamCoeffs& c) {
  if (c.l2)
    return c.amsgrad ? moments<true, true>(p, g, m, v, vmax, n, c) : moments<true, false>(p, g, m, v, nullptr, n, c);
  return c.amsgrad ? moments<false, true>(p, g, m, v, vmax, n, c) : moments<false, false>(p, g, m, v, nullptr, n, c);
}

void adam_params(float* p, const float* m, const float* s, std::int64_t n, const AdamCoeffs& c) {
  c.decoupled ? params<true>(p, m, s, n, c) : params<false>(p, m, s, n, c);
}

void sqrt(const float* in, float* out, std::int64_t n) {
  Streams<2> s{{const_cast<float*>(in), out}, {false, true}};
  for_each_vector(s, n, [&](float* const* x, std::int64_t i) { Vec::loadu(x[0] + i).sqrt().store(x[1] + i); });
}

void ones_for_zeros(const float* in, float* out, std::int64_t n) {
  const Vec zero(0.0f), one(1.0f);
  Streams<2> s{{const_cast<float*>(in), out}, {false, true}};
  for_each_vector(s, n, [&](float* const* x, std::int64_t i) {
    const Vec v = Vec::loadu(x[0] + i);
    Vec::blendv(v, one, v == zero).store(x[1] + i);
  });
}

void zeros_for_zeros(const float* in, float* out, std::int64_t n) {
  const Vec zero(0.0f);
  Streams<2> s{{const_cast<float*>(in), out}, {false, true}};
  for_each_vector(s, n, [&](float* const* x, std::int64_t i) {
    const Vec v = Vec::loadu(x[0] + i);
    Vec::blendv(Vec::loadu(x[1] + i), v, v == zero).store(x[1] + i);
  });
}

void sgd(float* p, const float* g, float* buf, std::int64_t n, const SgdCoeffs& c) {
  c.has_weight_decay ? sgd_wd<true>(p, g, buf, n, c) : sgd_wd<false>(p, g, buf, n, c);
}

}  // namespace accel::optim::detail::ACCEL_OPTIM_ISA
