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
                 const GptRuntime& rt, bool node_shared, const Accumulation& accumulation, Offload offload) {
  const BytesPerParam b = bytes_per_param(dtype, opt, accumulation.dtype);
  const StrategyCoefficients c = coefficients(s, b, offload, accumulation);
  const double P = gpt_params(shape), R = gpt_root_params(shape), U = gpt_block_params(shape);
  const GptActivations a = gpt_activations(shape, dtype);
  const int F = rt.buckets_in_flight;
  GptPeak p;
  p.strategy = s;
  p.checkpoint = checkpoint;
  p.offload = offload;
  p.note = c.note;
  p.states = (c.device_rep + c.device_shard / n) * P;
  p.cpu = (c.cpu_rep + c.cpu_shard / n) * P;
  // What the strategy shards, from the strategy table (HYBRID_SHARD is no row: coefficients() refuses it).
  const zero::StrategyInfo& row = zero::info(s);
  const bool params_offloaded = row.shards_parameters && offload == Offload::OptimizerAndParams;
  p.node_shared = node_shared && row.shards_parameters && n > 1 && offload == Offload::None;
  // Parameters are gathered where they are sharded: over more than one rank, or offloaded (zero::Plan),
  // and not node-shared (there the buffer is the parameters).
  const bool gathers = row.shards_parameters && (n > 1 || params_offloaded) && !p.node_shared;
  const double root_gathered = gathers ? b.param * R : 0;
  if (gathers) p.gathered = b.param * (R + 2 * U);
  if (params_offloaded) {
    // The root unit is not offloaded: its shard stays on the device beside its gathered copy. The two
    // blocks prefetched ahead arrive as shards before their gathers.
    p.states += b.param * R / n;
    p.gathered += 2 * b.param * U / n;
  }
  if (row.shards_gradients)
    p.in_flight = std::min(b.grad * (R + F * std::max(U, rt.bucket_bytes / b.grad)), b.grad * P);
  else if (row.shards_optimizer)
    p.in_flight = F * std::min(rt.bucket_bytes, b.grad * P);
  p.activations = checkpoint ? a.with_ckpt : a.without_ckpt;
  p.backward = 3 * a.element_bytes * R + a.block;
  // AdamW's temporaries over fp32 masters: the rank's shard of a unit under ZeRO, the whole unit under
  // DDP. None on the device where the optimizer is offloaded (ZeRO steps it on the host).
  const bool optimizer_offloaded = offload != Offload::None && row.shards_optimizer;
  const double stepped = std::max(U, R) / (row.shards_optimizer ? n : 1);
  p.optimizer = optimizer_offloaded ? 0 : 2 * 4 * stepped;
  p.overhead = rt.overhead;
  p.total = p.overhead + p.states +
            std::max(p.gathered + p.in_flight + p.activations + p.backward, root_gathered + p.optimizer);
  return p;
}

GptEstimate estimate_gpt(const GptShape& shape, const EstimateRequest& r, const GptRuntime& rt) {
  validate(shape);
  if (r.num_processes < 1)
    throw EstimateError(fmt::format("--num_processes: must be at least 1, got {}", r.num_processes));
  validate_shard_groups(r);
  if (r.device_budget && !(*r.device_budget > 0 && std::isfinite(*r.device_budget)))
    throw EstimateError(fmt::format("--budget: must be positive, got {} bytes", *r.device_budget));
  if (r.cpu_budget && !(*r.cpu_budget > 0 && std::isfinite(*r.cpu_budget)))
    throw EstimateError(fmt::format("--cpu_budget: must be positive, got {} bytes", *r.cpu_budget));
  if (!(rt.overhead >= 0)) throw EstimateError(fmt::format("--overhead: must be 0 or more, got {}", rt.overhead));
  validate(r.accumulation, r.dtype);
  GptEstimate e;
  e.shape = shape;
  e.request = r;
  e.request.params = gpt_params(shape);
  e.runtime = rt;
  e.activations = gpt_activations(shape, r.dtype);
  auto judge = [&](GptPeak& p) {
    if (!r.device_budget && !r.cpu_budget) return;
    p.fits = (!r.device_budget || p.total <= *r.device_budget) && (!r.cpu_budget || p.cpu <= *r.cpu_budget);
  };
  // Offload needs ZeRO: DDP's row would be the one without offload.
  std::vector<zero::Strategy> strategies{zero::Strategy::Zero1, zero::Strategy::Zero2, zero::Strategy::Zero3};
  if (r.offload == Offload::None) strategies.insert(strategies.begin(), zero::Strategy::NoShard);
  for (zero::Strategy s : strategies)
    for (bool ckpt : {false, true}) {
      GptPeak p = gpt_peak(s, ckpt, shape, r.shard_over(), r.dtype, r.optimizer, rt, false, r.accumulation, r.offload);
      judge(p);
      // (ZeRO-1 + offload is never recommended: ZeRO-2 + offload needs less device memory for the same traffic.)
      const bool candidate = r.offload == Offload::None || s != zero::Strategy::Zero1;
      if (candidate && p.fits && *p.fits && !e.recommended) e.recommended = p;
      e.rows.push_back(p);
    }
  if (r.shard_over() > 1 && r.offload == Offload::None)
    for (bool ckpt : {false, true}) {
      GptPeak p =
          gpt_peak(zero::Strategy::Zero3, ckpt, shape, r.shard_over(), r.dtype, r.optimizer, rt, true, r.accumulation);
      judge(p);
      e.rows.push_back(p);
    }
  return e;
}

}  // namespace accel::cli
