// infer_auto_device_map and its helpers (device_map.h).
#include "dispatch/device_map.h"
#include "base/error.h"

#include "sharding/unit.h"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <stdexcept>
#include <unordered_set>

namespace accel {
namespace {

std::string join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::int64_t tensor_bytes(const at::Tensor& t, std::optional<c10::ScalarType> dtype) {
  const auto size = dtype && at::isFloatingType(t.scalar_type()) ? c10::elementSize(*dtype) : t.element_size();
  return t.numel() * static_cast<std::int64_t>(size);
}

// The module's class without namespaces: "accel::examples::BlockImpl" -> "BlockImpl".
std::string unqualified(const std::string& name) {
  auto pos = name.rfind("::");
  return pos == std::string::npos ? name : name.substr(pos + 2);
}

bool matches_no_split(const torch::nn::Module& m, const std::vector<std::string>& no_split) {
  const std::string full = m.name(), base = unqualified(full);
  const std::string stem = base.size() > 4 && base.ends_with("Impl") ? base.substr(0, base.size() - 4) : base;
  for (const auto& n : no_split)
    if (n == full || n == base || n == stem) return true;
  return false;
}

// Whether every parameter of m is inside an accel unit within m (m itself included).
bool only_units(torch::nn::Module& m) {
  std::unordered_set<const void*> covered;
  bool any_unit = false;
  for (const auto& sub : m.modules(/*include_self=*/true))
    if (sharding::find_unit(sub.get())) {
      any_unit = true;
      for (const auto& p : sub->parameters()) covered.insert(p.unsafeGetTensorImpl());
    }
  if (!any_unit) return false;
  for (const auto& p : m.parameters())
    if (!covered.count(p.unsafeGetTensorImpl())) return false;
  return true;
}

struct Planner {
  const std::vector<std::string>& no_split;
  std::optional<c10::ScalarType> dtype;
  std::unordered_set<const void*> seen;
  ModelPlan plan;

  std::int64_t bytes_once(const at::Tensor& t) {
    if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) return 0;
    return tensor_bytes(t, dtype);
  }
  void walk(torch::nn::Module& m, const std::string& prefix) {
    if (sharding::find_unit(&m) || (matches_no_split(m, no_split) && only_units(m))) {
      PlacementGroup g{prefix, &m, 0};
      for (const auto& p : m.parameters()) g.bytes += bytes_once(p);
      for (const auto& b : m.buffers()) g.bytes += bytes_once(b);
      plan.largest_group_bytes = std::max(plan.largest_group_bytes, g.bytes);
      plan.total_bytes += g.bytes;
      plan.groups.push_back(std::move(g));
      return;
    }
    for (const auto& p : m.named_parameters(false)) plan.rest_bytes += bytes_once(p.value());
    for (const auto& b : m.named_buffers(false)) plan.rest_bytes += bytes_once(b.value());
    for (const auto& c : m.named_children()) walk(*c.value(), join(prefix, c.key()));
  }
};

std::int64_t available_cpu_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// The places in order (GPUs by index, then cpu) with their budgets.
std::vector<std::pair<std::string, std::int64_t>> memory_places(const MaxMemory& max_memory) {
  std::vector<std::pair<int, std::int64_t>> gpus;
  std::optional<std::int64_t> cpu;
  for (const auto& [k, v] : max_memory) {
    const std::string place = canonical_place(k);
    if (v < 0) throw accel::InvalidArgumentError(fmt::format("max_memory: {} has a negative size", k));
    if (place == "cpu")
      cpu = v;
    else if (place != "disk")
      gpus.emplace_back(std::stoi(place.substr(5)), v);
  }
  std::sort(gpus.begin(), gpus.end());
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const auto& [i, v] : gpus) out.emplace_back(fmt::format("cuda:{}", i), v);
  out.emplace_back("cpu", cpu ? *cpu : available_cpu_memory());
  return out;
}

// The set of places of the tensors under m (empty: it holds none).
std::set<std::string> places_under(torch::nn::Module& m,
                                   const std::map<const torch::nn::Module*, std::string>& group_place,
                                   const std::string& main,
                                   std::map<const torch::nn::Module*, std::set<std::string>>& memo) {
  if (auto it = memo.find(&m); it != memo.end()) return it->second;
  std::set<std::string> out;
  if (auto g = group_place.find(&m); g != group_place.end()) {
    out.insert(g->second);
  } else {
    if (!m.named_parameters(false).is_empty() || !m.named_buffers(false).is_empty()) out.insert(main);
    for (const auto& c : m.named_children())
      for (const auto& p : places_under(*c.value(), group_place, main, memo)) out.insert(p);
  }
  memo[&m] = out;
  return out;
}

void emit(torch::nn::Module& m, const std::string& prefix,
          const std::map<const torch::nn::Module*, std::string>& group_place, const std::string& main,
          std::map<const torch::nn::Module*, std::set<std::string>>& memo, DeviceMap& out) {
  auto here = places_under(m, group_place, main, memo);
  if (here.empty()) return;
  if (here.size() == 1) {
    out[prefix] = *here.begin();
    return;
  }
  for (const auto& p : m.named_parameters(false)) out[join(prefix, p.key())] = main;
  for (const auto& b : m.named_buffers(false)) out[join(prefix, b.key())] = main;
  for (const auto& c : m.named_children()) emit(*c.value(), join(prefix, c.key()), group_place, main, memo, out);
}

}  // namespace

