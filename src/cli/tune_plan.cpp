#include "cli/tune_plan.h"

#include "cli/bench_plan.h"
#include "cli/config_questions.h"
#include "cli/estimate_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace accel::cli {
namespace {

const std::vector<std::string> kStrategies = {"DDP", "ZERO_1", "ZERO_2", "ZERO_3", "HYBRID_SHARD"};
const std::vector<std::string> kOffloads = {"none", "optimizer", "optimizer+params"};
constexpr double kDefaultBucketMib = 25;

// accel's strategies are points of one table (zero/spec.h): FSDP's names are ZeRO's stages.
std::string canonical_strategy(const std::string& name) {
  const std::string s = normalize_strategy(name);
  if (s == "FULL_SHARD") return "ZERO_3";
  if (s == "SHARD_GRAD_OP") return "ZERO_2";
  if (s == "NO_SHARD") return "DDP";
  if (std::find(kStrategies.begin(), kStrategies.end(), s) == kStrategies.end())
    throw TuneError(
        fmt::format("--strategies: '{}' is not a strategy accel tune searches (DDP, ZERO_1, ZERO_2, "
                    "ZERO_3, HYBRID_SHARD, or FSDP's names for them)",
                    name));
  return s;
}

int stage_of(const std::string& s) { return s == "DDP" ? 0 : s == "ZERO_1" ? 1 : s == "ZERO_2" ? 2 : 3; }

zero::Strategy strategy_enum(const std::string& s) {
  return s == "DDP"      ? zero::Strategy::NoShard
         : s == "ZERO_1" ? zero::Strategy::Zero1
         : s == "ZERO_2" ? zero::Strategy::Zero2
                         : zero::Strategy::Zero3;
}

Offload offload_enum(const std::string& o) {
  return o == "none" ? Offload::None : o == "optimizer" ? Offload::Optimizer : Offload::OptimizerAndParams;
}

std::string fmt_num(double v) { return v == std::floor(v) ? fmt::format("{:.0f}", v) : fmt::format("{:g}", v); }

std::int64_t bucket_elements(double mib) { return static_cast<std::int64_t>(std::llround(mib * 1048576.0 / 4.0)); }

std::string gb_text(double bytes) { return format_gb(bytes) + " GB"; }

}  // namespace

std::string TuneCandidate::label() const {
  std::string s =
      fmt::format("{} mb {} x acc {}, bucket {} MiB", strategy, micro_batch, accumulation, fmt_num(bucket_mib));
  if (checkpointing) s += ", ckpt";
  if (offload != "none") s += ", offload " + offload;
  return s;
}

bool TuneCandidate::operator==(const TuneCandidate& o) const {
  return strategy == o.strategy && micro_batch == o.micro_batch && accumulation == o.accumulation &&
         bucket_mib == o.bucket_mib && checkpointing == o.checkpointing && offload == o.offload;
}

const char* to_string(TuneResult::Status s) {
  switch (s) {
    case TuneResult::Status::Ok: return "ok";
    case TuneResult::Status::OutOfMemory: return "does not fit: out of memory";
    case TuneResult::Status::OverBudget: return "does not fit: over the budget (measured)";
    case TuneResult::Status::Failed: return "failed";
  }
  return "?";
}

std::string samples_text(double v) { return fmt::format("{:.{}f}", v, v >= 100 ? 1 : v >= 10 ? 2 : 3); }

