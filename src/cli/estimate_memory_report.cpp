// `accel estimate-memory`'s report: the header lines, the aligned table, its footnotes and the
// recommendation in words (format_estimate), and the number formats it uses. The arithmetic is
// estimate_memory.cpp.
#include "cli/estimate_memory.h"

#include "zero/spec.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <string>

namespace accel::cli {
namespace {

const char* short_label(zero::Strategy s) { return zero::info(s).short_label; }

std::string choice_label(zero::Strategy s, Offload o) {
  std::string out = zero::info(s).label;
  // DDP never offloads; ZeRO-1/2 offload only the optimizer whatever was asked.
  if (s == zero::Strategy::NoShard || o == Offload::None) return out;
  if (o == Offload::OptimizerAndParams && s == zero::Strategy::Zero3) return out + " + optimizer and parameter offload";
  return out + " + optimizer offload";
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

// What the node-shared ranks hold together, `bytes` being what the ranks of one shard group hold.
std::string held_together(const EstimateRequest& r, const std::string& bytes) {
  if (r.has_copies())
    return fmt::format("the {} ranks of a shard group hold {} in all, and each of its {} copies as much",
                       r.shard_over(), bytes, r.num_processes / r.shard_over());
  return fmt::format("the machine holds {} in all for the {} ranks", bytes, r.num_processes);
}

std::string communication(zero::Strategy s, Offload o) {
  const bool off = s != zero::Strategy::NoShard && o != Offload::None;
  std::string t;
  switch (s) {
    case zero::Strategy::NoShard:
      t = fmt::format(
          "{} all-reduces the gradients: 2P values sent and received per rank per step, in one "
          "collective.",
          short_label(s));
      break;
    case zero::Strategy::Zero1:
    case zero::Strategy::Zero2:
      t = fmt::format(
          "{} moves the same 2P values per rank per step as {} (a reduce-scatter of the gradients and an "
          "all-gather of the updated parameters instead of one all-reduce); {} would move 3P.",
          short_label(s), short_label(zero::Strategy::NoShard), short_label(zero::Strategy::Zero3));
      break;
    case zero::Strategy::Zero3:
      t = fmt::format(
          "{} all-gathers the parameters in forward and again in backward: 3P values per rank per "
          "step, 1.5x {}, on the critical path.",
          short_label(s), short_label(zero::Strategy::NoShard));
      break;
    case zero::Strategy::HybridShard: break;  // not a row (coefficients() refuses it)
  }
  if (off) {
    t += " With the optimizer on the CPU, every step also sends the gradient shard to the CPU and the updated "
         "parameters back over PCIe, and the optimizer steps at CPU speed";
    if (s == zero::Strategy::Zero2)
      t += fmt::format(" (Hugging Face's DeepSpeed guide still ranks this ahead of {})",
                       zero::info(zero::Strategy::Zero3).short_label);
    if (o == Offload::OptimizerAndParams && s == zero::Strategy::Zero3)
      t += "; every gather also fetches the parameters from CPU memory: the slowest option, for models that "
           "fit no other way";
    t += ".";
  }
  return t;
}

}  // namespace

std::string formula(double rep, double shard) {
  if (rep == 0 && shard == 0) return "0";
  std::string out;
  if (rep != 0) out = coef(rep) + "P";
  if (shard != 0) out += fmt::format("{}{}P/N", out.empty() ? "" : " + ", coef(shard));
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

std::string shard_groups_line(const EstimateRequest& r) {
  if (!r.has_copies()) return "";
  const int copies = r.num_processes / r.shard_over();
  return fmt::format(" in shard groups of {} ({} cop{} of each shard: the figures are a group's, at N = {})",
                     r.shard_over(), copies, copies == 1 ? "y" : "ies", r.shard_over());
}

std::string accumulation_line(const Accumulation& a, bool notes) {
  if (a.steps <= 1) return "";
  return fmt::format("  accumulate {} micro-steps a step, {}, summed in {}: {}\n", a.steps,
                     a.sync_each_batch ? "each reducing (--sync_each_batch)" : "not reducing (NoSync)",
                     a.dtype ? fmt::format("{} (--grad_accum_dtype)", to_string(*a.dtype)) : std::string("fp32"),
                     notes ? "the notes say what each row holds for it" : "the states column holds it");
}

std::string format_estimate(const Estimate& e) {
  const EstimateRequest& r = e.request;
  const BytesPerParam& b = e.bytes;
  std::string out;

  // What the figures are.
  out += fmt::format("Model states per rank: {} parameters ({}), {} rank{}{}\n", format_param_count(r.params),
                     with_commas(r.params), r.num_processes, r.num_processes == 1 ? "" : "s", shard_groups_line(r));
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
      out +=
          "  precision  fp8: 1-byte fp8 parameters (re-quantized after each step), bf16 gradients,\n"
          "             4-byte fp32 master copy; layers kept in bf16 add 1 byte per parameter of theirs\n";
      break;
  }
  if (r.optimizer == OptimizerKind::Sgd)
    out += fmt::format("  optimizer  sgd with momentum: 4-byte fp32 momentum, so K = {:g} bytes per parameter\n",
                       b.optimizer());
  else
    out += fmt::format("  optimizer  {}: 8 bytes of fp32 exp_avg + exp_avg_sq, so K = {:g} bytes per parameter\n",
                       to_string(r.optimizer), b.optimizer());
  switch (r.offload) {
    case Offload::None: out += "  offload    none\n"; break;
    case Offload::Optimizer:
      out += fmt::format(
          "  offload    optimizer: ZeRO steps the optimizer on the CPU over each rank's shard ({:g} "
          "bytes per\n             parameter: fp32 parameters, moments, fp32 gradients)\n",
          8 + b.moments);
      break;
    case Offload::OptimizerAndParams:
      out += fmt::format(
          "  offload    optimizer+params: ZeRO steps the optimizer on the CPU over each rank's "
          "shard ({:g} bytes\n             per parameter), and {} keeps its parameter shard "
          "there too\n",
          8 + b.moments, zero::info(zero::Strategy::Zero3).short_label);
      break;
  }
  out += accumulation_line(r.accumulation);
  out +=
      "Model states only: activations, temporary buffers (buckets, gathered parameters) and fragmentation\n"
      "come on top, as in the ZeRO paper. GB = 1e9 bytes; P = parameters, N = ranks";
  out += r.has_copies() ? fmt::format(" of a shard group ({}).\n\n", r.shard_over()) : std::string(".\n\n");

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
    c[0] = std::string(zero::info(row.strategy).label) + (row.coef.note.empty() ? "" : " *");
    c[1] = format_gb(row.device_bytes);
    c[2] = format_gb(row.cpu_bytes);
    c[3] = formula(row.coef.device_rep, row.coef.device_shard);
    c[4] = formula(row.coef.cpu_rep, row.coef.cpu_shard);
    if (row.fits) {
      if (*row.fits)
        c[5] = r.device_budget ? fmt::format("yes, {} spare", gb(*r.device_budget - row.device_bytes)) : "yes";
      else if (row.min_ranks)
        c[5] = r.has_copies() ? fmt::format("no, fits in shard groups of {}", *row.min_ranks)
                              : fmt::format("no, fits from N = {}", *row.min_ranks);
      else
        c[5] = r.has_copies() ? "no, in any shard group of the job" : "no, at any N";
    }
    cells.push_back(c);
  }
  std::array<std::size_t, 6> w{};
  for (const auto& c : cells)
    for (std::size_t i = 0; i < c.size(); ++i) w[i] = std::max(w[i], c[i].size());
  for (const auto& c : cells) {
    std::string line = fmt::format("{:<{}}  {:>{}}  {:>{}}  {:<{}}  {:<{}}", c[0], w[0], c[1], w[1], c[2], w[2], c[3],
                                   w[3], c[4], budgeted ? w[4] : 0);
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
        names += (names.empty() ? "" : ", ") + std::string(short_label(e.rows[j].strategy));
    out += wrap(fmt::format("* {}: {}", names, note), 100, "  ");
  }
  if (r.shard_over() > 1 && r.offload != Offload::OptimizerAndParams) {
    // (accel's CPU default for a shard group on one machine: zero/engine.cpp, comm/transport/shm/node_shared.cpp)
    const double zero3 = e.rows[3].device_bytes + e.rows[3].cpu_bytes;
    out += wrap(
        fmt::format("Node-shared (CPU ranks on one machine, accel's default there): {} keeps its parameter shards "
                    "side by side in one buffer every rank maps, and {} and {} take the gradients they "
                    "reduce-scatter from a shared pool. Each rank's figures stay its share (what its PSS shows: {} "
                    "for {}); {}, and nothing is all-gathered. Each "
                    "rank's RSS also counts the {} of its peers' parameters it maps. "
                    "ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0 turn it off (the path GPUs and several "
                    "machines take).",
                    zero::info(zero::Strategy::Zero3).short_label, zero::info(zero::Strategy::Zero2).short_label,
                    zero::info(zero::Strategy::Zero3).short_label, gb(zero3),
                    zero::info(zero::Strategy::Zero3).short_label, held_together(r, gb(zero3 * r.shard_over())),
                    gb(b.param * r.params * (r.shard_over() - 1) / r.shard_over())),
        100, "  ");
  }

