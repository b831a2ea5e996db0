// The parts of config.h shared by both dialects: names, mixed precision, DeepSpeed's batch rule, the
// dialect dispatch of load_config_file, and resolve_config's precedence (explicit argument > ACCEL_*
// environment > config file > default). Text helpers: config_text.cpp. The dialects themselves:
// config_yaml.cpp (Accelerate YAML), config_deepspeed.cpp (DeepSpeed JSON).
#include "accelerator/config.h"

#include "accelerator/config_detail.h"
#include "base/check.h"
#include "base/env.h"
#include "base/files.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <stdexcept>

namespace accel {

namespace cd = config_detail;

// ---------------------------------------------------------------------------------------------------
// Shared helpers (config_detail.h)

namespace config_detail {

void note_ignored(AcceleratorConfig& cfg, const std::string& key, const std::string& reason) {
  const std::string head = key + ":";
  for (const auto& entry : cfg.ignored)
    if (entry.compare(0, head.size(), head) == 0) return;
  cfg.ignored.push_back(fmt::format("{}: {}", key, reason));
}

std::string fsdp_strategy_name(const std::string& where, const std::string& key, const std::string& text) {
  // Accelerate's numbering (FSDP's ShardingStrategy enum, the table's fsdp_number): 1 .. 4, and 5
  // HYBRID_SHARD_ZERO2 (not a row of the table: ZeRO-2 with a node as the shard group).
  std::vector<std::string> names, numbers;
  for (int n = 1; const zero::StrategyInfo* row = zero::find_fsdp(n); ++n) {
    names.emplace_back(row->fsdp_name);
    numbers.push_back(fmt::format("{} {}", n, names.back()));
  }
  ACCEL_CHECK(static_cast<int>(names.size()) + 1 == zero::kHybridShardZero2Number,
              "the FSDP strategy numbers are not 1..{}", names.size());
  names.emplace_back(zero::kHybridShardZero2);
  numbers.push_back(fmt::format("{} {}", zero::kHybridShardZero2Number, zero::kHybridShardZero2));
  const auto number = parse_integer(text);
  if (!number) return match_enum(where, key, text, names);
  if (*number < 1 || *number > static_cast<std::int64_t>(names.size()))
    fail_value(where, key, text, fmt::format("a strategy name or its number: {}", join(numbers)));
  return names[static_cast<std::size_t>(*number - 1)];
}

void apply_mics(AcceleratorConfig& cfg) {
  if (!cfg.mics_shard_size) return;
  const std::string head = std::string(kMicsKey) + ":";
  std::erase_if(cfg.ignored, [&](const std::string& e) { return e.compare(0, head.size(), head) == 0; });
  if (cfg.distributed_type == DistributedType::DeepSpeed && cfg.spec.strategy == zero::Strategy::Zero3) {
    cfg.spec.shard_group_size = *cfg.mics_shard_size;
    return;
  }
  if (cfg.distributed_type == DistributedType::DeepSpeed)
    note_ignored(cfg, kMicsKey,
                 fmt::format("MiCS shards ZeRO-3: it acts only with stage 3 (the stage in force is {})",
                             zero::info(cfg.spec.strategy).zero_stage));
  else
    note_ignored(cfg, kMicsKey,
                 fmt::format("MiCS is DeepSpeed's ZeRO-3: the distributed type in force is {}",
                             to_string(cfg.distributed_type)));
}

void apply_parallelism(AcceleratorConfig& cfg, const std::string& where) {
  if (!cfg.parallelism) return;
  const int r = cfg.parallelism->replicate, n = cfg.parallelism->shard;
  const std::string sizes = shard_group_source(cfg);
  const bool deepspeed = cfg.distributed_type == DistributedType::DeepSpeed;
  if (cfg.distributed_type == DistributedType::Fsdp && cfg.spec.shards_gradients()) {
    cfg.spec.shard_group_size = n;  // r copies, each sharded over a block of n ranks (r = 1: every rank)
    return;
  }
  if (deepspeed && cfg.spec.shards_optimizer()) {  // ZeRO-1/2/3: one copy over every rank, or MiCS's blocks
    const int mics = cfg.spec.groups_of_ranks();
    if (mics > 0 && mics != n)
      fail(where,
           fmt::format("{} shards each copy over {} ranks, but {} is {}; make them agree", sizes, n, kMicsKey, mics));
    if (mics == 0 && r > 1)
      fail(where, fmt::format("{} replicates the model {} times, but DeepSpeed's ZeRO stage {} shards over every "
                              "rank; use distributed_type FSDP for copies sharded in groups, or ZeRO-3 with {} in "
                              "the DeepSpeed JSON (MiCS)",
                              sizes, r, zero::info(cfg.spec.strategy).zero_stage, kMicsKey));
    return;
  }
  // What shards nothing (DDP, NO_SHARD, DeepSpeed's stage 0): r whole copies, and nothing to shard.
  if (n > 1)
    fail(where, fmt::format("{} shards each copy over {} ranks, but {} shards nothing; {}, or set dp_shard_size to 1",
                            sizes, n,
                            cfg.distributed_type == DistributedType::Fsdp
                                ? fmt::format("fsdp_sharding_strategy {}", zero::info(cfg.spec.strategy).fsdp_name)
                            : deepspeed ? std::string("DeepSpeed's stage 0")
                                        : fmt::format("{} (DDP)", to_string(cfg.distributed_type)),
                            deepspeed ? "use a ZeRO stage" : "use FSDP with FULL_SHARD or SHARD_GRAD_OP"));
}

std::string offload_device(const std::string& where, const std::string& key, const std::string& text) {
  return lower(match_enum(where, key, text, {"none", "cpu", "nvme"}));
}

std::string read_text_file(const std::string& path) {
  if (files::is_dir(path)) fail(path, "cannot read config file (it is a directory)");
  try {
    return files::read_file(path);
  } catch (const std::runtime_error& e) {
    // files::read_file says "cannot read PATH: REASON".
    const std::string what = e.what(), head = fmt::format("cannot read {}: ", path);
    fail(path, fmt::format("cannot read config file ({})", what.rfind(head, 0) == 0 ? what.substr(head.size()) : what));
  }
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

bool default_sync_each_batch(const AcceleratorConfig& cfg) {
  return cfg.distributed_type == DistributedType::DeepSpeed && cfg.spec.shards_gradients();
}

std::string shard_group_source(const AcceleratorConfig& cfg) {
  if (cfg.parallelism)
    return fmt::format("parallelism_config's dp_replicate_size x dp_shard_size ({} x {})", cfg.parallelism->replicate,
                       cfg.parallelism->shard);
  return cfg.spec.groups_of_ranks() > 0 && cfg.mics_shard_size ? std::string(cd::kMicsKey) : std::string();
}

std::string strategy_name(const AcceleratorConfig& cfg) {
  const zero::StrategyInfo& row = zero::info(cfg.spec.strategy);
  switch (cfg.distributed_type) {
    case DistributedType::Fsdp: {
      if (cfg.spec.groups_by_node() && !cfg.spec.hybrid()) return std::string("FSDP ") + zero::kHybridShardZero2;
      const std::string name = std::string("FSDP ") + (row.fsdp_name ? row.fsdp_name : row.short_label);
      const int g = cfg.spec.groups_of_ranks();
      return g > 0 ? fmt::format("{} in groups of {} ranks", name, g) : name;
    }
    case DistributedType::DeepSpeed: {
      const int g = cfg.spec.groups_of_ranks();
      return fmt::format("DeepSpeed {}{}", row.short_label, g > 0 ? fmt::format(" (MiCS, groups of {} ranks)", g) : "");
    }
    case DistributedType::MultiCpu:
    case DistributedType::MultiGpu: return "DDP";
    case DistributedType::No: return "single process";
  }
  return row.name;
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

const char* to_string(StateDictType t) {
  switch (t) {
    case StateDictType::Sharded: return "sharded";
    case StateDictType::Full: return "full";
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
std::string show_count(const std::optional<std::int64_t>& v) {
  return v ? fmt::format("{}", *v) : std::string("unset");
}

std::string triad(const BatchConfig& b, int world) {
  return fmt::format(
      "train_batch_size {}, train_micro_batch_size_per_gpu {}, gradient_accumulation_steps {}, "
      "world size {}",
      show_count(b.train_batch_size), show_count(b.micro_batch_per_gpu), show_count(b.gradient_accumulation_steps),
      world);
}
}  // namespace

BatchConfig resolve_batch(BatchConfig b, int world, std::optional<std::int64_t> loader_micro_batch,
                          std::int64_t accumulation_default, const std::string& source) {
  const std::string where = source.empty() ? std::string("the configuration") : source;
  if (world < 1) cd::fail(where, fmt::format("world size is {}, expected >= 1", world));
  const std::pair<const char*, const std::optional<std::int64_t>*> given[] = {
      {"train_batch_size", &b.train_batch_size},
      {"train_micro_batch_size_per_gpu", &b.micro_batch_per_gpu},
      {"gradient_accumulation_steps", &b.gradient_accumulation_steps}};
  for (const auto& [name, v] : given)
    if (*v && **v <= 0) cd::fail(where, fmt::format("{} is {}, expected a positive integer", name, **v));
  if (loader_micro_batch && *loader_micro_batch <= 0)
    cd::fail(where,
             fmt::format("the prepared loader's batch size is {}, expected a positive integer", *loader_micro_batch));

  // The loader knows the micro batch; the accumulation default fills in only what the rule cannot derive.
  if (!b.micro_batch_per_gpu && loader_micro_batch) b.micro_batch_per_gpu = loader_micro_batch;
  if (!b.gradient_accumulation_steps && !(b.train_batch_size && b.micro_batch_per_gpu)) {
    if (accumulation_default < 1)
      cd::fail(where, fmt::format("gradient_accumulation_steps is {}, expected >= 1", accumulation_default));
    b.gradient_accumulation_steps = accumulation_default;
  }

  const std::int64_t w = world;
  auto& tbs = b.train_batch_size;
  auto& mbs = b.micro_batch_per_gpu;
  auto& gas = b.gradient_accumulation_steps;
  if (!tbs && !mbs)
    cd::fail(where, fmt::format("either train_batch_size or train_micro_batch_size_per_gpu needs to be given ({}); "
                                "set one, or let prepare() take the micro batch from the data loader",
                                triad(b, world)));
  if (tbs && mbs && gas) {
    if (*tbs != *mbs * *gas * w)
      cd::fail(where, fmt::format("batch sizes do not fit: train_batch_size must equal "
                                  "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size, but "
                                  "{} != {} * {} * {} ({})",
                                  *tbs, *mbs, *gas, w, triad(b, world)));
  } else if (tbs && mbs) {
    if (*tbs % (*mbs * w) != 0)
      cd::fail(where, fmt::format("cannot derive gradient_accumulation_steps: train_batch_size is not a multiple of "
                                  "train_micro_batch_size_per_gpu * world size ({})",
                                  triad(b, world)));
    gas = *tbs / (*mbs * w);
  } else if (tbs && gas) {
    if (*tbs % (*gas * w) != 0)
      cd::fail(where, fmt::format("cannot derive train_micro_batch_size_per_gpu: train_batch_size is not a multiple of "
                                  "gradient_accumulation_steps * world size ({})",
                                  triad(b, world)));
    mbs = *tbs / (*gas * w);
  } else {  // micro batch and accumulation known
    tbs = *mbs * *gas * w;
  }
  return b;
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
  return parse_accelerate_yaml(text, path, files::parent_dir(path));
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

std::string env_where(const char* name) { return fmt::format("{} (environment)", name); }

std::optional<Given<std::string>> pick_text(const std::optional<std::string>& arg, const char* var) {
  if (arg && !arg->empty()) return Given<std::string>{*arg, "argument", 2};
  if (auto v = env_text(var)) return Given<std::string>{*v, env_where(var), 1};
  return std::nullopt;
}

std::int64_t env_integer(const char* var, const char* key, std::int64_t lo, std::int64_t hi,
                         const std::string& expected) {
  const std::string text = env::get(var);
  const auto v = cd::parse_integer(text);
  if (!v || *v < lo || *v > hi) cd::fail_value(env_where(var), key, text, expected);
  return *v;
}

void force_deepspeed(AcceleratorConfig& cfg, int stage) {
  const zero::ShardingSpec fresh = zero::ShardingSpec::zero(stage);
  if (cfg.distributed_type == DistributedType::DeepSpeed) {
    cfg.spec.strategy = fresh.strategy;                  // keep the file's buckets and dtypes
    cfg.spec.shard_group_size = fresh.shard_group_size;  // (MiCS's are set again by apply_mics)
  } else {
    cfg.distributed_type = DistributedType::DeepSpeed;
    cfg.spec = fresh;
  }
}

void force_fsdp(AcceleratorConfig& cfg, const std::string& strategy) {
  const zero::ShardingSpec fresh = zero::ShardingSpec::fsdp(strategy);
  if (cfg.distributed_type == DistributedType::Fsdp) {
    cfg.spec.strategy = fresh.strategy;  // keep the file's wrap policy and prefetch
    // The groups go with the strategy (HYBRID_SHARD_ZERO2's nodes); a parallelism_config's are set again.
    cfg.spec.shard_group_size = fresh.shard_group_size;
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
      cd::fail_value("argument", "gradient_accumulation_steps", fmt::format("{}", *args.gradient_accumulation_steps),
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
      cd::fail_value("argument", "zero_stage", fmt::format("{}", *args.zero_stage), "0, 1, 2 or 3");
    stage = Given<int>{*args.zero_stage, "argument", 2};
  } else if (env::is_set("ACCEL_ZERO_STAGE")) {
    stage = Given<int>{static_cast<int>(env_integer("ACCEL_ZERO_STAGE", "zero_stage", 0, 3, "0, 1, 2 or 3")),
                       env_where("ACCEL_ZERO_STAGE"), 1};
  }
  std::optional<Given<std::string>> strategy = pick_text(args.fsdp_sharding_strategy, "ACCEL_FSDP_SHARDING_STRATEGY");
  if (strategy) strategy->value = cd::fsdp_strategy_name(strategy->where, "fsdp_sharding_strategy", strategy->value);

  if (stage && strategy && stage->level == strategy->level)
    cd::fail(stage->where == strategy->where ? stage->where : fmt::format("{} and {}", stage->where, strategy->where),
             "zero_stage (DEEPSPEED) and fsdp_sharding_strategy (FSDP) are both given; give one of them");
  if (stage && (!strategy || stage->level > strategy->level)) {
    force_deepspeed(cfg, stage->value);
    if (strategy)
      cd::note_ignored(cfg, fmt::format("fsdp_sharding_strategy ({})", strategy->where),
                       fmt::format("overridden by zero_stage ({})", stage->where));
  } else if (strategy) {
    force_fsdp(cfg, strategy->value);
    if (stage)
      cd::note_ignored(cfg, fmt::format("zero_stage ({})", stage->where),
                       fmt::format("overridden by fsdp_sharding_strategy ({})", strategy->where));
  }
  if (stage || strategy) {  // the file's MiCS and parallelism_config, against the strategy now in force
    const std::string& by = stage && (!strategy || stage->level > strategy->level) ? stage->where : strategy->where;
    cd::apply_mics(cfg);
    cd::apply_parallelism(cfg, fmt::format("{} (with the strategy from {})",
                                           cfg.source.empty() ? std::string("the configuration") : cfg.source, by));
  }

  try {
    cfg.spec.validate();
  } catch (const std::invalid_argument& e) {
    cd::fail(cfg.source.empty() ? std::string("the configuration") : cfg.source, e.what());
  }
  return cfg;
}

}  // namespace accel