TuneRequest with_defaults(TuneRequest r) {
  if (r.num_processes < 1) throw TuneError("--num_processes must be >= 1");
  if (r.num_machines < 1 || r.num_processes % r.num_machines != 0)
    throw TuneError(fmt::format("--num_machines {} must divide --num_processes {}", r.num_machines, r.num_processes));
  if (r.precision != "no" && r.precision != "fp16" && r.precision != "bf16")
    throw TuneError(fmt::format("mixed_precision '{}': accel tune tunes fp32 (no), fp16 and bf16 runs", r.precision));
  if (r.global_batch < r.num_processes)
    throw TuneError(fmt::format("--global_batch {} is smaller than the {} ranks (one sample per rank at least)",
                                r.global_batch, r.num_processes));
  if (!(r.params >= 1)) throw TuneError("the program reported no parameters (the probe run found no model)");
  std::vector<std::string> strategies;
  for (const auto& s : r.strategies) {
    const std::string c = canonical_strategy(s);
    if (std::find(strategies.begin(), strategies.end(), c) == strategies.end()) strategies.push_back(c);
  }
  if (strategies.empty()) {
    strategies = {"DDP", "ZERO_1", "ZERO_2", "ZERO_3"};
    if (r.num_machines > 1) strategies.push_back("HYBRID_SHARD");
  }
  r.strategies = strategies;
  if (r.micro_batches.empty())
    for (std::int64_t mb = 1; mb * r.num_processes <= r.global_batch; mb *= 2)
      r.micro_batches.push_back(static_cast<int>(mb));
  for (int mb : r.micro_batches)
    if (mb < 1) throw TuneError(fmt::format("--micro_batches: {} is not a batch size (>= 1)", mb));
  std::sort(r.micro_batches.begin(), r.micro_batches.end());
  r.micro_batches.erase(std::unique(r.micro_batches.begin(), r.micro_batches.end()), r.micro_batches.end());
  if (r.bucket_mib.empty()) r.bucket_mib = {kDefaultBucketMib};
  for (double b : r.bucket_mib)
    if (!(b >= 0)) throw TuneError(fmt::format("--bucket_mib: {} is not a size in MiB (>= 0)", b));
  if (r.checkpointing.empty()) r.checkpointing = {false, true};
  if (r.offloads.empty()) r.offloads = r.device_cuda ? kOffloads : std::vector<std::string>{"none"};
  for (const auto& o : r.offloads)
    if (std::find(kOffloads.begin(), kOffloads.end(), o) == kOffloads.end())
      throw TuneError(fmt::format("--offload: '{}' is not one of none, optimizer, optimizer+params", o));
  if (r.budget_bytes && !(*r.budget_bytes > 0)) throw TuneError("--budget must be more than 0");
  return r;
}

double model_state_bytes(const TuneRequest& r, const TuneCandidate& c) {
  const Dtype dtype = r.precision == "bf16" ? Dtype::Bf16 : r.precision == "fp16" ? Dtype::Fp16 : Dtype::Fp32;
  const BytesPerParam b = bytes_per_param(dtype, OptimizerKind::AdamW);
  // HYBRID_SHARD stores what ZeRO-3 stores over the ranks of one machine (estimate_memory.h).
  const int n = c.strategy == "HYBRID_SHARD" ? r.num_processes / r.num_machines : r.num_processes;
  const Accumulation acc{.steps = static_cast<int>(std::max<std::int64_t>(c.accumulation, 1)),
                         .sync_each_batch = candidate_syncs_each_batch(c)};
  const StrategyCoefficients k = coefficients(strategy_enum(c.strategy), b, offload_enum(c.offload), acc);
  return (k.device_rep + k.device_shard / n) * r.params;
}

TuneGrid plan_tune(const TuneRequest& request) {
  const TuneRequest r = with_defaults(request);
  TuneGrid g;
  for (const auto& s : r.strategies)
    for (int mb : r.micro_batches)
      for (double bucket : r.bucket_mib)
        for (bool ckpt : r.checkpointing)
          for (const auto& off : r.offloads) {
            TuneCandidate c;
            c.strategy = s;
            c.micro_batch = mb;
            c.bucket_mib = bucket;
            c.checkpointing = ckpt;
            c.offload = off;
            const std::int64_t per_step = static_cast<std::int64_t>(mb) * r.num_processes;
            c.accumulation = per_step > 0 ? r.global_batch / per_step : 1;
            std::string why;
            if (r.global_batch % per_step != 0)
              why = fmt::format("micro batch {} x {} ranks does not divide the global batch {}", mb, r.num_processes,
                                r.global_batch);
            else if (s == "HYBRID_SHARD" && r.num_machines == 1)
              why = "HYBRID_SHARD needs several machines";
            else if (s == "HYBRID_SHARD" && bucket != kDefaultBucketMib)
              why = "HYBRID_SHARD's Accelerate YAML has no bucket size";
            else if (s == "HYBRID_SHARD" && off == "optimizer")
              why =
                  "HYBRID_SHARD's Accelerate YAML offloads the optimizer only with the parameters "
                  "(fsdp_offload_params)";
            else if (off != "none" && !r.device_cuda)
              why = "offload on a CPU run changes nothing (the state is in host memory already)";
            else if (off == "optimizer+params" && s != "ZERO_3" && s != "HYBRID_SHARD")
              why = "parameter offload needs ZeRO-3";
            if (why.empty() && r.budget_bytes) {
              const double need = model_state_bytes(r, c);
              if (need > *r.budget_bytes)
                why = fmt::format("model states {} per rank over the budget {} (estimate-memory)", gb_text(need),
                                  gb_text(*r.budget_bytes));
            }
            if (!why.empty()) {
              g.pruned.push_back({c, why});
            } else {
              g.runnable.push_back(c);
              g.model_state_bytes.push_back(model_state_bytes(r, c));
            }
          }
  return g;
}

