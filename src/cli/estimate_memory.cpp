// `accel estimate-memory`'s arithmetic: parsing the flags' values, bytes per parameter, each
// strategy's coefficients, the table and the recommendation. The formulas are documented in the
// header; the text the command prints is estimate_memory_report.cpp.
#include "cli/estimate_memory.h"
#include "accelerator/config_text.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

namespace accel::cli {
namespace {

// A finite number at the start of `s`; the rest (a unit suffix) goes to `rest`. Nothing parsed: nullopt.
std::optional<double> leading_number(std::string_view s, std::string_view& rest) {
  double v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v, std::chars_format::general);
  if (ec != std::errc() || ptr == s.data() || !std::isfinite(v)) return std::nullopt;
  rest = std::string_view(ptr, static_cast<std::size_t>(end - ptr));
  return v;
}

double device_bytes(const StrategyCoefficients& c, double params, int n) {
  return (c.device_rep + c.device_shard / n) * params;
}
double cpu_bytes(const StrategyCoefficients& c, double params, int n) { return (c.cpu_rep + c.cpu_shard / n) * params; }

bool fits(double dev, double cpu, const EstimateRequest& r) {
  if (r.device_budget && dev > *r.device_budget) return false;
  if (r.cpu_budget && cpu > *r.cpu_budget) return false;
  return true;
}

}  // namespace

Dtype parse_dtype(std::string_view s, std::string_view flag) {
  const std::string v = config_detail::lower(std::string(s));
  if (v == "fp32" || v == "float32" || v == "no") return Dtype::Fp32;
  if (v == "fp16" || v == "float16" || v == "half") return Dtype::Fp16;
  if (v == "bf16" || v == "bfloat16") return Dtype::Bf16;
  if (v == "fp8") return Dtype::Fp8;
  throw EstimateError(fmt::format("{}: unknown precision '{}' (expected fp32, fp16, bf16 or fp8)", flag, s));
}

OptimizerKind parse_optimizer(std::string_view s) {
  const std::string v = config_detail::lower(std::string(s));
  if (v == "adamw") return OptimizerKind::AdamW;
  if (v == "adam") return OptimizerKind::Adam;
  if (v == "sgd") return OptimizerKind::Sgd;
  throw EstimateError(fmt::format("--optimizer: unknown optimizer '{}' (expected adamw, adam or sgd)", s));
}

Offload parse_offload(std::string_view s) {
  const std::string v = config_detail::lower(std::string(s));
  if (v == "none" || v == "no") return Offload::None;
  if (v == "optimizer" || v == "cpu") return Offload::Optimizer;
  if (v == "optimizer+params" || v == "all") return Offload::OptimizerAndParams;
  throw EstimateError(fmt::format("--offload: unknown offload '{}' (expected none, optimizer or optimizer+params)", s));
}

double parse_param_count(std::string_view s) {
  const auto bad = [&](std::string_view why) {
    return EstimateError(
        fmt::format("--params: {} '{}' (expected a parameter count such as 7.5e9, 7.5B, "
                    "350M, 1.3b or 125k)",
                    why, s));
  };
  std::string_view rest;
  const auto v = leading_number(s, rest);
  if (!v) throw bad("not a number:");
  double mult = 1;
  if (rest.size() == 1) {
    switch (rest[0]) {
      case 'k':
      case 'K': mult = 1e3; break;
      case 'm':
      case 'M': mult = 1e6; break;
      case 'b':
      case 'B':
      case 'g':
      case 'G': mult = 1e9; break;
      case 't':
      case 'T': mult = 1e12; break;
      default: throw bad("unknown suffix in");
    }
  } else if (!rest.empty()) {
    throw bad("unknown suffix in");
  }
  if (*v <= 0) throw bad("must be positive, got");
  const double p = std::round(*v * mult);
  if (p < 1) throw bad("must be at least 1 parameter, got");
  if (p > 1e18) throw bad("more than 1e18 parameters:");
  return p;
}

