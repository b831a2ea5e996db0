// `accel estimate-memory`'s arithmetic and report; the formulas are documented in the header.
#include "cli/estimate_memory.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

namespace accel::cli {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A finite number at the start of `s`; the rest (a unit suffix) goes to `rest`. Nothing parsed: nullopt.
std::optional<double> leading_number(std::string_view s, std::string_view& rest) {
  double v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v, std::chars_format::general);
  if (ec != std::errc() || ptr == s.data() || !std::isfinite(v)) return std::nullopt;
  rest = std::string_view(ptr, static_cast<std::size_t>(end - ptr));
  return v;
}

// Strategy names for people: the ZeRO stage with the FSDP strategy that stores the same.
const char* label(Strategy s) {
  switch (s) {
    case Strategy::Ddp: return "DDP (NO_SHARD)";
    case Strategy::Zero1: return "ZeRO-1";
    case Strategy::Zero2: return "ZeRO-2 (SHARD_GRAD_OP)";
    case Strategy::Zero3: return "ZeRO-3 (FULL_SHARD)";
  }
  return "?";
}

std::string choice_label(Strategy s, Offload o) {
  std::string out = label(s);
  // DDP never offloads; ZeRO-1/2 offload only the optimizer whatever was asked.
  if (s == Strategy::Ddp || o == Offload::None) return out;
  if (o == Offload::OptimizerAndParams && s == Strategy::Zero3) return out + " + optimizer and parameter offload";
  return out + " + optimizer offload";
}

double device_bytes(const StrategyCoefficients& c, double params, int n) {
  return (c.device_rep + c.device_shard / n) * params;
}
double cpu_bytes(const StrategyCoefficients& c, double params, int n) {
  return (c.cpu_rep + c.cpu_shard / n) * params;
}

bool fits(double dev, double cpu, const EstimateRequest& r) {
  if (r.device_budget && dev > *r.device_budget) return false;
  if (r.cpu_budget && cpu > *r.cpu_budget) return false;
  return true;
}

std::optional<long long> combined_min_ranks(const StrategyCoefficients& c, const EstimateRequest& r) {
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
  return n;
}

std::string with_commas(double v) {
  std::string digits = fmt::format("{:.0f}", v);
  std::string out;
  const std::size_t n = digits.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string coef(double c) { return c == 1 ? "" : fmt::format("{:g}", c); }

// Greedy word wrap; `indent` starts every line after the first.
std::string wrap(const std::string& text, std::size_t width, const std::string& indent) {
  std::string out, line;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(pos, end - pos);
    pos = end + 1;
    if (word.empty()) continue;
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
    }
    if (!line.empty() && line != indent) line += ' ';
    line += word;
  }
  if (!line.empty()) out += line + "\n";
  return out;
}

std::string gb(double bytes) { return format_gb(bytes) + " GB"; }
// A budget as given: 24e9 -> "24 GB", 24 GiB -> "25.77 GB".
std::string budget_gb(double bytes) { return fmt::format("{:.4g} GB", bytes / 1e9); }

std::string communication(Strategy s, Offload o) {
  const bool off = s != Strategy::Ddp && o != Offload::None;
  std::string t;
  switch (s) {
    case Strategy::Ddp:
      t = "DDP all-reduces the gradients: 2P values sent and received per rank per step, in one collective.";
      break;
    case Strategy::Zero1:
    case Strategy::Zero2:
      t = fmt::format(
          "{} moves the same 2P values per rank per step as DDP (a reduce-scatter of the gradients and an "
          "all-gather of the updated parameters instead of one all-reduce); ZeRO-3 would move 3P.",
          to_string(s));
      break;
    case Strategy::Zero3:
      t = "ZeRO-3 all-gathers the parameters in forward and again in backward: 3P values per rank per step, "
          "1.5x DDP, on the critical path.";
      break;
  }
  if (off) {
    t += " With the optimizer on the CPU, every step also sends the gradient shard to the CPU and the updated "
         "parameters back over PCIe, and the optimizer steps at CPU speed";
    if (s == Strategy::Zero2) t += " (Hugging Face's DeepSpeed guide still ranks this ahead of ZeRO-3)";
    if (o == Offload::OptimizerAndParams && s == Strategy::Zero3)
      t += "; every gather also fetches the parameters from CPU memory: the slowest option, for models that "
           "fit no other way";
    t += ".";
  }
  return t;
}

}  // namespace