  // The recommendation.
  out += "\n";
  if (!budgeted) {
    out +=
        "Pass --budget SIZE (the memory of one device, e.g. --budget 80GB) to see which strategies fit and\n"
        "get a recommendation.\n";
    return out;
  }
  std::string where = r.device_budget ? budget_gb(*r.device_budget) + " per device" : std::string();
  if (r.cpu_budget)
    where += fmt::format("{}{} of CPU memory per rank", where.empty() ? "" : " and ", budget_gb(*r.cpu_budget));
  if (!e.recommended) {
    std::string text = fmt::format(
        "Recommendation: none. Nothing fits in {} at N = {}, not even {} with "
        "full offload.",
        where, r.shard_over(), short_label(zero::Strategy::Zero3));
    auto n = min_ranks_within_budgets(coefficients(zero::Strategy::Zero3, b, Offload::None, r.accumulation), r);
    if (n)
      text +=
          r.has_copies()
              ? fmt::format(" {} without offload fits in shard groups of {}.", short_label(zero::Strategy::Zero3), *n)
              : fmt::format(" {} without offload fits from N = {} ranks.", short_label(zero::Strategy::Zero3), *n);
    if (r.accumulation.steps > 1 && !r.accumulation.sync_each_batch) {  // (NoSync's replicated sum is in the way)
      EstimateRequest each = r;
      each.accumulation.sync_each_batch = true;
      if (const Estimate alt = estimate_memory(each); alt.recommended)
        text += fmt::format(" With each micro-step reducing (--sync_each_batch), {} fits: {} per device.",
                            choice_label(alt.recommended->strategy, alt.recommended->offload),
                            gb(alt.recommended->device_bytes));
    }
    out += wrap(text, 100, "  ");
    return out;
  }
  const Choice& c = *e.recommended;
  const bool offloads = c.strategy != zero::Strategy::NoShard && c.offload != Offload::None;
  std::string text =
      fmt::format("Recommendation: {}, {} per device", choice_label(c.strategy, c.offload), gb(c.device_bytes));
  if (offloads) text += fmt::format(" and {} of CPU memory per rank", gb(c.cpu_bytes));
  text += ".";
  if (c.offload != r.offload && c.strategy != zero::Strategy::NoShard)
    text += fmt::format(" (That is --offload {}; the table shows --offload {}.)", to_string(c.offload),
                        to_string(r.offload));
  if (e.passed_over) {
    std::string passed = choice_label(e.passed_over->strategy, e.passed_over->offload);
    if (offloads && e.passed_over->offload == Offload::None && e.passed_over->strategy == c.strategy)
      passed += " without offload";
    text += fmt::format(
        " It is the least-sharded{} configuration that fits in {}, so the one that communicates "
        "least: {} would need {} per device",
        offloads ? ", least-offloaded" : "", where, passed, gb(e.passed_over->device_bytes));
    if (e.passed_over->cpu_bytes > 0) text += fmt::format(" and {} of CPU memory", gb(e.passed_over->cpu_bytes));
    text += ".";
  } else {
    text += fmt::format(" Everything fits in {}, so nothing needs sharding.", where);
  }
  text += " " + communication(c.strategy, c.offload);
  if (r.has_copies() && c.strategy != zero::Strategy::NoShard)
    text +=
        " With shard groups, the copies also all-reduce each rank's P/N gradient shard with the ranks at its place in "
        "the other groups (up to 2P/N more values per rank per step): the only traffic between groups.";
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
      text += fmt::format(
          " {} without offload also fits ({} per device): prefer it when the CPU optimizer step "
          "turns out slower than the extra communication (few CPU cores per rank, a fast "
          "interconnect).",
          zero::info(e.without_offload->strategy).label, gb(e.without_offload->device_bytes));
    if (c.device_bytes == 0)
      text += " (With every model state on the CPU, the device holds one gathered unit at a time.)";
  }
  out += wrap(text, 100, "  ");
  return out;
}

}  // namespace accel::cli
