// DeepSpeed JSON, read as DeepSpeed reads it (docs/design.md, "Configuration"), into an AcceleratorConfig:
//   * zero_optimization, its offload blocks, fp16 and bf16 are strict like DeepSpeed's pydantic models:
//     an unknown key is an error; a field may be spelled by its name or its alias
//     (prefetch_bucket_size / stage3_prefetch_bucket_size); a value "auto" drops the key (default);
//     integers may be written as floats with no fraction (5e8), 1.5 is an error;
//     deprecated keys map onto their replacements (cpu_offload -> offload_optimizer.device cpu) and
//     giving both the old and the new key is an error.
//   * Top level: DeepSpeed itself reads it with dict.get and never complains about unknown keys.
//     accel is stricter on purpose: a misspelt top-level key (train_micro_batch_size_per_gpus) would
//     otherwise silently fall back to a default. Every key DeepSpeed documents is accepted; the ones
//     accel does not act on (optimizer, scheduler, monitors, ...) are listed in `ignored` with why;
//     anything else is an error with a "did you mean".
//   * Duplicate keys are an error (DeepSpeed loads with dict_raise_error_on_duplicate_keys).
#include "accelerator/config.h"

#include "accelerator/config_detail.h"
#include "accelerator/config_keys.h"
#include "optim/from_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace accel {

namespace cd = config_detail;
using json = nlohmann::ordered_json;

namespace {

using config_keys::Keys;
using config_keys::Type;

// The keys of a block of the JSON (config_keys_table.cpp).
Keys deepspeed_keys(const std::string& section) {
  return config_keys::section(config_keys::Dialect::DeepSpeed, section);
}

const char* kind_text(Type t) {
  switch (t) {
    case Type::Bool: return "a boolean (true or false)";
    case Type::Int: return "an integer";
    case Type::Number: return "a number";
    case Type::String:
    case Type::Choice: return "a string";
    case Type::Object: return "an object ({...})";
    case Type::List: return "a list";
    case Type::Any: return "a value";
  }
  return "?";
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

std::string show_json(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// JSON number -> int64, accepting integral floats (5e8), else nullopt.
std::optional<std::int64_t> as_integer(const json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= 9.2e18) return static_cast<std::int64_t>(d);
  }
  return std::nullopt;
}

bool has_kind(const json& v, Type t) {
  switch (t) {
    case Type::Bool: return v.is_boolean();
    case Type::Int: return as_integer(v).has_value();
    case Type::Number: return v.is_number();
    case Type::String:
    case Type::Choice: return v.is_string();  // the reader checks the value
    case Type::Object: return v.is_object();
    case Type::List: return v.is_array();
    case Type::Any: return true;
  }
  return false;
}

// A block's entries under their canonical names, type-checked, with "auto" and null values dropped.
class Block {
 public:
  Block(const json& obj, const std::string& file, const std::string& prefix, const Keys& keys, AcceleratorConfig& cfg)
      : file_(file), prefix_(prefix) {
    std::vector<std::string> valid;
    for (const auto* k : keys) {
      valid.emplace_back(k->name);
      for (const auto& a : config_keys::aliases(*k)) valid.push_back(a);
    }
    for (const auto& [written, value] : obj.items()) {
      const config_keys::Key* key = config_keys::find(keys, written);
      if (!key) cd::fail_unknown_key(file, prefix + written, valid);
      if (auto [it, fresh] = entries_.emplace(key->name, Entry{written, value}); !fresh)
        cd::fail(file, fmt::format("both '{}{}' and its alias '{}{}' are given; keep one", prefix, key->name, prefix,
                                   written == key->name ? it->second.written : written));
      if (value.is_null() || is_auto(value)) {
        dropped_.insert(key->name);
        continue;
      }
      if (!has_kind(value, key->type)) cd::fail_value(file, prefix + written, show_json(value), kind_text(key->type));
      if (key->ignored) cd::note_ignored(cfg, prefix + written, key->ignored);
    }
  }

  // Present with a value other than null/"auto".
  bool has(const std::string& name) const { return entries_.count(name) && !dropped_.count(name); }
  // Written at all (also null or "auto").
  bool written(const std::string& name) const { return entries_.count(name) > 0; }
  bool written_auto(const std::string& name) const {
    auto it = entries_.find(name);
    return it != entries_.end() && is_auto(it->second.value);
  }
  const json& value(const std::string& name) const { return entries_.at(name).value; }
  std::string path(const std::string& name) const {
    auto it = entries_.find(name);
    return prefix_ + (it == entries_.end() ? name : it->second.written);
  }