std::int64_t parse_size(const std::string& text) {
  const std::string t = trim(text);
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  const std::string number = t.substr(0, i);
  std::string unit = trim(t.substr(i));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto u = units.find(unit);
  double value = 0;
  try {
    std::size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) throw accel::InvalidArgumentError(number);
  } catch (const std::exception&) {
    throw accel::InvalidArgumentError(
        fmt::format("size '{}': expected a number and a unit such as 2GB, 1.5GiB, 300MB", text));
  }
  if (u == units.end() || value < 0)
    throw accel::InvalidArgumentError(
        fmt::format("size '{}': unknown unit '{}' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", text, unit));
  const double bytes = value * u->second;
  if (!(bytes < 9.2e18))  // (past int64: llround's result would be unspecified)
    throw accel::InvalidArgumentError(fmt::format("size '{}' is too large", text));
  return static_cast<std::int64_t>(std::llround(bytes));
}

std::string canonical_place(const std::string& text) {
  const std::string t = trim(text);
  if (t == "cpu" || t == "disk") return t;
  auto all_digits = [](const std::string& s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  };
  if (t == "cuda") return "cuda:0";
  if (t.starts_with("cuda:") && all_digits(t.substr(5))) return fmt::format("cuda:{}", std::stoi(t.substr(5)));
  if (all_digits(t)) return fmt::format("cuda:{}", std::stoi(t));
  throw accel::InvalidArgumentError(fmt::format("unknown device '{}' (expected cpu, disk, cuda or cuda:N)", text));
}

MaxMemory parse_max_memory(const std::string& text) {
  MaxMemory out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos)
      throw accel::InvalidArgumentError(
          fmt::format("max_memory '{}': expected place=size items such as cpu=2GB", item));
    out[canonical_place(item.substr(0, eq))] = parse_size(item.substr(eq + 1));
  }
  return out;
}

ModelPlan plan_model(torch::nn::Module& model, const std::vector<std::string>& no_split,
                     std::optional<c10::ScalarType> dtype) {
  Planner p{no_split, dtype, {}, {}};
  p.walk(model, "");
  p.plan.total_bytes += p.plan.rest_bytes;
  return p.plan;
}

DeviceMap infer_auto_device_map(torch::nn::Module& model, const MaxMemory& max_memory,
                                const std::vector<std::string>& no_split, const std::string& strategy,
                                std::optional<c10::ScalarType> dtype) {
  if (strategy != "auto" && strategy != "balanced" && strategy != "sequential")
    throw accel::InvalidArgumentError(
        fmt::format("infer_auto_device_map: unknown strategy '{}' (auto, balanced, sequential)", strategy));
  const ModelPlan plan = plan_model(model, no_split, dtype);
  auto places = memory_places(max_memory);
  // The main device: the first place where the model's own code (outside the groups) fits.
  std::size_t main = 0;
  while (main < places.size() && plan.rest_bytes > places[main].second) ++main;
  if (main == places.size())
    throw accel::InvalidArgumentError(fmt::format(
        "infer_auto_device_map: the model's parameters outside its units ({} bytes) fit on no device of max_memory "
        "(cpu: {} bytes); only accel units can go to disk",
        plan.rest_bytes, places.back().second));
  places[main].second -= plan.rest_bytes;
  const std::size_t gpus = places.size() - 1;
  if (strategy != "sequential" && gpus >= 2) {
    const std::int64_t share =
        (plan.total_bytes + static_cast<std::int64_t>(gpus) - 1) / static_cast<std::int64_t>(gpus) +
        plan.largest_group_bytes;
    // (The share caps what a GPU holds in all: the main one holds the model's own part too.)
    for (std::size_t i = 0; i + 1 < gpus; ++i)
      places[i].second =
          std::min(places[i].second, std::max<std::int64_t>(0, share - (i == main ? plan.rest_bytes : 0)));
  }
  std::map<const torch::nn::Module*, std::string> group_place;
  auto fill = [&](const std::vector<std::pair<std::string, std::int64_t>>& budgets) {
    group_place.clear();
    auto left = budgets;
    std::size_t cursor = 0;
    bool spilled = false;
    for (const auto& g : plan.groups) {
      while (cursor < left.size() && g.bytes > left[cursor].second) ++cursor;
      if (cursor == left.size()) {
        group_place[g.module] = "disk";
        spilled = true;
      } else {
        group_place[g.module] = left[cursor].first;
        left[cursor].second -= g.bytes;
      }
    }
    return spilled;
  };
  if (fill(places)) {
    // A disk group is paged into cpu memory while it runs: keep room for the largest one.
    auto reserved = places;
    reserved.back().second = std::max<std::int64_t>(0, reserved.back().second - plan.largest_group_bytes);
    fill(reserved);
  }
  DeviceMap out;
  std::map<const torch::nn::Module*, std::set<std::string>> memo;
  emit(model, "", group_place, places[main].first, memo, out);
  if (out.empty()) out[""] = places[main].first;
  return out;
}

std::string to_string(const DeviceMap& map, torch::nn::Module* model) {
  std::vector<std::pair<std::string, std::string>> items(map.begin(), map.end());
  if (model) {
    std::map<std::string, std::size_t> order;
    std::size_t i = 0;
    for (const auto& m : model->named_modules()) order.emplace(m.key(), i++);
    for (const auto& p : model->named_parameters()) order.emplace(p.key(), i++);
    for (const auto& b : model->named_buffers()) order.emplace(b.key(), i++);
    std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
      auto ia = order.count(a.first) ? order[a.first] : i, ib = order.count(b.first) ? order[b.first] : i;
      return ia < ib;
    });
  }
  std::string s = "{";
  for (std::size_t k = 0; k < items.size(); ++k)
    s += fmt::format("{}{}: {}", k ? ", " : "", items[k].first.empty() ? "\"\"" : items[k].first, items[k].second);
  return s + "}";
}

}  // namespace accel