double parse_byte_size(std::string_view s, std::string_view flag, bool allow_zero) {
  const auto bad = [&](std::string_view why) {
    return EstimateError(fmt::format("{}: {} '{}' (expected a size such as 24GB, 80GiB or 512MB)", flag, why, s));
  };
  std::string_view rest;
  const auto v = leading_number(s, rest);
  if (!v) throw bad("not a size:");
  const std::string unit = config_detail::lower(std::string(rest));
  double mult = 0;
  if (unit.empty() || unit == "g" || unit == "gb")
    mult = 1e9;
  else if (unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb")
    mult = 1e3;
  else if (unit == "m" || unit == "mb")
    mult = 1e6;
  else if (unit == "t" || unit == "tb")
    mult = 1e12;
  else if (unit == "ki" || unit == "kib")
    mult = 1024.0;
  else if (unit == "mi" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "gi" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "ti" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw bad("unknown unit in");
  if (*v < 0 || (*v == 0 && !allow_zero)) throw bad(allow_zero ? "must be 0 or more, got" : "must be positive, got");
  return *v * mult;
}

int parse_num_processes(std::string_view s, std::string_view flag) {
  long long v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end || s.empty())
    throw EstimateError(fmt::format("{}: not a whole number: '{}'", flag, s));
  if (v < 1) throw EstimateError(fmt::format("{}: must be at least 1, got {}", flag, v));
  if (v > 1'000'000'000) throw EstimateError(fmt::format("{}: more than 1e9 ranks: {}", flag, v));
  return static_cast<int>(v);
}

const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::Fp32: return "fp32";
    case Dtype::Fp16: return "fp16";
    case Dtype::Bf16: return "bf16";
    case Dtype::Fp8: return "fp8";
  }
  return "?";
}
const char* to_string(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::AdamW: return "adamw";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::Sgd: return "sgd";
  }
  return "?";
}
const char* to_string(Offload o) {
  switch (o) {
    case Offload::None: return "none";
    case Offload::Optimizer: return "optimizer";
    case Offload::OptimizerAndParams: return "optimizer+params";
  }
  return "?";
}

BytesPerParam bytes_per_param(Dtype dtype, OptimizerKind optimizer, std::optional<Dtype> accumulate) {
  BytesPerParam b;
  switch (dtype) {
    case Dtype::Fp32:
      b.param = 4;
      b.grad = 4;
      b.master = 0;
      break;
    case Dtype::Fp16:
    case Dtype::Bf16:
      b.param = 2;
      b.grad = 2;
      b.master = 4;
      break;
    case Dtype::Fp8:
      b.param = 1;
      b.grad = 2;
      b.master = 4;
      break;
  }
  b.moments = optimizer == OptimizerKind::Sgd ? 4 : 8;
  b.sum = accumulate == Dtype::Bf16 || accumulate == Dtype::Fp16 ? 2 : 4;
  return b;
}

namespace {
// Offload's coefficients for a step without accumulation.
StrategyCoefficients step_coefficients(zero::Strategy s, const BytesPerParam& b, Offload offload);
}  // namespace

StrategyCoefficients coefficients(zero::Strategy s, const BytesPerParam& b, Offload offload,
                                  const Accumulation& accumulation) {
  StrategyCoefficients c = step_coefficients(s, b, offload);
  if (accumulation.steps <= 1) return c;
  const bool shards_grads = s == zero::Strategy::Zero2 || s == zero::Strategy::Zero3;
  std::string held;
  const bool wider_sum = b.sum != b.grad;  // mixed precision summing in fp32, not in the buffer's dtype
  if (!accumulation.sync_each_batch) {
    if (shards_grads) {
      c.device_rep += b.sum;
      held = fmt::format(
          "with {} micro-steps that do not reduce (NoSync), every rank also holds its whole gradient summed so far "
          "({:g}P{}) on the device between them; --sync_each_batch reduces each micro-step instead.",
          accumulation.steps, b.sum, wider_sum ? ", in fp32" : "");
    } else if (wider_sum) {  // (each flat's part of the buffer goes once it is added to the sum)
      c.device_rep += b.sum - b.grad;
      held = fmt::format(
          "with {} micro-steps that do not reduce (NoSync), the gradient summed so far is held in fp32 ({:g}P "
          "more than the {:g}P gradient buffer, which each flat lets go of once it is added).",
          accumulation.steps, b.sum - b.grad, b.grad);
    }
  } else if (s == zero::Strategy::NoShard) {
    c.device_rep += b.sum;
    held = fmt::format(
        "with {} micro-steps that each reduce (--sync_each_batch), the gradient summed so far ({:g}P) is held "
        "beside each new one; micro-steps that do not reduce hold {}.",
        accumulation.steps, b.sum, wider_sum ? fmt::format("{:g}P", b.sum - b.grad) : std::string("no more"));
  } else if (!shards_grads) {  // ZeRO-1: its slice of the full buffer is reduced into again
    c.device_shard += b.sum;
    held = fmt::format(
        "with {} micro-steps that each reduce (--sync_each_batch), the shard summed so far ({:g}P/N) is held "
        "beside each new one.",
        accumulation.steps, b.sum);
  } else {
    held = fmt::format(
        "with {} micro-steps that each reduce (--sync_each_batch), each reduced shard is added to the sum as its "
        "bucket finishes{}: nothing more is held.",
        accumulation.steps, offload != Offload::None ? ", in host memory" : "");
  }
  if (!held.empty() && !c.note.empty())  // (a sentence after the note's)
    held[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(held[0])));
  if (!held.empty()) c.note = c.note.empty() ? held : c.note + " " + held;
  return c;
}

