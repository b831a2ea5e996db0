// `accel estimate-memory`'s arithmetic for a GPT shape; the formulas are in estimate_gpt.h.
#include "cli/estimate_gpt.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace accel::cli {

void validate(const GptShape& s) {
  const auto positive = [](long long v, const char* flag) {
    if (v < 1) throw EstimateError(fmt::format("{}: must be at least 1, got {}", flag, v));
  };
  positive(s.vocab, "--vocab");
  positive(s.d_model, "--d_model");
  positive(s.layers, "--layers");
  positive(s.heads, "--heads");
  positive(s.seq, "--seq");
  positive(s.micro_batch, "--micro_batch");
  if (s.d_model % s.heads != 0)
    throw EstimateError(fmt::format("--heads: {} does not divide --d_model {}", s.heads, s.d_model));
}

double gpt_root_params(const GptShape& s) {
  const double d = static_cast<double>(s.d_model);
  return static_cast<double>(s.vocab) * d + static_cast<double>(s.seq) * d + 2 * d;
}

double gpt_block_params(const GptShape& s) {
  const double d = static_cast<double>(s.d_model);
  return 12 * d * d + 10 * d;
}

double gpt_params(const GptShape& s) {
  return gpt_root_params(s) + static_cast<double>(s.layers) * gpt_block_params(s);
}

GptActivations gpt_activations(const GptShape& s, Dtype dtype) {
  GptActivations a;
  a.element_bytes = dtype == Dtype::Fp32 ? 4 : 2;
  const double e = a.element_bytes, B = static_cast<double>(s.micro_batch), T = static_cast<double>(s.seq),
               d = static_cast<double>(s.d_model), H = static_cast<double>(s.heads), V = static_cast<double>(s.vocab),
               L = static_cast<double>(s.layers);
  a.block = s.sdpa ? e * (16 * B * T * d + 4 * B * T) + 4 * B * H * T
                   : e * (16 * B * T * d + B * H * T * T + 4 * B * T) + T * T;
  a.head = e * (B * T * d + 2 * B * T + 2 * B * T * V) + 8;
  a.without_ckpt = L * a.block + a.head;
  a.with_ckpt = e * L * B * T * d + a.head + a.block;
  return a;
}

GptPeak gpt_peak(zero::Strategy s, bool checkpoint, const GptShape& shape, int n, Dtype dtype, OptimizerKind opt,
                 const GptRuntime& rt, bool node_shared, const Accumulation& accumulation) {
  const BytesPerParam b = bytes_per_param(dtype, opt);
  const StrategyCoefficients c = coefficients(s, b, Offload::None, accumulation);
  const double P = gpt_params(shape), R = gpt_root_params(shape), U = gpt_block_params(shape);
  const GptActivations a = gpt_activations(shape, dtype);
  const int F = rt.buckets_in_flight;
  GptPeak p;
  p.strategy = s;
  p.checkpoint = checkpoint;
  p.states = (c.device_rep + c.device_shard / n) * P;
  // What the strategy shards, from the strategy table (HYBRID_SHARD is no row: coefficients() refuses it).
  const zero::StrategyInfo& row = zero::info(s);
  p.node_shared = node_shared && row.shards_parameters && n > 1;
  const bool gathers = row.shards_parameters && !p.node_shared;  // (node-shared: the buffer is the parameters)
  const double root_gathered = gathers ? b.param * R : 0;
  if (gathers) p.gathered = b.param * (R + 2 * U);
  if (row.shards_gradients)
    p.in_flight = std::min(b.grad * (R + F * std::max(U, rt.bucket_bytes / b.grad)), b.grad * P);
  else if (row.shards_optimizer)
    p.in_flight = F * std::min(rt.bucket_bytes, b.grad * P);
  p.activations = checkpoint ? a.with_ckpt : a.without_ckpt;
  p.backward = 3 * a.element_bytes * R + a.block;
  // AdamW's temporaries over fp32 masters: the rank's shard of a unit under ZeRO, the whole unit under DDP.
  const double stepped = std::max(U, R) / (row.shards_optimizer ? n : 1);
  p.optimizer = 2 * 4 * stepped;
  p.overhead = rt.overhead;
  p.total = p.overhead + p.states +
            std::max(p.gathered + p.in_flight + p.activations + p.backward, root_gathered + p.optimizer);
  return p;
}

GptEstimate estimate_gpt(const GptShape& shape, const EstimateRequest& r, const GptRuntime& rt) {
  validate(shape);
  if (r.num_processes < 1)
    throw EstimateError(fmt::format("--num_processes: must be at least 1, got {}", r.num_processes));
  if (r.offload != Offload::None)
    throw EstimateError("--offload: a GPT shape is estimated without offload (give --params for offload figures)");
  if (r.device_budget && !(*r.device_budget > 0 && std::isfinite(*r.device_budget)))
    throw EstimateError(fmt::format("--budget: must be positive, got {} bytes", *r.device_budget));
  if (!(rt.overhead >= 0)) throw EstimateError(fmt::format("--overhead: must be 0 or more, got {}", rt.overhead));
  validate(r.accumulation);
  GptEstimate e;
  e.shape = shape;
  e.request = r;
  e.request.params = gpt_params(shape);
  e.runtime = rt;
  e.activations = gpt_activations(shape, r.dtype);
  for (zero::Strategy s :
       {zero::Strategy::NoShard, zero::Strategy::Zero1, zero::Strategy::Zero2, zero::Strategy::Zero3})
    for (bool ckpt : {false, true}) {
      GptPeak p = gpt_peak(s, ckpt, shape, r.num_processes, r.dtype, r.optimizer, rt, false, r.accumulation);
      if (r.device_budget) {
        p.fits = p.total <= *r.device_budget;
        if (*p.fits && !e.recommended) e.recommended = p;
      }
      e.rows.push_back(p);
    }
  if (r.num_processes > 1)
    for (bool ckpt : {false, true}) {
      GptPeak p =
          gpt_peak(zero::Strategy::Zero3, ckpt, shape, r.num_processes, r.dtype, r.optimizer, rt, true, r.accumulation);
      if (r.device_budget) p.fits = p.total <= *r.device_budget;
      e.rows.push_back(p);
    }
  return e;
}

}  // namespace accel::cli