  std::optional<std::int64_t> integer(const std::string& name, std::int64_t lo, std::int64_t hi,
                                      const std::string& expected) const {
    if (!has(name)) return std::nullopt;
    const auto v = as_integer(value(name));
    if (!v || *v < lo || *v > hi) cd::fail_value(file_, path(name), show_json(value(name)), expected);
    return v;
  }
  std::optional<double> number(const std::string& name, double lo, const std::string& expected) const {
    if (!has(name)) return std::nullopt;
    const double d = value(name).get<double>();
    if (!std::isfinite(d) || d < lo) cd::fail_value(file_, path(name), show_json(value(name)), expected);
    return d;
  }
  std::optional<bool> boolean(const std::string& name) const {
    if (!has(name)) return std::nullopt;
    return value(name).get<bool>();
  }

 private:
  struct Entry {
    std::string written;
    json value;
  };
  std::string file_, prefix_;
  std::map<std::string, Entry> entries_;
  std::set<std::string> dropped_;
};

// Parses with DeepSpeed's duplicate-key rule; syntax errors name the file and the position.
json parse_strict(const std::string& text, const std::string& file) {
  struct Frame {
    std::set<std::string> keys;
    std::string last;
  };
  std::vector<Frame> frames;
  auto path_of = [&](const std::string& key) {
    std::string p;
    for (std::size_t i = 0; i + 1 < frames.size(); ++i)
      if (!frames[i].last.empty()) p += frames[i].last + ".";
    return p + key;
  };
  json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: frames.emplace_back(); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string k = parsed.get<std::string>();
        if (!frames.back().keys.insert(k).second)
          cd::fail(file, fmt::format("duplicate key '{}' (DeepSpeed rejects duplicate keys too)", path_of(k)));
        frames.back().last = k;
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::exception& e) {
    cd::fail(file, std::string("not valid JSON: ") + e.what());
  }
}

std::optional<std::int64_t> batch_value(const Block& top, const std::string& name) {
  return top.integer(name, 1, std::numeric_limits<std::int64_t>::max(), "a positive integer or \"auto\"");
}

// An offload block, or null; returns the device. The deprecated bool (cpu_offload) maps onto it.
// nvme_path and buffer_count land in the given fields.
std::string read_offload(const Block& zero, const std::string& block, const std::string& deprecated, const Keys& keys,
                         const std::string& file, AcceleratorConfig& cfg, std::string& nvme_path, int& buffer_count) {
  if (zero.has(deprecated) && zero.written(block))
    cd::fail(file, fmt::format("both the deprecated '{}' and its replacement '{}' are given; keep {}",
                               zero.path(deprecated), zero.path(block), zero.path(block)));
  if (zero.has(deprecated)) return *zero.boolean(deprecated) ? "cpu" : "none";
  if (!zero.has(block)) return "none";
  Block b(zero.value(block), file, zero.path(block) + ".", keys, cfg);
  if (b.has("nvme_path")) nvme_path = b.value("nvme_path").get<std::string>();
  if (auto n = b.integer("buffer_count", 2, 1 << 20, "an integer >= 2")) buffer_count = static_cast<int>(*n);
  if (!b.has("device")) return "none";
  const std::string device = cd::offload_device(file, b.path("device"), b.value("device").get<std::string>());
  if (device == "nvme" && nvme_path.empty())
    cd::fail(file, fmt::format("{} is \"nvme\" but {}.nvme_path is not set; give the directory to offload into",
                               b.path("device"), zero.path(block)));
  return device;
}

