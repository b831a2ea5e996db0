#include "zero/unit_report.h"

#include "sharding/unit.h"
#include "zero/engine.h"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <set>
#include <unordered_set>
#include <vector>

namespace accel::zero {
namespace {

struct Size {
  std::int64_t numel = 0, bytes = 0;
};

std::string human_bytes(std::int64_t b) {
  if (b >= (std::int64_t{1} << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (std::int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1 << 10));
}

// The parameters of m's subtree that are in the root unit (each tensor once).
Size unmarked(const torch::nn::Module& m, const std::unordered_set<const void*>& root) {
  Size s;
  std::unordered_set<const void*> seen;
  for (const auto& p : m.parameters(/*recurse=*/true))
    if (root.count(p.unsafeGetTensorImpl()) && seen.insert(p.unsafeGetTensorImpl()).second) {
      s.numel += p.numel();
      s.bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
    }
  return s;
}

struct Candidate {
  std::string path;
  Size size;
};

// Submodules worth marking: descend while a submodule holds more than half of the root unit (marking
// it would leave most of the root in one unit), else it is a candidate.
void candidates(const torch::nn::Module& m, const std::string& prefix, const std::unordered_set<const void*>& root,
                std::int64_t root_bytes, std::vector<Candidate>& out) {
  for (const auto& kv : m.named_children()) {
    const Size s = unmarked(*kv.value(), root);
    if (s.numel == 0) continue;
    const std::string path = prefix + kv.key();
    if (2 * s.bytes > root_bytes && !kv.value()->children().empty())
      candidates(*kv.value(), path + ".", root, root_bytes, out);
    else
      out.push_back({path, s});
  }
}

}  // namespace

std::optional<std::string> unit_report(const Engine& engine) {
  if (!engine.plan().params_sharded || engine.units().empty()) return std::nullopt;
  std::unordered_set<const void*> root;
  Size root_size, total;
  for (const auto& f : engine.flats())
    for (const auto& p : f.flat_param->params()) {
      const std::int64_t bytes = p.numel() * static_cast<std::int64_t>(p.element_size());
      total.numel += p.numel();
      total.bytes += bytes;
      if (f.unit != 0) continue;
      root.insert(p.unsafeGetTensorImpl());
      root_size.numel += p.numel();
      root_size.bytes += bytes;
    }
  if (root_size.bytes == 0 || 2 * root_size.bytes < total.bytes) return std::nullopt;

  const std::size_t units = engine.units().size() - 1;
  // Modules the model marks with accel::unit that the wrap policy did not take (their parameters
  // are in the root): the fix is the policy, not more marking.
  std::set<std::string> excluded_types;
  std::size_t excluded = 0;
  for (const auto& m : engine.units()[0].module->modules(/*include_self=*/false))
    if (sharding::find_unit(m.get()) && unmarked(*m, root).numel > 0) {
      ++excluded;
      const std::string type = m->name();  // "ns::Type": the policy matches the last part too
      excluded_types.insert(type.substr(type.rfind(':') == std::string::npos ? 0 : type.rfind(':') + 1));
    }
  std::string none = " (the model marks none)";
  if (units == 0 && excluded > 0) {
    std::string types;
    for (const auto& t : excluded_types) types += (types.empty() ? "" : ", ") + t;
    none = fmt::format(" (the model marks {} module{}, of type {}, but the wrap policy took none of them)", excluded,
                       excluded == 1 ? "" : "s", types);
  }
  std::string msg = fmt::format(
      "accel: {} shards parameters, but {:.0f}% of this model's parameters ({} parameters, {}) are in no "
      "accel::unit{}. They form the root unit, which stays gathered whole on every rank from step to step: "
      "DDP's parameter memory under a sharded strategy's name. Only modules marked with accel::unit are gathered "
      "one at a time.",
      info(engine.spec().strategy).label,
      100.0 * static_cast<double>(root_size.bytes) / static_cast<double>(total.bytes), root_size.numel,
      human_bytes(root_size.bytes),
      units == 0 ? none : fmt::format(" (beside {} unit{})", units, units == 1 ? "" : "s"));

  std::vector<Candidate> found;
  candidates(*engine.units()[0].module, "", root, root_size.bytes, found);
  std::stable_sort(found.begin(), found.end(),
                   [](const Candidate& a, const Candidate& b) { return a.size.bytes > b.size.bytes; });
  if (excluded > 0) {
    std::string types;
    for (const auto& t : excluded_types) types += (types.empty() ? "" : ",") + t;
    msg += fmt::format(
        " Add their type to the wrap policy (fsdp_transformer_layer_cls_to_wrap: {} in an FSDP config; "
        "a comma-separated list), or leave the class names out: TRANSFORMER_BASED_WRAP without them takes "
        "every marked module.",
        types);
    return msg;
  }
  if (found.empty()) {
    msg += " They are registered on the model itself; move them into submodules and mark those.";
  } else {
    constexpr std::size_t kShown = 4;
    msg += " The largest unmarked submodules:";
    for (std::size_t i = 0; i < std::min(found.size(), kShown); ++i)
      msg += fmt::format("\n  {}: {} parameters ({})", found[i].path, found[i].size.numel,
                         human_bytes(found[i].size.bytes));
    if (found.size() > kShown) msg += fmt::format("\n  ... and {} more", found.size() - kShown);
    msg +=
        "\nMark each block where the model registers it and call it through the returned handle, e.g. "
        "blocks.push_back(accel::unit(register_module(\"h\" + std::to_string(i), std::make_shared<BlockImpl>(...)))); "
        "then blocks[i](x) in forward (see the comment at the top of sharding/unit.h).";
  }
  return msg;
}

}  // namespace accel::zero