bool TuneSearch::tried(const TuneCandidate& c, const std::vector<TuneResult>& done) const {
  return std::any_of(done.begin(), done.end(), [&](const TuneResult& d) { return d.candidate == c; });
}

bool TuneSearch::blocked(const TuneCandidate& c, const std::vector<TuneResult>& done) const {
  for (const auto& d : done) {
    const TuneCandidate& o = d.candidate;
    const bool no_fit = d.status == TuneResult::Status::OutOfMemory || d.status == TuneResult::Status::OverBudget;
    if (no_fit && o.strategy == c.strategy && o.checkpointing == c.checkpointing && o.offload == c.offload &&
        o.bucket_mib == c.bucket_mib && o.micro_batch <= c.micro_batch && !(o == c))
      return true;
  }
  return false;
}

std::optional<TuneCandidate> TuneSearch::next(const std::vector<TuneResult>& done) const {
  const auto& all = grid_.runnable;
  auto in_grid = [&](const TuneCandidate& c) { return std::find(all.begin(), all.end(), c) != all.end(); };
  auto fresh = [&](const TuneCandidate& c) { return in_grid(c) && !tried(c, done) && !blocked(c, done); };
  std::vector<std::string> strategies;
  std::vector<int> mbs;
  std::vector<double> buckets;
  for (const auto& c : all) {
    if (std::find(strategies.begin(), strategies.end(), c.strategy) == strategies.end())
      strategies.push_back(c.strategy);
    if (std::find(mbs.begin(), mbs.end(), c.micro_batch) == mbs.end()) mbs.push_back(c.micro_batch);
    if (std::find(buckets.begin(), buckets.end(), c.bucket_mib) == buckets.end()) buckets.push_back(c.bucket_mib);
  }
  std::sort(mbs.rbegin(), mbs.rend());
  const double bucket0 = std::find(buckets.begin(), buckets.end(), kDefaultBucketMib) != buckets.end()
                             ? kDefaultBucketMib
                         : buckets.empty() ? kDefaultBucketMib
                                           : buckets.front();
  auto make = [&](const std::string& s, int mb, double bucket, bool ckpt, const std::string& off) {
    for (const auto& c : all)
      if (c.strategy == s && c.micro_batch == mb && c.bucket_mib == bucket && c.checkpointing == ckpt &&
          c.offload == off)
        return std::optional<TuneCandidate>(c);
    return std::optional<TuneCandidate>();
  };
  auto ok = [](const TuneResult& d) { return d.status == TuneResult::Status::Ok; };
  // 1. Each strategy: the largest micro batch that fits, in the cheapest variant that fits at all.
  const std::vector<std::pair<bool, std::string>> variants = {
      {false, "none"}, {true, "none"}, {false, "optimizer"}, {true, "optimizer"}, {true, "optimizer+params"}};
  for (const auto& s : strategies) {
    bool fits = false;
    for (const auto& [ckpt, off] : variants) {
      for (int mb : mbs) {
        auto c = make(s, mb, bucket0, ckpt, off);
        if (!c || blocked(*c, done)) continue;
        if (!tried(*c, done)) return c;
        auto it = std::find_if(done.begin(), done.end(), [&](const TuneResult& d) { return d.candidate == *c; });
        if (ok(*it)) {
          fits = true;
          break;
        }
      }
      if (fits) break;
    }
  }
  // The best result of each strategy, fastest first.
  std::map<std::string, TuneResult> best;
  for (const auto& d : done)
    if (ok(d) && (!best.count(d.candidate.strategy) || d.samples_per_s > best[d.candidate.strategy].samples_per_s))
      best[d.candidate.strategy] = d;
  std::vector<TuneResult> order;
  for (auto& [s, d] : best) order.push_back(d);
  std::sort(order.begin(), order.end(),
            [](const TuneResult& a, const TuneResult& b) { return a.samples_per_s > b.samples_per_s; });
  if (order.empty()) return std::nullopt;
  // 2. The two fastest strategies' micro batch, climbed: the micro batches next to each one's best (same
  //    variant and bucket); as next() starts again from the best so far, a faster neighbour is climbed
  //    from in turn, so the search stops at the micro batch both of whose neighbours are slower (or
  //    out of memory) instead of measuring every one.
  for (std::size_t k = 0; k < order.size() && k < 2; ++k) {
    const TuneCandidate& b = order[k].candidate;
    const std::size_t at =
        static_cast<std::size_t>(std::find(mbs.begin(), mbs.end(), b.micro_batch) - mbs.begin());  // (largest first)
    for (std::size_t n : {at + 1, at - 1})  // (at - 1 wraps past the end when at is 0)
      if (at < mbs.size() && n < mbs.size())
        if (auto c = make(b.strategy, mbs[n], b.bucket_mib, b.checkpointing, b.offload); c && fresh(*c)) return c;
  }
  // 3. The two fastest strategies' best with each other bucket size (bucket and strategy interact, and
  //    strategies a few percent apart are within one run's noise of each other); then the fastest so
  //    far with checkpointing toggled (at its micro batch and larger ones, which checkpointing may make
  //    fit), then with the other offloads.
  for (std::size_t k = 0; k < order.size() && k < 2; ++k) {
    const TuneCandidate& o = order[k].candidate;
    for (double bucket : buckets)
      if (auto c = make(o.strategy, o.micro_batch, bucket, o.checkpointing, o.offload); c && fresh(*c)) return c;
  }
  std::vector<TuneResult> oks;
  for (const auto& d : done)
    if (ok(d)) oks.push_back(d);
  const TuneCandidate b = std::max_element(oks.begin(), oks.end(), [](const TuneResult& x, const TuneResult& y) {
                            return x.samples_per_s < y.samples_per_s;
                          })->candidate;
  for (int mb : mbs)
    if (mb >= b.micro_batch)
      if (auto c = make(b.strategy, mb, b.bucket_mib, !b.checkpointing, b.offload); c && fresh(*c)) return c;
  for (const auto& off : kOffloads)
    if (auto c = make(b.strategy, b.micro_batch, b.bucket_mib, b.checkpointing, off); c && fresh(*c)) return c;
  return std::nullopt;
}