void read_zero(const json& z, const std::string& file, AcceleratorConfig& cfg) {
  if (z.is_boolean()) {  // legacy form: true = stage 1
    cfg.spec = zero::ShardingSpec::zero(z.get<bool>() ? 1 : 0);
    return;
  }
  if (z.is_null() || is_auto(z)) {
    cfg.spec = zero::ShardingSpec::zero(0);
    return;
  }
  if (!z.is_object())
    cd::fail_value(file, "zero_optimization", show_json(z), "an object ({\"stage\": ...}) or a boolean");
  Block zero(z, file, "zero_optimization.", deepspeed_keys("zero_optimization"), cfg);

  const int stage = static_cast<int>(zero.integer("stage", 0, 3, "0, 1, 2 or 3").value_or(0));
  cfg.spec = zero::ShardingSpec::zero(stage);
  if (auto n = zero.integer("reduce_bucket_size", 0, std::numeric_limits<std::int64_t>::max() / 4,
                            "a number of elements >= 0"))
    cfg.spec.bucket_bytes = *n * 4;

  auto& off = cfg.spec.offload;
  cfg.offload_optimizer_device =
      read_offload(zero, "offload_optimizer", "cpu_offload", deepspeed_keys("zero_optimization.offload_optimizer"),
                   file, cfg, off.optimizer_nvme_path, off.optimizer_buffer_count);
  cfg.offload_param_device =
      read_offload(zero, "offload_param", "cpu_offload_param", deepspeed_keys("zero_optimization.offload_param"), file,
                   cfg, off.param_nvme_path, off.param_buffer_count);
  if (auto n = zero.integer("sub_group_size", 1, std::numeric_limits<std::int64_t>::max(), "a number of elements >= 1"))
    off.sub_group_size = *n;
  // MiCS: stage 3 shards each copy of the model over a block of n ranks, the copies averaging gradients
  // (DeepSpeed's MiCS_Init and MiCS_Optimizer; -1 or 0 is off, and stages 0-2 ignore it as DeepSpeed does).
  if (auto n = zero.integer("mics_shard_size", -1, std::numeric_limits<int>::max(),
                            "-1 or 0 (off), or a number of ranks >= 1");
      n && *n > 0) {
    cfg.mics_shard_size = static_cast<int>(*n);
    cd::apply_mics(cfg);
  }
  if (cfg.offload_param_device != "none" && stage != 3)
    cd::fail(file, fmt::format("{} offloads parameters to '{}', which needs stage 3 (zero_optimization.stage is {}); "
                               "use stage 3 or set the device to \"none\"",
                               zero.path("offload_param"), cfg.offload_param_device, stage));

  const std::string g16 = "gather_16bit_weights_on_model_save", old16 = "stage3_gather_fp16_weights_on_model_save";
  if (zero.has(old16) && zero.has(g16))
    cd::fail(file, fmt::format("both the deprecated '{}' and its replacement '{}' are given; keep {}", zero.path(old16),
                               zero.path(g16), zero.path(g16)));
  if (auto b = zero.boolean(zero.has(g16) ? g16 : old16)) cfg.zero3_save_16bit_model = *b;
}

void read_fp16(const json& obj, const std::string& file, AcceleratorConfig& cfg, bool& enabled, bool& is_auto_enabled) {
  Block b(obj, file, "fp16.", deepspeed_keys("fp16"), cfg);
  enabled = b.boolean("enabled").value_or(false);
  is_auto_enabled = b.written_auto("enabled");
  LossScalerConfig& s = cfg.loss_scaler;
  if (auto v = b.number("loss_scale", 0, "a number >= 0 (0: dynamic)")) s.loss_scale = *v;
  if (auto v = b.integer("initial_scale_power", 0, 64, "an integer in 0..64"))
    s.initial_scale_power = static_cast<int>(*v);
  if (auto v = b.integer("loss_scale_window", 1, std::numeric_limits<int>::max(), "an integer >= 1"))
    s.loss_scale_window = static_cast<int>(*v);
  if (auto v = b.integer("hysteresis", 1, std::numeric_limits<int>::max(), "an integer >= 1"))
    s.hysteresis = static_cast<int>(*v);
  if (auto v = b.boolean("consecutive_hysteresis")) s.consecutive_hysteresis = *v;
  if (auto v = b.number("min_loss_scale", 0, "a number > 0")) {
    if (*v <= 0) cd::fail_value(file, b.path("min_loss_scale"), show_json(b.value("min_loss_scale")), "a number > 0");
    s.min_loss_scale = *v;
  }
}

void read_bf16(const json& obj, const std::string& file, const std::string& name, AcceleratorConfig& cfg, bool& enabled,
               bool& is_auto_enabled) {
  Block b(obj, file, name + ".", deepspeed_keys("bf16"), cfg);
  enabled = b.boolean("enabled").value_or(false);
  is_auto_enabled = b.written_auto("enabled");
  // bf16 master weights (and with them the optimizer state): half the memory of fp32 masters.
  if (auto m = b.boolean("bf16_master_weights_and_grads"); m && *m && (enabled || is_auto_enabled))
    cfg.spec.master_dtype = c10::ScalarType::BFloat16;
}

