// The parts of config.h shared by both dialects: names, mixed precision, DeepSpeed's batch rule,
// "did you mean", describe(), the dialect dispatch of load_config_file, and resolve_config's
// precedence (explicit argument > ACCEL_* environment > config file > default).
// The dialects themselves: config_yaml.cpp (Accelerate YAML), config_deepspeed.cpp (DeepSpeed JSON).
#include "accelerator/config.h"

#include "accelerator/config_detail.h"
#include "base/env.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

namespace accel {

namespace cd = config_detail;

// ---------------------------------------------------------------------------------------------------
// Shared helpers (config_detail.h)

namespace config_detail {

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

void fail(const std::string& where, const std::string& message) { throw ConfigError(where + ": " + message); }

void fail_value(const std::string& where, const std::string& key, const std::string& value,
                const std::string& expected) {
  fail(where, key + " is '" + value + "', expected " + expected);
}

void fail_unknown_key(const std::string& where, const std::string& path, const std::vector<std::string>& valid) {
  const auto dot = path.rfind('.');
  const std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
  std::string msg = "unknown key '" + path + "'";
  const std::string near = closest_key(leaf, valid);
  if (!near.empty()) msg += "; did you mean '" + near + "'?";
  msg += " (valid keys: " + join(valid) + ")";
  fail(where, msg);
}

std::string match_enum(const std::string& where, const std::string& key, const std::string& value,
                       const std::vector<std::string>& allowed) {
  const std::string v = upper(trim(value));
  for (const auto& a : allowed)
    if (upper(a) == v) return a;
  std::string msg = key + " is '" + value + "'";
  const std::string near = closest_key(value, allowed);
  msg += near.empty() ? ";" : "; did you mean '" + near + "'?";
  msg += " allowed values: " + join(allowed);
  fail(where, msg);
}

std::optional<std::int64_t> parse_integer(const std::string& text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (end && *end == '\0' && errno == 0) return static_cast<std::int64_t>(i);
  // 5e8, 1e8, 12.0: a number with no fraction that fits.
  const auto d = parse_number(s);
  if (!d || std::floor(*d) != *d || std::fabs(*d) > 9.2e18) return std::nullopt;
  return static_cast<std::int64_t>(*d);
}

std::optional<double> parse_number(const std::string& text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  // strtod also reads "inf", "nan" and hex; a config number is none of those.
  for (char c : s)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (!end || *end != '\0' || errno != 0 || !std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<bool> parse_bool(const std::string& text, bool digits) {
  const std::string s = lower(trim(text));
  if (s == "true" || s == "yes" || s == "on" || (digits && s == "1")) return true;
  if (s == "false" || s == "no" || s == "off" || (digits && s == "0")) return false;
  return std::nullopt;
}

void note_ignored(AcceleratorConfig& cfg, const std::string& key, const std::string& reason) {
  const std::string head = key + ":";
  for (const auto& entry : cfg.ignored)
    if (entry.compare(0, head.size(), head) == 0) return;
  cfg.ignored.push_back(key + ": " + reason);
}

std::string fsdp_strategy_name(const std::string& where, const std::string& key, const std::string& text) {
  // Accelerate's numbering: 1 FULL_SHARD .. 4 HYBRID_SHARD, 5 HYBRID_SHARD_ZERO2.
  static const std::vector<std::string> names = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
  const auto number = parse_integer(text);
  if ((number && *number == 5) || upper(trim(text)) == "HYBRID_SHARD_ZERO2")
    fail(where, key + " is '" + text +
                    "': HYBRID_SHARD_ZERO2 is not supported yet; use HYBRID_SHARD (FULL_SHARD inside a node, "
                    "replicated across nodes) or SHARD_GRAD_OP (ZeRO-2 over all ranks)");
  if (!number) return match_enum(where, key, text, names);
  if (*number < 1 || *number > 4)
    fail_value(where, key, text, "a strategy name or its number: 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD, 4 HYBRID_SHARD");
  return names[static_cast<std::size_t>(*number - 1)];
}

std::string offload_device(const std::string& where, const std::string& key, const std::string& text) {
  return lower(match_enum(where, key, text, {"none", "cpu", "nvme"}));
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string working_dir() {
  std::vector<char> buf(4096);
  return ::getcwd(buf.data(), buf.size()) ? std::string(buf.data()) : std::string(".");
}

std::string read_text_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail(path, "cannot read config file (it is a directory)");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot read config file (") + std::strerror(errno) + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace config_detail

// ---------------------------------------------------------------------------------------------------
// Names

const char* to_string(DistributedType t) {
  switch (t) {
    case DistributedType::No: return "NO";
    case DistributedType::MultiCpu: return "MULTI_CPU";
    case DistributedType::MultiGpu: return "MULTI_GPU";
    case DistributedType::DeepSpeed: return "DEEPSPEED";
    case DistributedType::Fsdp: return "FSDP";
  }
  return "?";
}

const char* to_string(MixedPrecision p) {
  switch (p) {
    case MixedPrecision::No: return "no";
    case MixedPrecision::Fp16: return "fp16";
    case MixedPrecision::Bf16: return "bf16";
    case MixedPrecision::Fp8: return "fp8";
  }
  return "?";
}

MixedPrecision parse_mixed_precision(const std::string& value, const std::string& what) {
  const std::string v = cd::match_enum(what, "mixed_precision", value, {"no", "fp16", "bf16", "fp8"});
  if (v == "fp16") return MixedPrecision::Fp16;
  if (v == "bf16") return MixedPrecision::Bf16;
  if (v == "fp8") return MixedPrecision::Fp8;
  return MixedPrecision::No;
}

// ---------------------------------------------------------------------------------------------------
// DeepSpeed's batch triad

namespace {
std::string show(const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : std::string("unset"); }

std::string triad(const BatchConfig& b, int world) {
  return "train_batch_size " + show(b.train_batch_size) + ", train_micro_batch_size_per_gpu " +
         show(b.micro_batch_per_gpu) + ", gradient_accumulation_steps " + show(b.gradient_accumulation_steps) +
         ", world size " + std::to_string(world);
}
}  // namespace

BatchConfig resolve_batch(BatchConfig b, int world, std::optional<std::int64_t> loader_micro_batch,
                          std::int64_t accumulation_default, const std::string& source) {
  const std::string where = source.empty() ? std::string("the configuration") : source;
  if (world < 1) cd::fail(where, "world size is " + std::to_string(world) + ", expected >= 1");
  const std::pair<const char*, const std::optional<std::int64_t>*> given[] = {
      {"train_batch_size", &b.train_batch_size},
      {"train_micro_batch_size_per_gpu", &b.micro_batch_per_gpu},
      {"gradient_accumulation_steps", &b.gradient_accumulation_steps}};
  for (const auto& [name, v] : given)
    if (*v && **v <= 0) cd::fail(where, std::string(name) + " is " + std::to_string(**v) + ", expected a positive integer");
  if (loader_micro_batch && *loader_micro_batch <= 0)
    cd::fail(where, "the prepared loader's batch size is " + std::to_string(*loader_micro_batch) +
                        ", expected a positive integer");

  // The loader knows the micro batch; the accumulation default fills in only what the rule cannot derive.
  if (!b.micro_batch_per_gpu && loader_micro_batch) b.micro_batch_per_gpu = loader_micro_batch;
  if (!b.gradient_accumulation_steps && !(b.train_batch_size && b.micro_batch_per_gpu)) {
    if (accumulation_default < 1)
      cd::fail(where, "gradient_accumulation_steps is " + std::to_string(accumulation_default) + ", expected >= 1");
    b.gradient_accumulation_steps = accumulation_default;
  }

  const std::int64_t w = world;
  auto& tbs = b.train_batch_size;
  auto& mbs = b.micro_batch_per_gpu;
  auto& gas = b.gradient_accumulation_steps;
  if (!tbs && !mbs)
    cd::fail(where, "either train_batch_size or train_micro_batch_size_per_gpu needs to be given (" + triad(b, world) +
                        "); set one, or let prepare() take the micro batch from the data loader");
  if (tbs && mbs && gas) {
    if (*tbs != *mbs * *gas * w)
      cd::fail(where, "batch sizes do not fit: train_batch_size must equal train_micro_batch_size_per_gpu * "
                      "gradient_accumulation_steps * world size, but " + std::to_string(*tbs) + " != " +
                          std::to_string(*mbs) + " * " + std::to_string(*gas) + " * " + std::to_string(w) + " (" +
                          triad(b, world) + ")");
  } else if (tbs && mbs) {
    if (*tbs % (*mbs * w) != 0)
      cd::fail(where, "cannot derive gradient_accumulation_steps: train_batch_size is not a multiple of "
                      "train_micro_batch_size_per_gpu * world size (" + triad(b, world) + ")");
    gas = *tbs / (*mbs * w);
  } else if (tbs && gas) {
    if (*tbs % (*gas * w) != 0)
      cd::fail(where, "cannot derive train_micro_batch_size_per_gpu: train_batch_size is not a multiple of "
                      "gradient_accumulation_steps * world size (" + triad(b, world) + ")");
    mbs = *tbs / (*gas * w);
  } else {  // micro batch and accumulation known
    tbs = *mbs * *gas * w;
  }
  return b;
}

// ---------------------------------------------------------------------------------------------------
// "Did you mean"

namespace {
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string closest_key(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string k = cd::lower(key);
  std::string best;
  std::size_t best_score = std::string::npos;
  for (const auto& c : candidates) {
    const std::string l = cd::lower(c);
    const std::size_t d = edit_distance(k, l);
    const std::size_t limit = std::max<std::size_t>(2, std::max(k.size(), l.size()) / 3);
    // One name inside the other ("stage" / "zero_stage") is close too, if it is not tiny.
    const bool inside = std::min(k.size(), l.size()) >= 4 &&
                        (l.find(k) != std::string::npos || k.find(l) != std::string::npos);
    if ((d <= limit || inside) && d < best_score) {
      best = c;
      best_score = d;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------------
// describe()

namespace {
int zero_stage_of(zero::Strategy s) {
  switch (s) {
    case zero::Strategy::NoShard: return 0;
    case zero::Strategy::Zero1: return 1;
    case zero::Strategy::Zero2: return 2;
    case zero::Strategy::Zero3:
    case zero::Strategy::HybridShard: return 3;
  }
  return 0;
}

const char* fsdp_name_of(zero::Strategy s) {
  switch (s) {
    case zero::Strategy::NoShard: return "NO_SHARD";
    case zero::Strategy::Zero1: return "ZeRO-1 (no FSDP name)";
    case zero::Strategy::Zero2: return "SHARD_GRAD_OP";
    case zero::Strategy::Zero3: return "FULL_SHARD";
    case zero::Strategy::HybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

std::string what_is_sharded(const zero::ShardingSpec& s) {
  std::string out = std::string("optimizer state ") + (s.shards_optimizer() ? "sharded" : "replicated");
  out += std::string(", gradients ") + (s.shards_gradients() ? "sharded (reduce-scatter)" : "all-reduced");
  if (s.shards_parameters()) {
    out += ", parameters sharded and gathered one unit at a time";
    out += s.reshard_after_forward ? " (freed after each unit's forward)" : " (kept from forward until backward)";
  } else {
    out += ", parameters replicated";
  }
  if (s.hybrid()) out += "; all of it sharded inside each node and replicated across nodes";
  return out;
}

std::string units_of(const zero::WrapPolicy& w) {
  switch (w.kind) {
    case zero::WrapPolicy::Kind::Marked: return "every module marked with accel::unit";
    case zero::WrapPolicy::Kind::TypeName: return "marked modules of type " + cd::join(w.type_names, " or ");
    case zero::WrapPolicy::Kind::Size:
      return "marked modules holding at least " + std::to_string(w.min_num_params) + " parameters";
    case zero::WrapPolicy::Kind::None: return "the whole model as one unit";
  }
  return "?";
}

std::string auto_or(const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : std::string("auto"); }
}  // namespace

std::string AcceleratorConfig::describe() const {
  std::ostringstream o;
  const int n = num_processes;
  switch (distributed_type) {
    case DistributedType::No:
      o << "Distributed type NO: plain training in one process (run on several ranks it becomes DDP: every rank "
           "holds the whole model, gradients are all-reduced).";
      break;
    case DistributedType::MultiCpu:
    case DistributedType::MultiGpu:
      o << "DDP (" << to_string(distributed_type) << ") over " << n << " process" << (n == 1 ? "" : "es")
        << ": " << what_is_sharded(spec) << ".";
      break;
    case DistributedType::DeepSpeed:
      o << "DeepSpeed ZeRO stage " << zero_stage_of(spec.strategy) << " over " << n << " process"
        << (n == 1 ? "" : "es") << ": " << what_is_sharded(spec) << ".";
      break;
    case DistributedType::Fsdp:
      o << "FSDP " << fsdp_name_of(spec.strategy) << " (like ZeRO-" << zero_stage_of(spec.strategy) << ", FSDP version "
        << fsdp_version << ") over " << n << " process" << (n == 1 ? "" : "es") << ": " << what_is_sharded(spec)
        << "; units: " << units_of(spec.wrap) << ".";
      break;
  }
  if (num_machines > 1) o << " " << num_machines << " machines, this one is rank " << machine_rank << ".";
  if (offload_optimizer_device != "none") o << " Optimizer state offloaded to " << offload_optimizer_device << ".";
  if (offload_param_device != "none") o << " Parameters offloaded to " << offload_param_device << ".";

  o << " Precision: ";
  switch (mixed_precision) {
    case MixedPrecision::No: o << "fp32 (no mixed precision)."; break;
    case MixedPrecision::Bf16: o << "bf16 compute, fp32 master weights."; break;
    case MixedPrecision::Fp8:
      o << "fp8 matmuls in Float8Linear layers (e4m3 forward, e5m2 gradients, dynamic tensorwise scales), bf16 "
           "elsewhere, fp32 master weights.";
      break;
    case MixedPrecision::Fp16:
      o << "fp16 compute, fp32 master weights, ";
      if (loss_scaler.loss_scale > 0)
        o << "static loss scale " << loss_scaler.loss_scale << ".";
      else
        o << "dynamic loss scale from 2^" << loss_scaler.initial_scale_power << " (window "
          << loss_scaler.loss_scale_window << ", hysteresis " << loss_scaler.hysteresis << ", minimum "
          << loss_scaler.min_loss_scale << ").";
      break;
  }
  o << " Gradients accumulate over " << gradient_accumulation_steps << " micro-step"
    << (gradient_accumulation_steps == 1 ? "" : "s") << " per optimizer step.";
  if (distributed_type == DistributedType::DeepSpeed)
    o << " Batch: train_batch_size " << auto_or(batch.train_batch_size) << ", train_micro_batch_size_per_gpu "
      << auto_or(batch.micro_batch_per_gpu) << ", gradient_accumulation_steps "
      << auto_or(batch.gradient_accumulation_steps) << " (auto: from the prepared loader and the world size).";
  if (gradient_clipping && *gradient_clipping > 0) o << " Gradients clipped to global norm " << *gradient_clipping << ".";
  if (!ignored.empty()) {
    std::vector<std::string> keys;
    for (const auto& e : ignored) keys.push_back(e.substr(0, e.find(':')));
    o << " Ignored keys: " << cd::join(keys) << ".";
  }
  o << (source.empty() ? " (All defaults: no config file.)" : " (From " + source + ".)");
  return o.str();
}

// ---------------------------------------------------------------------------------------------------
// load_config_file: tell the dialects apart by content

namespace {
bool is_deepspeed_json(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') return false;
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  // A JSON that does not parse goes to the JSON reader (which reports where), unless it is meant as
  // Accelerate config (YAML is more forgiving than JSON, and Accelerate accepts .json configs).
  if (j.is_discarded()) return text.find("distributed_type") == std::string::npos;
  return j.is_object() && !j.contains("distributed_type");
}
}  // namespace

AcceleratorConfig load_config_file(const std::string& path) {
  const std::string text = cd::read_text_file(path);
  if (is_deepspeed_json(text)) return parse_deepspeed_json(text, path);
  return parse_accelerate_yaml(text, path, cd::parent_dir(path));
}

// ---------------------------------------------------------------------------------------------------
// resolve_config: explicit argument > environment > file > default

namespace {
// A value from an explicit argument or the environment, with where it came from (for messages).
template <class T>
struct Given {
  T value;
  std::string where;  // "argument" or "ACCEL_X (environment)"
  int level;          // 2 argument, 1 environment
};

std::optional<std::string> env_text(const char* name) {
  if (!env::is_set(name)) return std::nullopt;
  return env::get(name);
}

std::string env_where(const char* name) { return std::string(name) + " (environment)"; }

std::optional<Given<std::string>> pick_text(const std::optional<std::string>& arg, const char* var) {
  if (arg && !arg->empty()) return Given<std::string>{*arg, "argument", 2};
  if (auto v = env_text(var)) return Given<std::string>{*v, env_where(var), 1};
  return std::nullopt;
}

std::int64_t env_integer(const char* var, const char* key, std::int64_t lo, std::int64_t hi, const std::string& expected) {
  const std::string text = env::get(var);
  const auto v = cd::parse_integer(text);
  if (!v || *v < lo || *v > hi) cd::fail_value(env_where(var), key, text, expected);
  return *v;
}

void force_deepspeed(AcceleratorConfig& cfg, int stage) {
  const zero::ShardingSpec fresh = zero::ShardingSpec::zero(stage);
  if (cfg.distributed_type == DistributedType::DeepSpeed) {
    cfg.spec.strategy = fresh.strategy;  // keep the file's buckets and dtypes
  } else {
    cfg.distributed_type = DistributedType::DeepSpeed;
    cfg.spec = fresh;
  }
}

void force_fsdp(AcceleratorConfig& cfg, const std::string& strategy) {
  const zero::ShardingSpec fresh = zero::ShardingSpec::fsdp(strategy);
  if (cfg.distributed_type == DistributedType::Fsdp) {
    cfg.spec.strategy = fresh.strategy;  // keep the file's wrap policy and prefetch
  } else {
    cfg.distributed_type = DistributedType::Fsdp;
    cfg.spec = fresh;
  }
}
}  // namespace

AcceleratorConfig resolve_config(const ConfigOverrides& args) {
  AcceleratorConfig cfg;
  if (auto file = pick_text(args.config_file, "ACCEL_CONFIG_FILE")) cfg = load_config_file(file->value);

  if (auto mp = pick_text(args.mixed_precision, "ACCEL_MIXED_PRECISION"))
    cfg.mixed_precision = parse_mixed_precision(mp->value, mp->where);

  std::optional<std::int64_t> accumulation;
  if (args.gradient_accumulation_steps) {
    if (*args.gradient_accumulation_steps < 1)
      cd::fail_value("argument", "gradient_accumulation_steps", std::to_string(*args.gradient_accumulation_steps),
                     "an integer >= 1");
    accumulation = *args.gradient_accumulation_steps;
  } else if (env::is_set("ACCEL_GRADIENT_ACCUMULATION_STEPS")) {
    accumulation = env_integer("ACCEL_GRADIENT_ACCUMULATION_STEPS", "gradient_accumulation_steps", 1, INT64_MAX,
                               "an integer >= 1");
  }
  if (accumulation) {
    cfg.gradient_accumulation_steps = *accumulation;
    cfg.batch.gradient_accumulation_steps = *accumulation;  // explicit: DeepSpeed's rule takes it as given
  }

  if (args.use_cpu) {
    cfg.use_cpu = *args.use_cpu;
  } else if (auto v = env_text("ACCEL_USE_CPU")) {
    const auto b = cd::parse_bool(*v, /*digits=*/true);
    if (!b) cd::fail_value(env_where("ACCEL_USE_CPU"), "use_cpu", *v, "a boolean (true/false, 1/0)");
    cfg.use_cpu = *b;
  }

  std::optional<Given<int>> stage;
  if (args.zero_stage) {
    if (*args.zero_stage < 0 || *args.zero_stage > 3)
      cd::fail_value("argument", "zero_stage", std::to_string(*args.zero_stage), "0, 1, 2 or 3");
    stage = Given<int>{*args.zero_stage, "argument", 2};
  } else if (env::is_set("ACCEL_ZERO_STAGE")) {
    stage = Given<int>{static_cast<int>(env_integer("ACCEL_ZERO_STAGE", "zero_stage", 0, 3, "0, 1, 2 or 3")),
                       env_where("ACCEL_ZERO_STAGE"), 1};
  }
  std::optional<Given<std::string>> strategy = pick_text(args.fsdp_sharding_strategy, "ACCEL_FSDP_SHARDING_STRATEGY");
  if (strategy) strategy->value = cd::fsdp_strategy_name(strategy->where, "fsdp_sharding_strategy", strategy->value);

  if (stage && strategy && stage->level == strategy->level)
    cd::fail(stage->where == strategy->where ? stage->where : stage->where + " and " + strategy->where,
             "zero_stage (DEEPSPEED) and fsdp_sharding_strategy (FSDP) are both given; give one of them");
  if (stage && (!strategy || stage->level > strategy->level)) {
    force_deepspeed(cfg, stage->value);
    if (strategy)
      cd::note_ignored(cfg, "fsdp_sharding_strategy (" + strategy->where + ")", "overridden by zero_stage (" + stage->where + ")");
  } else if (strategy) {
    force_fsdp(cfg, strategy->value);
    if (stage)
      cd::note_ignored(cfg, "zero_stage (" + stage->where + ")", "overridden by fsdp_sharding_strategy (" + strategy->where + ")");
  }

  try {
    cfg.spec.validate();
  } catch (const std::invalid_argument& e) {
    cd::fail(cfg.source.empty() ? std::string("the configuration") : cfg.source, e.what());
  }
  return cfg;
}

}  // namespace accel