std::vector<TuneResult> ranked(std::vector<TuneResult> results) {
  std::stable_sort(results.begin(), results.end(), [](const TuneResult& a, const TuneResult& b) {
    const bool ao = a.status == TuneResult::Status::Ok, bo = b.status == TuneResult::Status::Ok;
    if (ao != bo) return ao;
    return ao && a.samples_per_s > b.samples_per_s;
  });
  return results;
}

std::vector<TuneResult> merged(const std::vector<TuneResult>& runs) {
  std::vector<TuneResult> out;
  for (const auto& r : runs) {
    auto it = std::find_if(out.begin(), out.end(), [&](const TuneResult& m) { return m.candidate == r.candidate; });
    if (it == out.end()) {
      out.push_back(r);
      out.back().runs = 1;
      continue;
    }
    TuneResult& m = *it;
    const bool was_ok = m.status == TuneResult::Status::Ok;
    const int n = m.runs;
    m.runs = n + 1;
    m.wall_s += r.wall_s;
    m.peak_bytes = std::max(m.peak_bytes, r.peak_bytes);
    if (!was_ok) continue;  // (the first run that did not end ok stands)
    if (r.status != TuneResult::Status::Ok) {
      m.status = r.status;
      m.detail = r.detail;
      m.samples_per_s = m.step_ms = 0;
      continue;
    }
    m.samples_per_s = (m.samples_per_s * n + r.samples_per_s) / (n + 1);
    m.step_ms = (m.step_ms * n + r.step_ms) / (n + 1);
  }
  return out;
}