// A dtype key of block b: fp32, fp16 or bf16. torch_names: also the other names DeepSpeed's DtypeEnum
// takes (float32, float, torch.float32; float16, half, torch.float16; bfloat16, torch.bfloat16).
std::optional<c10::ScalarType> dtype_key(const Block& b, const std::string& key, const std::string& file,
                                         bool torch_names = false) {
  if (!b.has(key)) return std::nullopt;
  const json& v = b.value(key);
  const std::string path = b.path(key);
  if (!v.is_string()) cd::fail_value(file, path, show_json(v), "a string: fp32, fp16 or bf16");
  std::string s = cd::lower(v.get<std::string>());
  if (s == "bfp16") s = "bf16";  // DeepSpeed's older spelling
  if (torch_names) {
    if (s == "float32" || s == "float" || s == "torch.float32") s = "fp32";
    if (s == "float16" || s == "half" || s == "torch.float16") s = "fp16";
    if (s == "bfloat16" || s == "torch.bfloat16") s = "bf16";
  }
  s = cd::match_enum(file, path, s, {"fp32", "fp16", "bf16"});
  if (s == "fp16") return c10::ScalarType::Half;
  if (s == "bf16") return c10::ScalarType::BFloat16;
  return c10::ScalarType::Float;
}

// The optimizer or scheduler block ({"type": ..., "params": {...}}), checked as create_optimizer /
// create_scheduler will build it.
optim::ConfigBlock read_optim_block(const json& v, const std::string& file, const std::string& name) {
  if (!v.is_object()) cd::fail_value(file, name, show_json(v), "an object {\"type\": ..., \"params\": {...}}");
  optim::ConfigBlock b;
  b.name = name;
  for (const auto& [k, x] : v.items())
    if (k != "type" && k != "params") cd::fail_unknown_key(file, name + "." + k, {"type", "params"});
  if (!v.contains("type") || !v["type"].is_string())
    cd::fail(file, fmt::format("{}.type is missing or not a string: name the {} (e.g. \"{}\")", name, name,
                               name == "optimizer" ? "AdamW" : "WarmupLR"));
  b.type = v["type"].get<std::string>();
  if (v.contains("params") && !v["params"].is_null()) {
    const json& params = v["params"];
    if (!params.is_object()) cd::fail_value(file, name + ".params", show_json(params), "an object");
    for (const auto& [k, x] : params.items()) {
      // DeepSpeed passes null on as None: the constructor's default, but for warmup_max_lr, where WarmupLR
      // takes None as the first group's rate (also under WarmupDecayLR, whose default is 0.001), which is
      // what "auto" is here.
      const bool null_max_lr = x.is_null() && name == "scheduler" && k == "warmup_max_lr";
      if (x.is_null() && !null_max_lr) continue;
      optim::ConfigValue c;
      c.text = show_json(x);
      if (is_auto(x) || null_max_lr) {
        c.kind = optim::ConfigValue::Kind::Auto;
      } else if (x.is_boolean()) {
        c.kind = optim::ConfigValue::Kind::Bool;
        c.flag = x.get<bool>();
      } else if (x.is_number()) {
        c.number = x.get<double>();
      } else if (x.is_array() && std::all_of(x.begin(), x.end(), [](const json& e) { return e.is_number(); })) {
        c.kind = optim::ConfigValue::Kind::Numbers;
        for (const auto& e : x) c.numbers.push_back(e.get<double>());
      } else {
        c.kind = optim::ConfigValue::Kind::String;  // (a string, or anything else: every reader refuses it)
      }
      b.params.emplace_back(k, std::move(c));
    }
  }
  try {
    if (name == "optimizer")
      optim::check_optimizer_block(b);
    else
      optim::check_scheduler_block(b);
  } catch (const accel::InvalidArgumentError& e) {
    cd::fail(file, e.what());
  }
  return b;
}

}  // namespace

