// `accel bench`'s pure part: parsing its lists, planning its runs, their formulas and records.
#include "cli/bench_plan.h"

#include "accelerator/config_text.h"
#include "cli/estimate_memory.h"
#include "zero/spec.h"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

namespace accel::cli {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    out.push_back(item);
  }
  if (!text.empty() && text.back() == ',') out.emplace_back();
  return out;
}

const std::vector<std::string>& bench_strategies() {
  static const std::vector<std::string> names = {"DDP",        "ZERO_1",        "ZERO_2",   "ZERO_3",
                                                 "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
  return names;
}

zero::Strategy strategy_of(const std::string& name) {
  if (name == "DDP" || name == "NO_SHARD") return zero::Strategy::NoShard;
  if (name == "ZERO_1") return zero::Strategy::Zero1;
  if (name == "ZERO_2" || name == "SHARD_GRAD_OP") return zero::Strategy::Zero2;
  if (name == "ZERO_3" || name == "FULL_SHARD") return zero::Strategy::Zero3;
  if (name == "HYBRID_SHARD") return zero::Strategy::HybridShard;
  throw BenchError(fmt::format("unknown strategy '{}'", name));
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

std::vector<int> parse_rank_list(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return BenchError(
        fmt::format("--num_processes '{}': {}; give a comma-separated list of rank counts, e.g. "
                    "--num_processes 1,2,4",
                    text, why));
  };
  std::vector<int> out;
  for (const auto& item : split_commas(text)) {
    if (item.empty()) throw bad("an empty entry");
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 1 || v > 1'000'000)
      throw bad(fmt::format("'{}' is not a whole number of ranks (1 or more)", item));
    if (std::find(out.begin(), out.end(), static_cast<int>(v)) != out.end())
      throw bad(fmt::format("{} is listed twice", v));
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) throw bad("no rank counts");
  std::sort(out.begin(), out.end());
  return out;
}

std::string normalize_strategy(const std::string& name) {
  std::string u = config_detail::upper(name);
  std::replace(u.begin(), u.end(), '-', '_');
  if (u == "ZERO1" || u == "ZERO2" || u == "ZERO3") u = u.substr(0, 4) + "_" + u.substr(4);
  for (const auto& n : bench_strategies())
    if (u == n) return n;
  throw BenchError(fmt::format(
      "--strategies: unknown strategy '{}'; use step_bench's names: {} (case-insensitive; zero1, zero2, "
      "zero3 also work){}",
      name, join(bench_strategies(), ", "),
      u == "PLAIN" ? " (plain is the 1-rank libtorch loop of step_bench, not a strategy that scales)" : ""));
}