Dtype parse_dtype(std::string_view s) {
  const std::string v = lower(s);
  if (v == "fp32" || v == "float32" || v == "no") return Dtype::Fp32;
  if (v == "fp16" || v == "float16" || v == "half") return Dtype::Fp16;
  if (v == "bf16" || v == "bfloat16") return Dtype::Bf16;
  if (v == "fp8") return Dtype::Fp8;
  throw EstimateError(fmt::format("--dtype: unknown precision '{}' (expected fp32, fp16, bf16 or fp8)", s));
}

Optimizer parse_optimizer(std::string_view s) {
  const std::string v = lower(s);
  if (v == "adamw") return Optimizer::AdamW;
  if (v == "adam") return Optimizer::Adam;
  if (v == "sgd") return Optimizer::Sgd;
  throw EstimateError(fmt::format("--optimizer: unknown optimizer '{}' (expected adamw, adam or sgd)", s));
}

Offload parse_offload(std::string_view s) {
  const std::string v = lower(s);
  if (v == "none" || v == "no") return Offload::None;
  if (v == "optimizer" || v == "cpu") return Offload::Optimizer;
  if (v == "optimizer+params" || v == "all") return Offload::OptimizerAndParams;
  throw EstimateError(
      fmt::format("--offload: unknown offload '{}' (expected none, optimizer or optimizer+params)", s));
}