namespace config_detail {

DeepSpeedJson read_deepspeed_json(const std::string& text, const std::string& source) {
  const json root = parse_strict(text, source);
  if (!root.is_object())
    fail(source, fmt::format("a DeepSpeed config is a JSON object ({{\"train_batch_size\": ..., "
                             "\"zero_optimization\": ...}}), got {}",
                             root.type_name()));
  DeepSpeedJson out;
  AcceleratorConfig& cfg = out.cfg;
  cfg.source = source;
  cfg.distributed_type = DistributedType::DeepSpeed;
  Block top(root, source, "", deepspeed_keys(""), cfg);

  // The batch triad; "auto" (Hugging Face's convention) is filled at prepare().
  cfg.batch.train_batch_size = batch_value(top, "train_batch_size");
  cfg.batch.micro_batch_per_gpu = batch_value(top, "train_micro_batch_size_per_gpu");
  cfg.batch.gradient_accumulation_steps = batch_value(top, "gradient_accumulation_steps");
  const BatchConfig& b = cfg.batch;
  if (b.train_batch_size && b.micro_batch_per_gpu && b.gradient_accumulation_steps &&
      *b.train_batch_size % (*b.micro_batch_per_gpu * *b.gradient_accumulation_steps) != 0)
    fail(source, fmt::format("train_batch_size {} must equal train_micro_batch_size_per_gpu * "
                             "gradient_accumulation_steps * world size, but {} * {} does not divide it",
                             *b.train_batch_size, *b.micro_batch_per_gpu, *b.gradient_accumulation_steps));
  if (b.gradient_accumulation_steps) cfg.gradient_accumulation_steps = *b.gradient_accumulation_steps;
  if (top.has("gradient_clipping")) {
    const json& v = top.value("gradient_clipping");
    if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>()))
      fail_value(source, "gradient_clipping", show_json(v), "a number >= 0 (0: off) or \"auto\"");
    cfg.gradient_clipping = v.get<double>();
  }

  read_zero(top.has("zero_optimization") ? top.value("zero_optimization") : json(), source, cfg);
  if (top.has("optimizer")) cfg.optimizer = read_optim_block(top.value("optimizer"), source, "optimizer");
  if (top.has("scheduler")) cfg.scheduler = read_optim_block(top.value("scheduler"), source, "scheduler");

  // DeepSpeed's monitors that accel has a tracker for: enabled: true adds it to log_with.
  for (const auto& [block, tracker] :
       {std::pair<const char*, const char*>{"tensorboard", "tensorboard"}, {"csv_monitor", "csv"}}) {
    if (!top.has(block)) continue;
    const Block m(top.value(block), source, top.path(block) + ".", deepspeed_keys(block), cfg);
    if (m.boolean("enabled").value_or(false))
      cfg.log_with.emplace_back(tracker);
    else
      note_ignored(cfg, block, "enabled is not true: no tracker");
  }

  bool fp16 = false, bf16 = false, fp16_auto = false, bf16_auto = false;
  if (top.has("fp16")) read_fp16(top.value("fp16"), source, cfg, fp16, fp16_auto);
  if (top.has("bf16")) read_bf16(top.value("bf16"), source, top.path("bf16"), cfg, bf16, bf16_auto);
  if (fp16 && bf16)
    fail(source, fmt::format("fp16.enabled and {}.enabled are both true; enable at most one", top.path("bf16")));
  cfg.mixed_precision = fp16 ? MixedPrecision::Fp16 : bf16 ? MixedPrecision::Bf16 : MixedPrecision::No;
  out.precision_given = fp16 || bf16;
  out.precision_auto = !out.precision_given && (fp16_auto || bf16_auto);

  if (top.has("amp")) {
    const json& amp = top.value("amp");
    if (amp.contains("enabled") && amp["enabled"].is_boolean() && amp["enabled"].get<bool>())
      fail(source, "amp.enabled is true: NVIDIA Apex AMP is Python only; use \"fp16\" or \"bf16\" instead");
    note_ignored(cfg, "amp", "NVIDIA Apex AMP is Python only");
  }
  if (top.has("gradient_allreduce_op")) {
    const std::string op = top.value("gradient_allreduce_op").get<std::string>();
    if (lower(op) != "mean")
      fail_value(source, "gradient_allreduce_op", op, "\"mean\" (accel averages gradients; \"sum\" is not supported)");
  }
  cfg.spec.reduce_dtype = dtype_key(top, "communication_data_type", source);
  if (top.has("data_types")) {
    Block types(top.value("data_types"), source, top.path("data_types") + ".", deepspeed_keys("data_types"), cfg);
    cfg.spec.accumulate_dtype = dtype_key(types, "grad_accum_dtype", source, /*torch_names=*/true);
  }
  if (top.has("aio")) {
    Block aio(top.value("aio"), source, top.path("aio") + ".", deepspeed_keys("aio"), cfg);
    auto& o = cfg.spec.offload.aio;
    if (auto n = aio.integer("block_size", 4096, 1LL << 30, "a number of bytes from 4096 to 1 GiB"))
      o.block_size = static_cast<std::size_t>(*n);
    if (auto n = aio.integer("queue_depth", 1, 1024, "an integer from 1 to 1024")) o.queue_depth = static_cast<int>(*n);
    if (auto b = aio.boolean("single_submit")) o.single_submit = *b;
    if (auto b = aio.boolean("overlap_events")) o.overlap_events = *b;
  }
  if (top.has("activation_checkpointing")) {
    Block ac(top.value("activation_checkpointing"), source, top.path("activation_checkpointing") + ".",
             deepspeed_keys("activation_checkpointing"), cfg);
    cfg.spec.activation_checkpointing = true;
  }
  return out;
}

}  // namespace config_detail

AcceleratorConfig parse_deepspeed_json(const std::string& text, const std::string& source) {
  return config_detail::read_deepspeed_json(text, source).cfg;
}

}  // namespace accel