namespace {
StrategyCoefficients step_coefficients(zero::Strategy s, const BytesPerParam& b, Offload offload) {
  if (s == zero::Strategy::HybridShard)
    throw EstimateError(
        fmt::format("{} is not a row of the estimate: it stores per rank what {} stores over the "
                    "ranks of one machine (read that row with --shard_group_size = ranks per machine)",
                    zero::info(s).short_label, zero::info(zero::Strategy::Zero3).short_label));
  StrategyCoefficients c;
  const double p = b.param, g = b.grad, k = b.optimizer();
  if (offload == Offload::None) {
    switch (s) {
      case zero::Strategy::NoShard: c.device_rep = p + g + k; break;
      case zero::Strategy::Zero1:
        c.device_rep = p + g;
        c.device_shard = k;
        break;
      case zero::Strategy::Zero2:
        c.device_rep = p;
        c.device_shard = g + k;
        break;
      case zero::Strategy::Zero3: c.device_shard = p + g + k; break;
      case zero::Strategy::HybridShard: break;  // refused above
    }
    return c;
  }
  // The CPU optimizer's shard: fp32 parameters (the master; a copy under fp32), moments, fp32 gradients.
  const double cpu_optimizer = 4 + b.moments + 4;
  switch (s) {
    case zero::Strategy::NoShard:
      c.device_rep = p + g + k;
      c.note = "offload needs ZeRO, so every state stays on the device.";
      break;
    case zero::Strategy::Zero1:
    case zero::Strategy::Zero2:
      c.device_rep = s == zero::Strategy::Zero1 ? p + g : p;
      c.cpu_shard = cpu_optimizer;
      if (offload == Offload::OptimizerAndParams)
        c.note = fmt::format(
            "only the optimizer is offloaded, since parameter offload needs {} (these "
            "replicate the parameters).",
            zero::info(zero::Strategy::Zero3).short_label);
      break;
    case zero::Strategy::HybridShard: break;  // refused above
    case zero::Strategy::Zero3:
      if (offload == Offload::Optimizer) {
        c.device_shard = p;
        c.cpu_shard = cpu_optimizer;
      } else {
        c.cpu_shard = cpu_optimizer + (b.master > 0 ? p : 0);
      }
      break;
  }
  return c;
}
}  // namespace

const std::vector<std::pair<zero::Strategy, Offload>>& recommendation_order() {
  static const std::vector<std::pair<zero::Strategy, Offload>> order = {
      {zero::Strategy::NoShard, Offload::None},
      {zero::Strategy::Zero1, Offload::None},
      {zero::Strategy::Zero2, Offload::None},
      {zero::Strategy::Zero2, Offload::Optimizer},
      {zero::Strategy::Zero3, Offload::None},
      {zero::Strategy::Zero3, Offload::Optimizer},
      {zero::Strategy::Zero3, Offload::OptimizerAndParams},
  };
  return order;
}

std::optional<long long> min_ranks_to_fit(double rep, double shard, double params, double budget) {
  const auto at = [&](long long n) { return (rep + shard / static_cast<double>(n)) * params; };
  if (at(1) <= budget) return 1;
  const double room = budget - rep * params;
  if (room <= 0 || shard <= 0) return std::nullopt;
  const double x = std::ceil(shard * params / room);
  if (!(x <= 1e12)) return std::nullopt;
  // Settle rounding with the same expression the table uses.
  long long n = std::max(1LL, static_cast<long long>(x));
  while (n > 1 && at(n - 1) <= budget) --n;
  while (at(n) > budget) {
    if (++n > 1'000'000'000'000LL) return std::nullopt;
  }
  return n;
}

void validate_shard_groups(const EstimateRequest& r) {
  const int s = r.shard_group_size, n = r.num_processes;
  if (s < 0) throw EstimateError(fmt::format("--shard_group_size: must be at least 1, got {}", s));
  if (s > 0 && (s > n || n % s != 0))
    throw EstimateError(
        fmt::format("--shard_group_size {} does not divide --num_processes {}: the job's ranks form whole shard "
                    "groups, each holding a copy of every shard",
                    s, n));
}