std::vector<TuneCandidate> confirm_candidates(const std::vector<TuneResult>& runs, int k) {
  const std::vector<TuneResult> order = ranked(merged(runs));
  std::vector<TuneCandidate> out;
  if (order.empty() || order.front().status != TuneResult::Status::Ok) return out;
  const double best = order.front().samples_per_s;
  for (const auto& m : order)
    if (static_cast<int>(out.size()) < k && m.status == TuneResult::Status::Ok &&
        m.samples_per_s >= (1 - kConfirmWithin) * best)
      out.push_back(m.candidate);
  if (out.size() < 2) out.clear();
  return out;
}

bool candidate_is_json(const TuneCandidate& c) { return c.strategy != "HYBRID_SHARD"; }

bool candidate_syncs_each_batch(const TuneCandidate& c) {
  return candidate_is_json(c) && (c.strategy == "ZERO_2" || c.strategy == "ZERO_3");
}

namespace {

std::string json_config(const TuneCandidate& c, const TuneRequest& r, const std::vector<std::string>& comment) {
  std::string s = "{\n";
  if (!comment.empty()) {
    s += "  \"_comment\": [\n";
    for (std::size_t i = 0; i < comment.size(); ++i) {
      std::string line;
      for (char ch : comment[i]) {
        if (ch == '"' || ch == '\\') line += '\\';
        line += ch;
      }
      s += fmt::format("    \"{}\"{}\n", line, i + 1 < comment.size() ? "," : "");
    }
    s += "  ],\n";
  }
  s += fmt::format("  \"train_batch_size\": {},\n", r.global_batch);
  s += fmt::format("  \"train_micro_batch_size_per_gpu\": {},\n", c.micro_batch);
  s += fmt::format("  \"gradient_accumulation_steps\": {},\n", c.accumulation);
  if (r.gradient_clipping > 0) s += fmt::format("  \"gradient_clipping\": {},\n", fmt_num(r.gradient_clipping));
  if (r.precision == "bf16") s += "  \"bf16\": {\"enabled\": true},\n";
  if (r.precision == "fp16") s += "  \"fp16\": {\"enabled\": true},\n";
  if (c.checkpointing) s += "  \"activation_checkpointing\": {},\n";
  s += fmt::format("  \"zero_optimization\": {{\n    \"stage\": {},\n    \"reduce_bucket_size\": {}",
                   stage_of(c.strategy), bucket_elements(c.bucket_mib));
  if (c.offload != "none") s += ",\n    \"offload_optimizer\": {\"device\": \"cpu\"}";
  if (c.offload == "optimizer+params") s += ",\n    \"offload_param\": {\"device\": \"cpu\"}";
  s += "\n  }\n}\n";
  return s;
}

ConfigAnswers answers_for(const TuneCandidate& c, const TuneRequest& r, const std::string& strategy) {
  ConfigAnswers a;
  a.num_machines = r.num_machines;
  a.num_processes = r.num_processes;
  a.use_cpu = !r.device_cuda;
  a.strategy = strategy;
  a.offload_optimizer = c.offload == "none" ? "none" : "cpu";
  a.offload_params = c.offload == "optimizer+params" ? "cpu" : "none";
  a.gradient_clipping = r.gradient_clipping;
  a.layer_types = {};  // the modules the program marks accel::unit
  a.activation_checkpointing = c.checkpointing;
  a.gradient_accumulation_steps = c.accumulation;
  a.mixed_precision = r.precision;
  return a;
}

std::string commented(const std::vector<std::string>& lines, const std::string& body) {
  std::string s;
  for (const auto& l : lines) s += "# " + l + "\n";
  return s + body;
}

}  // namespace

std::string candidate_config(const TuneCandidate& c, const TuneRequest& r) {
  if (candidate_is_json(c)) return json_config(c, r, {});
  return config_yaml(answers_for(c, r, "hybrid_shard"));
}