std::vector<std::string> parse_strategy_list(const std::string& text) {
  std::vector<std::string> out;
  for (const auto& item : split_commas(text)) {
    if (item.empty())
      throw BenchError(fmt::format("--strategies '{}': an empty entry; e.g. --strategies DDP,ZERO_2,ZERO_3", text));
    const std::string s = normalize_strategy(item);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  if (out.empty()) throw BenchError("--strategies is empty; e.g. --strategies DDP,ZERO_2,ZERO_3");
  return out;
}

std::vector<std::string> parse_precision_list(const std::string& text) {
  std::vector<std::string> out;
  for (const auto& item : split_commas(text)) {
    std::string p = item;
    for (auto& c : p) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (p == "no") p = "fp32";
    if (p != "fp32" && p != "bf16" && p != "fp16" && p != "fp8")
      throw BenchError(
          fmt::format("--precision: unknown precision '{}'; use fp32, bf16, fp16 or fp8 (a "
                      "comma-separated list runs each)",
                      item));
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  if (out.empty()) throw BenchError("--precision is empty; e.g. --precision fp32");
  return out;
}

std::string BenchRun::label() const {
  std::string s = fmt::format("{} {}, {} rank{}", strategy, precision, ranks, ranks == 1 ? "" : "s");
  if (machines) s += fmt::format(" on {} machine{}", *machines, *machines == 1 ? "" : "s");
  return s;
}

std::string BenchRun::slug() const { return fmt::format("{}_{}_n{}", strategy, precision, ranks); }

std::vector<BenchRun> plan_bench(const BenchRequest& req) {
  if (req.ranks.empty()) throw BenchError("--num_processes is empty; e.g. --num_processes 1,2,4");
  std::vector<BenchRun> runs;
  for (int n : req.ranks) {
    std::optional<int> machines = req.num_machines;
    if (machines && n % *machines != 0)
      throw BenchError(
          fmt::format("--num_processes {} does not split evenly over --num_machines {}; list rank "
                      "counts that are multiples of {}",
                      n, *machines, *machines));
    if (!machines && (!req.hosts.empty() || req.ranks_per_machine)) {
      const int slots = req.ranks_per_machine ? *req.ranks_per_machine : req.hosts.front().slots;
      const std::string per = req.ranks_per_machine ? fmt::format("--ranks_per_machine {}", slots)
                                                    : fmt::format("hostfile {}, {} slots each", req.hostfile, slots);
      const int m = (n + slots - 1) / slots;
      if (!req.hosts.empty() && m > static_cast<int>(req.hosts.size()))
        throw BenchError(
            fmt::format("--num_processes {} needs {} machines ({}), but hostfile {} lists {}; "
                        "add hosts or drop {} from --num_processes",
                        n, m, per, req.hostfile, req.hosts.size(), n));
      if (n % m != 0)
        throw BenchError(fmt::format(
            "--num_processes {} does not split evenly over the {} machines it needs ({}); use a multiple of {}", n, m,
            per, m));
      machines = m;
    }
    for (const auto& s : req.strategies)
      for (const auto& p : req.precisions) runs.push_back({s, p, n, machines});
  }
  return runs;
}

std::vector<std::string> launch_argv(const BenchRequest& req, const BenchRun& run) {
  std::vector<std::string> a = {"launch", "--num_processes", std::to_string(run.ranks)};
  if (run.machines) a.insert(a.end(), {"--num_machines", std::to_string(*run.machines)});
  if (!req.hostfile.empty()) a.insert(a.end(), {"--hostfile", req.hostfile});
  a.insert(a.end(), req.launch_args.begin(), req.launch_args.end());
  a.insert(a.end(), {req.step_bench, "--strategy", run.strategy, "--precision", run.precision, "--json"});
  a.insert(a.end(), req.step_args.begin(), req.step_args.end());
  return a;
}

double StepResult::get(const std::string& key) const {
  auto it = num.find(key);
  if (it == num.end())
    throw BenchError(
        fmt::format("step_bench's JSON has no '{}' (is step_bench older than this accel? rebuild it)", key));
  return it->second;
}

StepResult parse_step_output(const std::string& out) {
  std::istringstream in(out);
  std::optional<nlohmann::json> last;
  for (std::string line; std::getline(in, line);) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] != '{') continue;
    auto j = nlohmann::json::parse(line.substr(b), nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step_ms")) last = std::move(j);
  }
  if (!last) throw BenchError("step_bench printed no JSON line with step_ms");
  StepResult r;
  for (const auto& [k, v] : last->items()) {
    if (v.is_number())
      r.num[k] = v.get<double>();
    else if (v.is_boolean())
      r.num[k] = v.get<bool>() ? 1.0 : 0.0;
    else if (v.is_string())
      r.str[k] = v.get<std::string>();
  }
  return r;
}

std::optional<double> traffic_formula(const std::string& strategy, const std::string& precision, double params,
                                      int ranks, bool node_shared_params) {
  const auto& info = zero::info(strategy_of(strategy));
  if (info.hybrid) return std::nullopt;
  if (ranks <= 1) return 0.0;
  const double f = (ranks - 1.0) / ranks;
  // Reductions travel in fp32 at every precision step_bench runs; gathers in the parameters' dtype.
  const double reduce_b = 4;
  const double gather_b = precision == "fp32" ? 4 : (precision == "fp8" && info.shards_parameters) ? 1 : 2;
  if (!info.shards_optimizer) return 2 * params * f * reduce_b;  // all-reduce
  // Node-shared parameters (one node, ACCEL_NODE_SHARED_PARAMS): the shards together are the full
  // parameters, so nothing is gathered, and the step writes each shard in place.
  const int gathers = info.shards_parameters ? (node_shared_params ? 0 : 2) : 1;
  return (params * reduce_b + gathers * params * gather_b) * f;  // reduce-scatter + all-gather(s)
}

double traffic_formula_bytes(const std::string& strategy, const std::string& precision, double params, int ranks,
                             bool node_shared_params) {
  return traffic_formula(strategy, precision, params, ranks, node_shared_params).value_or(0.0);
}

double memory_formula_bytes(const std::string& strategy, const std::string& precision, double params, int ranks,
                            int ranks_per_machine) {
  zero::Strategy s = strategy_of(strategy);
  int n = ranks;
  if (s == zero::Strategy::HybridShard) s = zero::Strategy::Zero3, n = std::max(1, ranks_per_machine);
  const BytesPerParam b = bytes_per_param(parse_dtype(precision), OptimizerKind::AdamW);
  const StrategyCoefficients c = coefficients(s, b, Offload::None);
  return (c.device_rep + c.device_shard / n) * params;
}

