// `accel estimate-memory`'s report for a GPT shape (format_gpt_estimate): the shape and its
// parameters, the activations with and without checkpointing, one row per strategy and checkpointing
// with the peak's terms, and with --budget which fit and which to use. The arithmetic is
// estimate_gpt.cpp.
#include "cli/estimate_gpt.h"

#include "zero/spec.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace accel::cli {
namespace {

std::string gb_figure(double bytes) { return format_gb(bytes); }

std::string row_label(const GptPeak& p) {
  return std::string(zero::info(p.strategy).short_label) + (p.node_shared ? " node-shared" : "") +
         (p.checkpoint ? " + checkpointing" : "") + (p.note.empty() ? "" : " *");
}

// What a row offloads: "optimizer", "optimizer and parameters"; "" without offload.
std::string offloaded(const GptPeak& p) {
  if (p.offload == Offload::None) return "";
  return p.offload == Offload::OptimizerAndParams && zero::info(p.strategy).shards_parameters
             ? "optimizer and parameters"
             : "optimizer";
}

}  // namespace

std::string format_gpt_estimate(const GptEstimate& e) {
  const GptShape& s = e.shape;
  const EstimateRequest& r = e.request;
  const GptActivations& a = e.activations;
  std::string out;
  out += fmt::format(
      "GPT: d_model {}, {} layers, {} heads, seq {}, micro-batch {}, vocab {}, {} attention: {} parameters ({:.0f}), "
      "{} rank{}{}\n",
      s.d_model, s.layers, s.heads, s.seq, s.micro_batch, s.vocab, s.sdpa ? "sdpa" : "eager",
      format_param_count(r.params), r.params, r.num_processes, r.num_processes == 1 ? "" : "s", shard_groups_line(r));
  out += fmt::format("  precision  {}, optimizer {}; activations in {:g}-byte elements\n", to_string(r.dtype),
                     to_string(r.optimizer), a.element_bytes);
  out += accumulation_line(r.accumulation, /*notes=*/false);
  out += fmt::format(
      "  activations per rank: {} GB without checkpointing ({} GB per block, {} GB after the blocks),\n"
      "             {} GB with every block checkpointed (block inputs + one block recomputed)\n",
      gb_figure(a.without_ckpt), gb_figure(a.block), gb_figure(a.head), gb_figure(a.with_ckpt));
  out += fmt::format(
      "Per-rank peak of one step = overhead + states + max(gathered + in flight + activations + backward,\n"
      "  optimizer step). overhead {} GB (libtorch + MPI runtime, allocator slack; --overhead); gradient\n"
      "  buckets in flight {}, bucket {} MiB. GB = 1e9 bytes.\n",
      gb_figure(e.runtime.overhead), e.runtime.buckets_in_flight, e.runtime.bucket_bytes / 1048576.0);
  const bool offload = r.offload != Offload::None;
  if (offload)
    out += fmt::format(
        "  offload {} (ZeRO-{}): {}\n"
        "  in host memory. The step runs there: the device's optimizer term is 0, and \"CPU GB\" is the\n"
        "  host's states per rank, besides its runtime. No DDP row: offload needs ZeRO.\n",
        to_string(r.offload), r.offload == Offload::Optimizer ? "Offload" : "Infinity",
        r.offload == Offload::Optimizer ? "the optimizer state" : "the optimizer state and ZeRO-3's parameter shards");
  out += "\n";

  const bool budgeted = r.device_budget.has_value() || r.cpu_budget.has_value();
  std::string budgets;  // "8 GB", "8 GB + 20 GB CPU", "20 GB CPU"
  if (r.device_budget) budgets = fmt::format("{:.4g} GB", *r.device_budget / 1e9);
  if (r.cpu_budget) budgets += fmt::format("{}{:.4g} GB CPU", budgets.empty() ? "" : " + ", *r.cpu_budget / 1e9);
  const std::string fits_head = "fits " + budgets + "?";
  std::vector<std::array<std::string, 10>> cells;
  cells.push_back({"strategy", "states", "gathered", "in flight", "activations", "backward", "optimizer", "peak GB",
                   "CPU GB", budgeted ? fits_head : ""});
  for (const auto& p : e.rows) {
    std::string fit;
    if (p.fits && *p.fits)
      fit = r.device_budget ? fmt::format("yes, {} spare", gb_figure(*r.device_budget - p.total)) : "yes";
    else if (p.fits)
      fit = r.device_budget && p.total > *r.device_budget ? "no" : "no (CPU)";
    cells.push_back({row_label(p), gb_figure(p.states), gb_figure(p.gathered), gb_figure(p.in_flight),
                     gb_figure(p.activations), gb_figure(p.backward), gb_figure(p.optimizer), gb_figure(p.total),
                     gb_figure(p.cpu), fit});
  }
  std::array<std::size_t, 10> w{};
  for (const auto& c : cells)
    for (std::size_t i = 0; i < c.size(); ++i) w[i] = std::max(w[i], c[i].size());
  for (const auto& c : cells) {
    std::string line = fmt::format("{:<{}}", c[0], w[0]);
    for (std::size_t i = 1; i < 8; ++i) line += fmt::format("  {:>{}}", c[i], w[i]);
    if (offload) line += fmt::format("  {:>{}}", c[8], w[8]);
    if (budgeted) line += "  " + c[9];
    out += line + "\n";
  }
  for (const auto& p : e.rows)
    if (!p.note.empty() && !p.checkpoint)  // (once per strategy)
      out += fmt::format("* {}: {}\n", zero::info(p.strategy).short_label, p.note);
  if (r.shard_over() > 1 && !offload) {
    const GptPeak& ns = e.rows[e.rows.size() - 2];
    const std::string together =
        r.has_copies()
            ? fmt::format("The {} ranks of a shard\n  group hold {} GB, each of its {} copies as much.", r.shard_over(),
                          gb_figure(ns.total * r.shard_over()), r.num_processes / r.shard_over())
            : fmt::format("The machine holds\n  {} GB for the {} ranks.", gb_figure(ns.total * r.num_processes),
                          r.num_processes);
    out += fmt::format(
        "ZeRO-3 node-shared: CPU ranks on one machine (accel's default there) keep the parameter shards side\n"
        "  by side in one buffer they all map, so nothing is gathered. Per rank: its share, what its PSS\n"
        "  shows ({} GB); its RSS also counts the peers' {} GB of parameters it maps. {}\n"
        "  ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0 turn it off (the ZeRO-3 rows: the path GPUs\n"
        "  and several machines take).\n",
        gb_figure(ns.total),
        gb_figure(bytes_per_param(r.dtype, r.optimizer).param * r.params * (r.shard_over() - 1) / r.shard_over()),
        together);
  }
  out += "\n";
  if (!budgeted) {
    out += "Pass --budget SIZE (memory per rank, e.g. --budget 11GB) to see which strategies fit.\n";
    return out;
  }
  if (!e.recommended) {
    out += fmt::format("Recommendation: none fits in {} per rank at N = {}; {}{} or shrink the model.\n", budgets,
                       r.shard_over(), r.has_copies() ? "larger shard groups (--shard_group_size)" : "add ranks",
                       r.offload == Offload::OptimizerAndParams ? "" : ", offload more (--offload)");
    return out;
  }
  const GptPeak& best = *e.recommended;
  const std::string what = offloaded(best);
  if (what.empty())
    out += fmt::format(
        "Recommendation: {}, {} GB per rank: the least-sharded row that fits (it communicates least), without\n"
        "checkpointing where that fits (checkpointing recomputes each block's forward in backward).\n",
        row_label(best), gb_figure(best.total));
  else
    out += fmt::format(
        "Recommendation: {}{} with the {} offloaded,\n"
        "{} GB per rank and {} GB of host memory: the least-sharded row that fits (it communicates least),\n"
        "without checkpointing where that fits (checkpointing recomputes each block's forward in backward).\n",
        zero::info(best.strategy).short_label, best.checkpoint ? " + checkpointing" : "", what, gb_figure(best.total),
        gb_figure(best.cpu));
  return out;
}

}  // namespace accel::cli