WinnerFiles winner_accelerate(const TuneCandidate& c, const TuneRequest& r, const std::string& json_path,
                              const std::vector<std::string>& how_chosen) {
  // The YAML says it inline where its keys can: the default bucket, and checkpointing only through
  // FSDP's key (ZeRO-2/3 and DDP have FSDP names; offloading the optimizer alone has none in FSDP).
  const bool default_bucket = c.bucket_mib == kDefaultBucketMib;
  // Gradient clipping and offload have keys in DeepSpeed's section only (FSDP's offloads parameters
  // and optimizer together): a winner with either stays there (or in the JSON), as it was measured.
  const bool clips = r.gradient_clipping > 0;
  std::string strategy;
  if (c.strategy == "HYBRID_SHARD") {
    strategy = "hybrid_shard";
  } else if (default_bucket && !c.checkpointing && (c.strategy != "DDP" || (!clips && c.offload == "none"))) {
    strategy = c.strategy == "DDP"      ? "ddp"
               : c.strategy == "ZERO_1" ? "zero1"
               : c.strategy == "ZERO_2" ? "zero2"
                                        : "zero3";
  } else if (default_bucket && !clips && c.offload != "optimizer" && c.strategy != "ZERO_1" &&
             (c.accumulation == 1 || !candidate_syncs_each_batch(c))) {
    strategy = c.strategy == "DDP" ? "no_shard" : c.strategy == "ZERO_2" ? "shard_grad_op" : "full_shard";
  }
  if (!strategy.empty()) {
    std::vector<std::string> lines = how_chosen;
    if (clips && strategy == "hybrid_shard")
      lines.push_back(
          fmt::format("The base config's gradient_clipping {} has no key in FSDP's section (measured "
                      "without it): clip in the training loop (clip_grad_norm_).",
                      fmt_num(r.gradient_clipping)));
    return {commented(lines, config_yaml(answers_for(c, r, strategy))), ""};
  }
  std::string yaml = fmt::format(
      "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: "
      "{}\nnum_machines: {}\nnum_processes: {}\nuse_cpu: {}\n",
      json_path, r.num_machines, r.num_processes, r.device_cuda ? "false" : "true");
  std::vector<std::string> lines = how_chosen;
  lines.push_back(
      "The YAML cannot say all of it (bucket size, checkpointing under ZeRO-1 / optimizer offload, gradient "
      "clipping outside DeepSpeed's section, or ZeRO-2/3 micro-steps that each reduce, as measured: FSDP's names "
      "would not): " +
      json_path + " does.");
  return {commented(lines, yaml), json_config(c, r, {})};
}

std::string winner_deepspeed(const TuneCandidate& c, const TuneRequest& r, const std::vector<std::string>& how_chosen) {
  if (!candidate_is_json(c))
    throw TuneError(
        "the fastest configuration is HYBRID_SHARD, which DeepSpeed's JSON cannot say: use --dialect "
        "accelerate");
  return json_config(c, r, how_chosen);
}

std::string tune_table(const std::vector<TuneResult>& results, const TuneGrid& grid, const TuneRequest& r) {
  auto estimate = [&](const TuneCandidate& c) {
    for (std::size_t i = 0; i < grid.runnable.size(); ++i)
      if (grid.runnable[i] == c) return gb_text(grid.model_state_bytes[i]);
    return std::string("?");
  };
  std::string s = fmt::format(
      "| rank | candidate | samples/s | step ms | runs | peak / rank | model states / rank (estimate) | run s | result "
      "|\n|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
  int rank = 0;
  for (const auto& d : results) {
    const bool ok = d.status == TuneResult::Status::Ok;
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {:.1f} | {}{} |\n", ok ? std::to_string(++rank) : "",
                     d.candidate.label(), ok ? samples_text(d.samples_per_s) : "",
                     ok ? fmt::format("{:.1f}", d.step_ms) : "", d.runs, d.peak_bytes > 0 ? gb_text(d.peak_bytes) : "",
                     estimate(d.candidate), d.wall_s, to_string(d.status), d.detail.empty() ? "" : ": " + d.detail);
  }
  if (!grid.pruned.empty()) {
    // One line per reason, with how many candidates it took out and an example.
    std::map<std::string, std::vector<const PrunedCandidate*>> by_why;
    std::vector<std::string> order;
    for (const auto& p : grid.pruned) {
      if (!by_why.count(p.why)) order.push_back(p.why);
      by_why[p.why].push_back(&p);
    }
    s += fmt::format("\nPruned before running ({} of {}):\n", grid.pruned.size(),
                     grid.pruned.size() + grid.runnable.size());
    for (const auto& why : order)
      s += fmt::format("- {} candidate(s), e.g. {}: {}\n", by_why[why].size(), by_why[why].front()->candidate.label(),
                       why);
  }
  (void)r;
  return s;
}

}  // namespace accel::cli