std::string bench_record(const BenchRun& run, const StepResult& r, const StepResult& base) {
  const double params = r.get("params"), step_ms = r.get("step_ms"), batch = r.get("batch"), seq = r.get("seq");
  const int ranks = static_cast<int>(r.get("ranks"));
  const double sps = step_ms > 0 ? batch * ranks / (step_ms / 1e3) : 0;
  const double base_ranks = base.get("ranks"), base_ms = base.get("step_ms");
  const double base_sps = base_ms > 0 ? base.get("batch") * base_ranks / (base_ms / 1e3) : 0;
  const double eff = base_sps > 0 ? (sps / ranks) / (base_sps / base_ranks) : 0;
  const int nodes = r.num.count("nodes") ? static_cast<int>(r.get("nodes")) : 1;
  const int per_node = r.num.count("ranks_per_node") ? static_cast<int>(r.get("ranks_per_node")) : ranks;
  nlohmann::ordered_json j;
  j["strategy"] = run.strategy;
  j["precision"] = run.precision;
  j["ranks"] = ranks;
  j["nodes"] = nodes;
  j["params"] = static_cast<long long>(params);
  const auto whole = [&](const char* k) { return static_cast<long long>(r.get(k)); };
  j["model"] = {{"vocab", whole("vocab")},
                {"d_model", whole("d_model")},
                {"heads", whole("heads")},
                {"layers", whole("layers")},
                {"seq", whole("seq")}};
  j["batch_per_rank"] = whole("batch");
  j["device"] = r.str.count("device") ? r.str.at("device") : "cpu";
  j["step_ms"] = step_ms;
  j["wait_ms"] = r.num.count("wait_ms") ? r.get("wait_ms") : 0.0;
  j["samples_per_s"] = sps;
  j["tokens_per_s"] = sps * seq;
  j["efficiency"] = eff;
  j["efficiency_base_ranks"] = static_cast<int>(base_ranks);
  // step_bench's model FLOPs per step and MFU (null where it knows no peak: the CPU without --peak_tflops).
  const auto number_or_null = [&](const char* k) {
    return r.num.count(k) ? nlohmann::json(r.get(k)) : nlohmann::json();
  };
  j["model_flops"] = number_or_null("model_flops");
  j["mfu"] = number_or_null("mfu");
  j["peak_bytes"] = {{"total", r.get("counted_peak")},
                     {"parameters", r.get("parameters")},
                     {"gradients", r.get("gradients")},
                     {"optimizer", r.get("optimizer")},
                     {"gathered", r.get("gathered")},
                     {"activations", r.get("activations")},
                     {"other", r.get("other")},
                     {"rss", r.get("peak_rss")},
                     {"cuda", r.num.count("cuda_peak") ? r.get("cuda_peak") : 0.0}};
  const double states = r.get("parameters") + r.get("gradients") + r.get("optimizer");
  j["model_states_bytes"] = states;
  j["model_states_formula_bytes"] = memory_formula_bytes(run.strategy, run.precision, params, ranks, per_node);
  const double moved = r.get("moved");
  j["moved_bytes"] = moved;
  const bool node_shared = r.num.count("node_shared_bytes") && r.get("node_shared_bytes") > 0;
  j["node_shared_params"] = node_shared;
  if (auto f = traffic_formula(run.strategy, run.precision, params, ranks, node_shared)) {
    j["moved_formula_bytes"] = *f;
    j["moved_ratio"] = *f > 0 ? nlohmann::json(moved / *f) : nlohmann::json(nullptr);
  } else {
    j["moved_formula_bytes"] = nullptr;
    j["moved_ratio"] = nullptr;
  }
  return j.dump();
}

std::string summary_table(const std::vector<std::string>& records) {
  std::string out =
      "| strategy | precision | ranks | nodes | step ms | samples/s | efficiency | model states MiB (formula) | "
      "moved MiB (x formula) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  const double mib = 1048576.0;
  for (const auto& line : records) {
    const auto j = nlohmann::json::parse(line);
    std::string moved = fmt::format("{:.2f}", j["moved_bytes"].get<double>() / mib);
    if (j["moved_ratio"].is_number()) moved += fmt::format(" ({:.3f})", j["moved_ratio"].get<double>());
    out += fmt::format("| {} | {} | {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.1f} ({:.1f}) | {} |\n",
                       j["strategy"].get<std::string>(), j["precision"].get<std::string>(), j["ranks"].get<int>(),
                       j["nodes"].get<int>(), j["step_ms"].get<double>(), j["samples_per_s"].get<double>(),
                       j["efficiency"].get<double>(), j["model_states_bytes"].get<double>() / mib,
                       j["model_states_formula_bytes"].get<double>() / mib, moved);
  }
  return out;
}

}  // namespace accel::cli