void validate(const Accumulation& a, Dtype compute) {
  if (a.steps < 1)
    throw EstimateError(fmt::format("--gradient_accumulation_steps: must be at least 1, got {}", a.steps));
  if (!a.dtype || *a.dtype == Dtype::Fp32) return;
  // The gradients are fp32 under fp32, bf16 under fp8: the sum holds them, or is wider.
  const Dtype grads = compute == Dtype::Fp8 ? Dtype::Bf16 : compute;
  if (*a.dtype != grads)
    throw EstimateError(fmt::format("--grad_accum_dtype: {} cannot hold {} gradients; fp32{}", to_string(*a.dtype),
                                    to_string(grads),
                                    grads == Dtype::Fp32 ? "" : fmt::format(" or {}", to_string(grads))));
}

Estimate estimate_memory(const EstimateRequest& r) {
  if (!(r.params >= 1) || !std::isfinite(r.params))
    throw EstimateError(fmt::format("--params: must be at least 1, got {}", r.params));
  if (r.num_processes < 1)
    throw EstimateError(fmt::format("--num_processes: must be at least 1, got {}", r.num_processes));
  validate_shard_groups(r);
  if (r.device_budget && !(*r.device_budget > 0 && std::isfinite(*r.device_budget)))
    throw EstimateError(fmt::format("--budget: must be positive, got {} bytes", *r.device_budget));
  if (r.cpu_budget && !(*r.cpu_budget > 0 && std::isfinite(*r.cpu_budget)))
    throw EstimateError(fmt::format("--cpu_budget: must be positive, got {} bytes", *r.cpu_budget));
  validate(r.accumulation, r.dtype);

  Estimate e;
  e.request = r;
  e.bytes = bytes_per_param(r.dtype, r.optimizer, r.accumulation.dtype);
  const bool budgeted = r.device_budget || r.cpu_budget;
  for (zero::Strategy s :
       {zero::Strategy::NoShard, zero::Strategy::Zero1, zero::Strategy::Zero2, zero::Strategy::Zero3}) {
    StrategyRow row;
    row.strategy = s;
    row.coef = coefficients(s, e.bytes, r.offload, r.accumulation);
    row.device_bytes = device_bytes(row.coef, r.params, r.shard_over());
    row.cpu_bytes = cpu_bytes(row.coef, r.params, r.shard_over());
    if (budgeted) {
      row.fits = fits(row.device_bytes, row.cpu_bytes, r);
      row.min_ranks = min_ranks_within_budgets(row.coef, r);
    }
    e.rows.push_back(std::move(row));
  }
  if (!budgeted) return e;

  std::vector<Choice> choices;
  for (auto [s, o] : recommendation_order()) {
    const auto c = coefficients(s, e.bytes, o, r.accumulation);
    choices.push_back({s, o, device_bytes(c, r.params, r.shard_over()), cpu_bytes(c, r.params, r.shard_over())});
  }
  for (std::size_t i = 0; i < choices.size(); ++i) {
    if (!fits(choices[i].device_bytes, choices[i].cpu_bytes, r)) continue;
    e.recommended = choices[i];
    if (i > 0) e.passed_over = choices[i - 1];
    for (std::size_t j = i + 1; j < choices.size(); ++j) {
      if (choices[j].device_bytes < choices[i].device_bytes && fits(choices[j].device_bytes, choices[j].cpu_bytes, r)) {
        e.next_option = choices[j];
        break;
      }
    }
    if (choices[i].offload != Offload::None && choices[i].strategy != zero::Strategy::NoShard) {
      for (std::size_t j = i + 1; j < choices.size(); ++j) {
        if (choices[j].offload == Offload::None && fits(choices[j].device_bytes, choices[j].cpu_bytes, r)) {
          e.without_offload = choices[j];
          break;
        }
      }
    }
    break;
  }
  return e;
}

std::optional<long long> min_ranks_within_budgets(const StrategyCoefficients& c, const EstimateRequest& r) {
  long long n = 1;
  if (r.device_budget) {
    auto d = min_ranks_to_fit(c.device_rep, c.device_shard, r.params, *r.device_budget);
    if (!d) return std::nullopt;
    n = std::max(n, *d);
  }
  if (r.cpu_budget) {
    auto d = min_ranks_to_fit(c.cpu_rep, c.cpu_shard, r.params, *r.cpu_budget);
    if (!d) return std::nullopt;
    n = std::max(n, *d);
  }
  if (r.has_copies()) {  // the smallest group size from n up that divides the job's ranks
    const long long total = r.num_processes;
    std::optional<long long> best;
    for (long long d = 1; d * d <= total; ++d) {
      if (total % d != 0) continue;
      for (long long g : {d, total / d})
        if (g >= n && (!best || g < *best)) best = g;
    }
    return best;
  }
  return n;
}

}  // namespace accel::cli