double parse_param_count(std::string_view s) {
  const auto bad = [&](std::string_view why) {
    return EstimateError(fmt::format("--params: {} '{}' (expected a parameter count such as 7.5e9, 7.5B, "
                                     "350M, 1.3b or 125k)",
                                     why, s));
  };
  std::string_view rest;
  const auto v = leading_number(s, rest);
  if (!v) throw bad("not a number:");
  double mult = 1;
  if (rest.size() == 1) {
    switch (rest[0]) {
      case 'k': case 'K': mult = 1e3; break;
      case 'm': case 'M': mult = 1e6; break;
      case 'b': case 'B': case 'g': case 'G': mult = 1e9; break;
      case 't': case 'T': mult = 1e12; break;
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

double parse_byte_size(std::string_view s, std::string_view flag) {
  const auto bad = [&](std::string_view why) {
    return EstimateError(fmt::format("{}: {} '{}' (expected a size such as 24GB, 80GiB or 512MB)", flag, why, s));
  };
  std::string_view rest;
  const auto v = leading_number(s, rest);
  if (!v) throw bad("not a size:");
  const std::string unit = lower(rest);
  double mult = 0;
  if (unit.empty() || unit == "g" || unit == "gb") mult = 1e9;
  else if (unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mb") mult = 1e6;
  else if (unit == "t" || unit == "tb") mult = 1e12;
  else if (unit == "ki" || unit == "kib") mult = 1024.0;
  else if (unit == "mi" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "gi" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "ti" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw bad("unknown unit in");
  if (*v <= 0) throw bad("must be positive, got");
  return *v * mult;
}

int parse_num_processes(std::string_view s) {
  long long v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end || s.empty())
    throw EstimateError(fmt::format("--num_processes: not a whole number: '{}'", s));
  if (v < 1) throw EstimateError(fmt::format("--num_processes: must be at least 1, got {}", v));
  if (v > 1'000'000'000) throw EstimateError(fmt::format("--num_processes: more than 1e9 ranks: {}", v));
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
const char* to_string(Optimizer o) {
  switch (o) {
    case Optimizer::AdamW: return "adamw";
    case Optimizer::Adam: return "adam";
    case Optimizer::Sgd: return "sgd";
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
const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::Ddp: return "DDP";
    case Strategy::Zero1: return "ZeRO-1";
    case Strategy::Zero2: return "ZeRO-2";
    case Strategy::Zero3: return "ZeRO-3";
  }
  return "?";
}

BytesPerParam bytes_per_param(Dtype dtype, Optimizer optimizer) {
  BytesPerParam b;
  switch (dtype) {
    case Dtype::Fp32: b.param = 4; b.grad = 4; b.master = 0; break;
    case Dtype::Fp16:
    case Dtype::Bf16: b.param = 2; b.grad = 2; b.master = 4; break;
    case Dtype::Fp8: b.param = 1; b.grad = 2; b.master = 4; break;
  }
  b.moments = optimizer == Optimizer::Sgd ? 4 : 8;
  return b;
}

StrategyCoefficients coefficients(Strategy s, const BytesPerParam& b, Offload offload) {
  StrategyCoefficients c;
  const double p = b.param, g = b.grad, k = b.optimizer();
  if (offload == Offload::None) {
    switch (s) {
      case Strategy::Ddp: c.device_rep = p + g + k; break;
      case Strategy::Zero1: c.device_rep = p + g; c.device_shard = k; break;
      case Strategy::Zero2: c.device_rep = p; c.device_shard = g + k; break;
      case Strategy::Zero3: c.device_shard = p + g + k; break;
    }
    return c;
  }
  // The CPU optimizer's shard: fp32 parameters (the master; a copy under fp32), moments, fp32 gradients.
  const double cpu_optimizer = 4 + b.moments + 4;
  switch (s) {
    case Strategy::Ddp:
      c.device_rep = p + g + k;
      c.note = "offload needs ZeRO, so every state stays on the device.";
      break;
    case Strategy::Zero1:
    case Strategy::Zero2:
      c.device_rep = s == Strategy::Zero1 ? p + g : p;
      c.cpu_shard = cpu_optimizer;
      if (offload == Offload::OptimizerAndParams)
        c.note = "only the optimizer is offloaded, since parameter offload needs ZeRO-3 (these replicate "
                 "the parameters).";
      break;
    case Strategy::Zero3:
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

const std::vector<std::pair<Strategy, Offload>>& recommendation_order() {
  static const std::vector<std::pair<Strategy, Offload>> order = {
      {Strategy::Ddp, Offload::None},         {Strategy::Zero1, Offload::None},
      {Strategy::Zero2, Offload::None},       {Strategy::Zero2, Offload::Optimizer},
      {Strategy::Zero3, Offload::None},       {Strategy::Zero3, Offload::Optimizer},
      {Strategy::Zero3, Offload::OptimizerAndParams},
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

Estimate estimate_memory(const EstimateRequest& r) {
  if (!(r.params >= 1) || !std::isfinite(r.params))
    throw EstimateError(fmt::format("--params: must be at least 1, got {}", r.params));
  if (r.num_processes < 1)
    throw EstimateError(fmt::format("--num_processes: must be at least 1, got {}", r.num_processes));
  if (r.device_budget && !(*r.device_budget > 0 && std::isfinite(*r.device_budget)))
    throw EstimateError(fmt::format("--budget: must be positive, got {} bytes", *r.device_budget));
  if (r.cpu_budget && !(*r.cpu_budget > 0 && std::isfinite(*r.cpu_budget)))
    throw EstimateError(fmt::format("--cpu_budget: must be positive, got {} bytes", *r.cpu_budget));

  Estimate e;
  e.request = r;
  e.bytes = bytes_per_param(r.dtype, r.optimizer);
  const bool budgeted = r.device_budget || r.cpu_budget;
  for (Strategy s : {Strategy::Ddp, Strategy::Zero1, Strategy::Zero2, Strategy::Zero3}) {
    StrategyRow row;
    row.strategy = s;
    row.coef = coefficients(s, e.bytes, r.offload);
    row.device_bytes = device_bytes(row.coef, r.params, r.num_processes);
    row.cpu_bytes = cpu_bytes(row.coef, r.params, r.num_processes);
    if (budgeted) {
      row.fits = fits(row.device_bytes, row.cpu_bytes, r);
      row.min_ranks = combined_min_ranks(row.coef, r);
    }
    e.rows.push_back(std::move(row));
  }
  if (!budgeted) return e;

  std::vector<Choice> choices;
  for (auto [s, o] : recommendation_order()) {
    const auto c = coefficients(s, e.bytes, o);
    choices.push_back({s, o, device_bytes(c, r.params, r.num_processes), cpu_bytes(c, r.params, r.num_processes)});
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
    if (choices[i].offload != Offload::None && choices[i].strategy != Strategy::Ddp) {
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

std::string formula(double rep, double shard) {
  if (rep == 0 && shard == 0) return "0";
  std::string out;
  if (rep != 0) out = coef(rep) + "P";
  if (shard != 0) out += (out.empty() ? "" : " + ") + coef(shard) + "P/N";
  return out;
}

std::string format_gb(double bytes) {
  const double v = bytes / 1e9;
  if (v == 0) return "0";
  if (v >= 1) return fmt::format("{:.1f}", v);
  if (v >= 0.001) return fmt::format("{:.3g}", v);
  return "<0.001";
}

std::string format_param_count(double params) {
  static constexpr std::array<std::pair<double, const char*>, 4> units = {
      {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}}};
  for (std::size_t i = 0; i < units.size(); ++i) {
    const auto [scale, suffix] = units[i];
    if (params >= scale * 0.9995 || (i == units.size() - 1 && params >= scale)) {
      return fmt::format("{:.3g}{}", params / scale, suffix);
    }
  }
  return fmt::format("{:.0f}", params);
}

std::string format_estimate(const Estimate& e) {
  const EstimateRequest& r = e.request;
  const BytesPerParam& b = e.bytes;
  std::string out;

  // What the figures are.
  out += fmt::format("Model states per rank: {} parameters ({}), {} rank{}\n", format_param_count(r.params),
                     with_commas(r.params), r.num_processes, r.num_processes == 1 ? "" : "s");
  switch (r.dtype) {
    case Dtype::Fp32:
      out += "  precision  fp32: 4-byte parameters and gradients; the parameters are the master weights\n";
      break;
    case Dtype::Fp16:
    case Dtype::Bf16:
      out += fmt::format("  precision  {} mixed: 2-byte parameters and gradients, 4-byte fp32 master copy\n",
                         to_string(r.dtype));
      break;
    case Dtype::Fp8:
      out += "  precision  fp8: 1-byte fp8 parameters (re-quantized after each step), bf16 gradients,\n"
             "             4-byte fp32 master copy; layers kept in bf16 add 1 byte per parameter of theirs\n";
      break;
  }
  if (r.optimizer == Optimizer::Sgd)
    out += fmt::format("  optimizer  sgd with momentum: 4-byte fp32 momentum, so K = {:g} bytes per parameter\n",
                       b.optimizer());
  else
    out += fmt::format("  optimizer  {}: 8 bytes of fp32 exp_avg + exp_avg_sq, so K = {:g} bytes per parameter\n",
                       to_string(r.optimizer), b.optimizer());
  switch (r.offload) {
    case Offload::None: out += "  offload    none\n"; break;
    case Offload::Optimizer:
      out += fmt::format("  offload    optimizer: ZeRO steps the optimizer on the CPU over each rank's shard ({:g} "
                         "bytes per\n             parameter: fp32 parameters, moments, fp32 gradients)\n",
                         8 + b.moments);
      break;
    case Offload::OptimizerAndParams:
      out += fmt::format("  offload    optimizer+params: ZeRO steps the optimizer on the CPU over each rank's "
                         "shard ({:g} bytes\n             per parameter), and ZeRO-3 keeps its parameter shard "
                         "there too\n",
                         8 + b.moments);
      break;
  }
  out += "Model states only: activations, temporary buffers (buckets, gathered parameters) and fragmentation\n"
         "come on top, as in the ZeRO paper. GB = 1e9 bytes; P = parameters, N = ranks.\n\n";

  // The table.
  const bool budgeted = r.device_budget || r.cpu_budget;
  std::string fits_header;
  if (budgeted) {
    fits_header = "fits";
    if (r.device_budget) fits_header += " " + budget_gb(*r.device_budget);
    if (r.cpu_budget) fits_header += fmt::format("{} {} CPU", r.device_budget ? " +" : "", budget_gb(*r.cpu_budget));
    fits_header += "?";
  }
  std::vector<std::array<std::string, 6>> cells;
  cells.push_back({"strategy", "device GB", "CPU GB", "device bytes", "CPU bytes", fits_header});
  for (const auto& row : e.rows) {
    std::array<std::string, 6> c;
    c[0] = std::string(label(row.strategy)) + (row.coef.note.empty() ? "" : " *");
    c[1] = format_gb(row.device_bytes);
    c[2] = format_gb(row.cpu_bytes);
    c[3] = formula(row.coef.device_rep, row.coef.device_shard);
    c[4] = formula(row.coef.cpu_rep, row.coef.cpu_shard);
    if (row.fits) {
      if (*row.fits)
        c[5] = r.device_budget ? fmt::format("yes, {} spare", gb(*r.device_budget - row.device_bytes)) : "yes";
      else if (row.min_ranks)
        c[5] = fmt::format("no, fits from N = {}", *row.min_ranks);
      else
        c[5] = "no, at any N";
    }
    cells.push_back(c);
  }
  std::array<std::size_t, 6> w{};
  for (const auto& c : cells)
    for (std::size_t i = 0; i < c.size(); ++i) w[i] = std::max(w[i], c[i].size());
  for (const auto& c : cells) {
    std::string line = fmt::format("{:<{}}  {:>{}}  {:>{}}  {:<{}}  {:<{}}", c[0], w[0], c[1], w[1], c[2], w[2],
                                   c[3], w[3], c[4], budgeted ? w[4] : 0);
    if (budgeted) line += "  " + c[5];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  // Footnotes, one per distinct note: "* ZeRO-1, ZeRO-2: only the optimizer is offloaded ...".
  for (std::size_t i = 0; i < e.rows.size(); ++i) {
    const std::string& note = e.rows[i].coef.note;
    bool seen = false;
    for (std::size_t j = 0; j < i; ++j) seen = seen || e.rows[j].coef.note == note;
    if (note.empty() || seen) continue;
    std::string names;
    for (std::size_t j = i; j < e.rows.size(); ++j)
      if (e.rows[j].coef.note == note)
        names += (names.empty() ? "" : ", ") + std::string(to_string(e.rows[j].strategy));
    out += wrap("* " + names + ": " + note, 100, "  ");
  }

  // The recommendation.
  out += "\n";
  if (!budgeted) {
    out += "Pass --budget SIZE (the memory of one device, e.g. --budget 80GB) to see which strategies fit and\n"
           "get a recommendation.\n";
    return out;
  }
  std::string where = r.device_budget ? budget_gb(*r.device_budget) + " per device" : std::string();
  if (r.cpu_budget) where += (where.empty() ? "" : " and ") + budget_gb(*r.cpu_budget) + " of CPU memory per rank";
  if (!e.recommended) {
    std::string text = fmt::format("Recommendation: none. Nothing fits in {} at N = {}, not even ZeRO-3 with "
                                   "full offload.",
                                   where, r.num_processes);
    auto n = combined_min_ranks(coefficients(Strategy::Zero3, b, Offload::None), r);
    if (n) text += fmt::format(" ZeRO-3 without offload fits from N = {} ranks.", *n);
    out += wrap(text, 100, "  ");
    return out;
  }
  const Choice& c = *e.recommended;
  const bool offloads = c.strategy != Strategy::Ddp && c.offload != Offload::None;
  std::string text = fmt::format("Recommendation: {}, {} per device", choice_label(c.strategy, c.offload),
                                 gb(c.device_bytes));
  if (offloads) text += fmt::format(" and {} of CPU memory per rank", gb(c.cpu_bytes));
  text += ".";
  if (c.offload != r.offload && c.strategy != Strategy::Ddp)
    text += fmt::format(" (That is --offload {}; the table shows --offload {}.)", to_string(c.offload),
                        to_string(r.offload));
  if (e.passed_over) {
    std::string passed = choice_label(e.passed_over->strategy, e.passed_over->offload);
    if (offloads && e.passed_over->offload == Offload::None && e.passed_over->strategy == c.strategy)
      passed += " without offload";
    text += fmt::format(" It is the least-sharded{} configuration that fits in {}, so the one that communicates "
                        "least: {} would need {} per device",
                        offloads ? ", least-offloaded" : "", where, passed, gb(e.passed_over->device_bytes));
    if (e.passed_over->cpu_bytes > 0) text += fmt::format(" and {} of CPU memory", gb(e.passed_over->cpu_bytes));
    text += ".";
  } else {
    text += fmt::format(" Everything fits in {}, so nothing needs sharding.", where);
  }
  text += " " + communication(c.strategy, c.offload);
  if (r.device_budget) {
    const double spare = *r.device_budget - c.device_bytes;
    text += fmt::format(" It leaves {} per device for activations and buffers.", gb(spare));
    if (spare < 0.1 * *r.device_budget) {
      text += " That is under 10% of the budget: activations may not fit";
      if (e.next_option)
        text += fmt::format("; {} leaves {}", choice_label(e.next_option->strategy, e.next_option->offload),
                            gb(*r.device_budget - e.next_option->device_bytes));
      text += ".";
    }
    if (e.without_offload)
      text += fmt::format(" {} without offload also fits ({} per device): prefer it when the CPU optimizer step "
                          "turns out slower than the extra communication (few CPU cores per rank, a fast "
                          "interconnect).",
                          label(e.without_offload->strategy), gb(e.without_offload->device_bytes));
    if (c.device_bytes == 0)
      text += " (With every model state on the CPU, the device holds one gathered unit at a time.)";
  }
  out += wrap(text, 100, "  ");
  return out;
}

}  // namespace accel::cli
