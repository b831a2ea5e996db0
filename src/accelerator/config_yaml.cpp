// Accelerate-style YAML (docs/design.md, "Configuration"), read strictly into an AcceleratorConfig:
//   * distributed_type is required; the top level, fsdp_config, deepspeed_config and fp8_config reject
//     unknown keys with a "did you mean"; wrong types and bad enum values name key, value and what is
//     allowed. A key given twice is an error. A key with a null value (`main_process_ip: null`, as older
//     `accelerate config` wrote) counts as absent.
//   * Keys meaningful only to Python, TPUs, SageMaker, torchrun, torch.compile or Megatron, and keys of
//     features accel does not have yet, are accepted and listed in `ignored` with the reason.
//   * deepspeed_config.deepspeed_config_file names a DeepSpeed JSON (config_deepspeed.cpp); like
//     Accelerate, the YAML may then not also set the keys that JSON decides.
//   * fsdp_config keys may drop the fsdp_ prefix (Accelerate adds it back when launching).
//   * accel extension: a top-level gradient_accumulation_steps (Accelerate has it only on the command line
//     and in deepspeed_config), so accumulation is set by editing the file for every strategy.
#include "accelerator/config.h"

#include "accelerator/config_detail.h"
#include "accelerator/config_keys.h"
#include "base/files.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>

namespace accel {

namespace cd = config_detail;

namespace {

using config_keys::Dialect;
using config_keys::Keys;

// The keys of a block of the YAML (config_keys_table.cpp).
Keys accelerate_keys(const std::string& section) { return config_keys::section(Dialect::Accelerate, section); }

std::string show_node(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Node flow = YAML::Clone(n);  // the node's own (block) style would win over a Flow manipulator
  flow.SetStyle(YAML::EmitterStyle::Flow);
  YAML::Emitter e;
  e << flow;
  return e.c_str();
}

// One mapping of the file (the top level or a *_config block), its keys checked against a table.
class Section {
 public:
  // `prefix`: the dotted path ("fsdp_config."). A key may be written under one of its aliases (the
  // table's). `add_prefix`: a key lacking it is read with it ("sharding_strategy" -> "fsdp_sharding_strategy").
  Section(const YAML::Node& node, std::string file, std::string prefix, const Keys& keys, AcceleratorConfig& cfg,
          const std::string& add_prefix = "")
      : file_(std::move(file)), prefix_(std::move(prefix)) {
    if (!node.IsDefined() || node.IsNull()) return;
    if (!node.IsMap())
      cd::fail_value(file_, prefix_.empty() ? std::string("the file") : prefix_.substr(0, prefix_.size() - 1),
                     show_node(node), "a mapping of keys (key: value lines)");
    std::vector<std::string> valid;
    for (const auto* k : keys) valid.emplace_back(k->name);
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar())
        cd::fail(file_, fmt::format("a key of {} is not a name: {}", where(), show_node(it->first)));
      const std::string written = it->first.Scalar();
      const config_keys::Key* key = config_keys::find(keys, written);
      if (!key && !add_prefix.empty())  // the name without its prefix (not an alias without it)
        if (const auto* k = config_keys::find(keys, add_prefix + written); k && add_prefix + written == k->name)
          key = k;
      if (!key) cd::fail_unknown_key(file_, prefix_ + written, valid);
      const std::string name = key->name;
      if (auto prev = entries_.find(name); prev != entries_.end())
        cd::fail(file_, prev->second.written == written
                            ? fmt::format("{}{} is given twice", prefix_, written)
                            : fmt::format("both {}{} and {}{} are given (the same key); keep one", prefix_,
                                          prev->second.written, prefix_, written));
      entries_.emplace(name, Entry{written, it->second});
      if (key->ignored && !it->second.IsNull()) cd::note_ignored(cfg, prefix_ + written, key->ignored);
    }
  }

  // Given with a non-null value.
  bool has(const std::string& name) const {
    auto it = entries_.find(name);
    return it != entries_.end() && !it->second.node.IsNull();
  }
  bool empty() const {
    for (const auto& [name, e] : entries_)
      if (!e.node.IsNull()) return false;
    return true;
  }
  std::string path(const std::string& name) const {
    auto it = entries_.find(name);
    return prefix_ + (it == entries_.end() ? name : it->second.written);
  }
  const YAML::Node& node(const std::string& name) const { return entries_.at(name).node; }
  const std::string& file() const { return file_; }

  // The scalar text, or an error naming `expected` for a list or mapping.
  std::optional<std::string> text(const std::string& name, const std::string& expected) const {
    if (!has(name)) return std::nullopt;
    if (!node(name).IsScalar()) cd::fail_value(file_, path(name), show_node(node(name)), expected);
    return node(name).Scalar();
  }
  std::optional<std::int64_t> integer(const std::string& name, std::int64_t lo, std::int64_t hi,
                                      const std::string& expected) const {
    auto t = text(name, expected);
    if (!t) return std::nullopt;
    auto v = cd::parse_integer(*t);
    if (!v || *v < lo || *v > hi) cd::fail_value(file_, path(name), *t, expected);
    return v;
  }
  std::optional<double> number(const std::string& name, double lo, const std::string& expected) const {
    auto t = text(name, expected);
    if (!t) return std::nullopt;
    auto v = cd::parse_number(*t);
    if (!v || *v < lo) cd::fail_value(file_, path(name), *t, expected);
    return v;
  }
  std::optional<bool> boolean(const std::string& name) const {
    const std::string expected = "a boolean (true or false)";
    auto t = text(name, expected);
    if (!t) return std::nullopt;
    auto v = cd::parse_bool(*t);
    if (!v) cd::fail_value(file_, path(name), *t, expected);
    return v;
  }
  std::optional<std::string> choice(const std::string& name, const std::vector<std::string>& allowed) const {
    auto t = text(name, "one of " + cd::join(allowed));
    if (!t) return std::nullopt;
    return cd::match_enum(file_, path(name), *t, allowed);
  }

 private:
  std::string where() const { return prefix_.empty() ? "the top level" : prefix_.substr(0, prefix_.size() - 1); }
  struct Entry {
    std::string written;
    YAML::Node node;
  };
  std::string file_, prefix_;
  std::map<std::string, Entry> entries_;
};

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

// --- distributed_type and the top level --------------------------------------------------------

DistributedType read_distributed_type(const Section& top) {
  static const std::vector<std::string> supported = {"NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP"};
  static const std::vector<std::string> unsupported = {"MULTI_NPU",    "MULTI_MLU", "MULTI_SDAA",
                                                       "MULTI_MUSA",   "MULTI_XPU", "MULTI_HPU",
                                                       "MULTI_NEURON", "XLA",       "MEGATRON_LM"};
  if (!top.has("distributed_type"))
    cd::fail(top.file(), fmt::format("missing required key 'distributed_type' (allowed values: {}); Accelerate "
                                     "requires it too",
                                     cd::join(supported)));
  const std::string given = *top.text("distributed_type", "one of " + cd::join(supported));
  for (const auto& u : unsupported)
    if (cd::upper(cd::trim(given)) == u)
      cd::fail(top.file(), fmt::format("distributed_type is '{}', which accel does not support (it runs on CPUs and "
                                       "CUDA GPUs); allowed values: {}",
                                       given, cd::join(supported)));
  const std::string v = cd::match_enum(top.file(), "distributed_type", given, supported);
  if (v == "MULTI_CPU") return DistributedType::MultiCpu;
  if (v == "MULTI_GPU") return DistributedType::MultiGpu;
  if (v == "DEEPSPEED") return DistributedType::DeepSpeed;
  if (v == "FSDP") return DistributedType::Fsdp;
  return DistributedType::No;
}

// log_with: a list of tracker names or one string ("tensorboard,jsonl"); project_dir: a path.
// (The names are checked by the Accelerator, which knows the registered trackers.)
void read_trackers(const Section& top, AcceleratorConfig& cfg) {
  if (top.has("log_with")) {
    const YAML::Node& n = top.node("log_with");
    if (n.IsSequence()) {
      for (const auto& item : n) {
        if (!item.IsScalar()) cd::fail_value(top.file(), top.path("log_with"), show_node(n), "a list of tracker names");
        cfg.log_with.push_back(cd::trim(item.Scalar()));
      }
    } else {
      const std::string list = *top.text("log_with", "a tracker name, a list of them, or \"all\"");
      std::string cur;
      for (char c : list + ",") {
        if (c == ',') {
          if (!cd::trim(cur).empty()) cfg.log_with.push_back(cd::trim(cur));
          cur.clear();
        } else {
          cur += c;
        }
      }
    }
  }
  if (auto dir = top.text("project_dir", "a directory path")) cfg.project_dir = *dir;
  if (auto from = top.text("resume_from_checkpoint", "latest, or a checkpoint directory"))
    cfg.resume_from_checkpoint = *from;
}

void read_machine(const Section& top, AcceleratorConfig& cfg) {
  if (auto env = top.choice("compute_environment", {"LOCAL_MACHINE", "AMAZON_SAGEMAKER"});
      env && *env != "LOCAL_MACHINE")
    cd::fail(top.file(), fmt::format("compute_environment is '{}': accel does not launch SageMaker jobs; use "
                                     "LOCAL_MACHINE and start `accel launch` on the instances",
                                     *env));
  if (auto v = top.boolean("use_cpu")) cfg.use_cpu = *v;
  const auto procs = top.integer("num_processes", 1, kIntMax, "an integer >= 1 (processes over all machines)");
  if (procs) cfg.num_processes = static_cast<int>(*procs);
  if (auto v = top.integer("num_machines", 1, kIntMax, "an integer >= 1")) cfg.num_machines = static_cast<int>(*v);
  if (auto v = top.integer("max_restarts", 0, kIntMax, "an integer >= 0")) cfg.max_restarts = static_cast<int>(*v);
  // machine_rank, main_process_ip and main_process_port are ignored (kMachine), but still checked.
  const int machines = cfg.num_machines.value_or(1);
  if (auto v = top.integer("machine_rank", 0, kIntMax, "an integer >= 0"); v && *v >= machines)
    cd::fail(top.file(),
             fmt::format("machine_rank is {}, expected 0..{} (num_machines is {})", *v, machines - 1, machines));
  if (procs && *cfg.num_processes % machines != 0)
    cd::fail(top.file(), fmt::format("num_processes is {}, expected a multiple of num_machines ({}): every machine "
                                     "runs the same number of processes",
                                     *cfg.num_processes, machines));
  if (auto ip = top.text("main_process_ip", "a host name or IP address")) {
    const std::string s = cd::trim(*ip);
    bool ok = !s.empty();
    for (char c : s)
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '_' ||
                  c == '[' || c == ']');
    if (!ok) cd::fail_value(top.file(), top.path("main_process_ip"), *ip, "a host name or IP address");
  }
  top.integer("main_process_port", 0, 65535, "a port number 0..65535 (0: pick a free port)");
}

std::optional<MixedPrecision> read_mixed_precision(const Section& top) {
  std::optional<MixedPrecision> mp;
  if (auto t = top.text("mixed_precision", "one of no, fp16, bf16, fp8")) mp = parse_mixed_precision(*t, top.file());
  if (auto legacy = top.boolean("fp16")) {  // Accelerate's old spelling
    const MixedPrecision implied = *legacy ? MixedPrecision::Fp16 : MixedPrecision::No;
    if (mp && *mp != implied)
      cd::fail(top.file(), fmt::format("fp16 is {} but mixed_precision is '{}'; remove the old fp16 key",
                                       *legacy ? "true" : "false", to_string(*mp)));
    mp = implied;
  }
  return mp;
}

// --- fsdp_config -------------------------------------------------------------------------------

// "BlockImpl, MlpImpl" (Accelerate's comma-separated form) or a YAML list of names.
std::vector<std::string> module_type_names(const Section& s, const std::string& name) {
  std::vector<std::string> out;
  if (!s.has(name)) return out;
  const std::string expected = "module type names (comma-separated, or a list), e.g. BlockImpl";
  std::vector<std::string> items;
  if (s.node(name).IsSequence()) {
    for (const auto& item : s.node(name)) {
      if (!item.IsScalar()) cd::fail_value(s.file(), s.path(name), show_node(s.node(name)), expected);
      items.push_back(item.Scalar());
    }
  } else {
    items.push_back(*s.text(name, expected));
  }
  for (const auto& item : items) {
    std::string rest = item;
    while (!rest.empty()) {
      const auto pos = rest.find(',');
      const std::string one = cd::trim(rest.substr(0, pos));
      if (!one.empty()) out.push_back(one);
      rest = pos == std::string::npos ? "" : rest.substr(pos + 1);
    }
  }
  return out;
}

void read_fsdp(const Section& s, AcceleratorConfig& cfg) {
  const std::string& file = s.file();
  if (auto v = s.integer("fsdp_version", 1, 2, "1 or 2")) cfg.fsdp_version = static_cast<int>(*v);

  std::optional<std::string> strategy;
  if (auto t = s.text("fsdp_sharding_strategy", "a strategy name or number"))
    strategy = cd::fsdp_strategy_name(file, s.path("fsdp_sharding_strategy"), *t);
  bool reshard = true;
  if (auto t = s.text("fsdp_reshard_after_forward", "a boolean or a strategy name")) {
    const std::string key = s.path("fsdp_reshard_after_forward");
    if (auto b = cd::parse_bool(*t)) {
      reshard = *b;
    } else if (cfg.fsdp_version == 2) {
      cd::fail_value(file, key, *t, "a boolean (true or false) with fsdp_version 2");
    } else {
      // FSDP1: Accelerate's newer questionnaire writes the sharding strategy under this key.
      const std::string named = cd::fsdp_strategy_name(file, key, *t);
      if (strategy && *strategy != named)
        cd::fail(file, fmt::format("{} is '{}' but {} is '{}'; they name the strategy twice, keep one", key, *t,
                                   s.path("fsdp_sharding_strategy"), *strategy));
      strategy = named;
    }
  }
  cfg.spec =
      zero::ShardingSpec::fsdp(strategy.value_or(zero::info(zero::Strategy::Zero3).fsdp_name));  // FSDP's default
  cfg.spec.reshard_after_forward = reshard;

  auto& wrap = cfg.spec.wrap;
  const auto policy = s.choice("fsdp_auto_wrap_policy", {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"});
  const std::vector<std::string> classes = module_type_names(s, "fsdp_transformer_layer_cls_to_wrap");
  const auto min_params =
      s.integer("fsdp_min_num_params", 0, std::numeric_limits<std::int64_t>::max(), "an integer >= 0 (1e8 is fine)");
  if (!policy) {
    wrap.kind = zero::WrapPolicy::Kind::Marked;
  } else if (*policy == "TRANSFORMER_BASED_WRAP") {
    // Without class names Accelerate falls back to the model's _no_split_modules; accel's counterpart
    // is the set of modules the model marked with accel::unit.
    wrap.kind = classes.empty() ? zero::WrapPolicy::Kind::Marked : zero::WrapPolicy::Kind::TypeName;
    wrap.type_names = classes;
  } else if (*policy == "SIZE_BASED_WRAP") {
    wrap.kind = zero::WrapPolicy::Kind::Size;
    wrap.min_num_params = min_params.value_or(100000000);  // Accelerate's launch default, 1e8
  } else {
    wrap.kind = zero::WrapPolicy::Kind::None;
  }
  if (s.has("fsdp_transformer_layer_cls_to_wrap") && wrap.kind != zero::WrapPolicy::Kind::TypeName)
    cd::note_ignored(cfg, s.path("fsdp_transformer_layer_cls_to_wrap"),
                     "used only with fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP");
  if (min_params && wrap.kind != zero::WrapPolicy::Kind::Size)
    cd::note_ignored(cfg, s.path("fsdp_min_num_params"), "used only with fsdp_auto_wrap_policy SIZE_BASED_WRAP");

  if (auto p = s.choice("fsdp_backward_prefetch", {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"})) {
    cfg.spec.backward_prefetch = *p != "NO_PREFETCH";
    if (*p == "BACKWARD_POST")
      cd::note_ignored(cfg, s.path("fsdp_backward_prefetch"),
                       "BACKWARD_POST is taken as BACKWARD_PRE: accel prefetches the next unit's parameters "
                       "before the current unit's gradients are computed; only NO_PREFETCH turns it off");
  }
  if (auto v = s.boolean("fsdp_forward_prefetch")) cfg.spec.forward_prefetch = *v;
  if (auto v = s.boolean("fsdp_offload_params"); v && *v) {
    // FSDP's CPUOffload moves parameters and gradients, and with them the optimizer step, to the CPU.
    cfg.offload_param_device = "cpu";
    cfg.offload_optimizer_device = "cpu";
  }
  if (auto t = s.choice("fsdp_state_dict_type", {"FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT"})) {
    if (*t == "LOCAL_STATE_DICT" && cfg.fsdp_version == 2)
      cd::fail(file, fmt::format("{} is 'LOCAL_STATE_DICT', which FSDP version 2 does not have; allowed values: "
                                 "FULL_STATE_DICT, SHARDED_STATE_DICT",
                                 s.path("fsdp_state_dict_type")));
    // SHARDED and LOCAL both mean each rank writes its own slices, which is accel's sharded checkpoint.
    cfg.state_dict_type = *t == "FULL_STATE_DICT" ? StateDictType::Full : StateDictType::Sharded;
  }
  if (auto v = s.boolean("fsdp_activation_checkpointing")) cfg.spec.activation_checkpointing = *v;
  for (const char* bool_key : {"fsdp_sync_module_states", "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading"})
    s.boolean(bool_key);  // ignored, but still a boolean
}

// --- deepspeed_config --------------------------------------------------------------------------

// Relative paths: the working directory first, then the YAML's directory.
std::string resolve_json_path(const Section& s, const std::string& base_dir) {
  const std::string given = *s.text("deepspeed_config_file", "a path to a DeepSpeed JSON");
  const std::string key = s.path("deepspeed_config_file");
  if (!given.empty() && given[0] == '/') {
    if (files::is_file(given)) return given;
    cd::fail(s.file(), fmt::format("{} is '{}', which does not exist", key, given));
  }
  if (files::is_file(given)) return given;
  const std::string beside = base_dir == "." ? given : base_dir + "/" + given;
  if (files::is_file(beside)) return beside;
  cd::fail(s.file(), fmt::format("{} is '{}', which is neither in the working directory ({}) nor beside the config "
                                 "file ({})",
                                 key, given, files::working_dir(), beside));
}

// The YAML's top-level values that may meet a DeepSpeed JSON.
struct TopLevel {
  std::optional<MixedPrecision> mixed_precision;
  std::optional<std::int64_t> accumulation;  // accel extension
};

void merge_deepspeed_json(const Section& s, const std::string& base_dir, const TopLevel& top, AcceleratorConfig& cfg) {
  static const std::vector<std::string> json_decides = {"zero_stage",
                                                        "offload_optimizer_device",
                                                        "offload_param_device",
                                                        "offload_optimizer_nvme_path",
                                                        "offload_param_nvme_path",
                                                        "gradient_accumulation_steps",
                                                        "gradient_clipping",
                                                        "zero3_save_16bit_model"};
  const std::string json_path = resolve_json_path(s, base_dir);
  cd::DeepSpeedJson ds = cd::read_deepspeed_json(cd::read_text_file(json_path), json_path);
  const AcceleratorConfig& j = ds.cfg;

  std::vector<std::string> both;
  for (const auto& k : json_decides)
    if (s.has(k)) both.push_back(s.path(k));
  MixedPrecision mp = j.mixed_precision;
  if (top.mixed_precision && *top.mixed_precision != MixedPrecision::No) {
    if (ds.precision_auto || (!ds.precision_given && *top.mixed_precision == MixedPrecision::Fp8))
      mp = *top.mixed_precision;  // "auto" in the JSON: the YAML decides; fp8 is not a DeepSpeed JSON setting
    else if (*top.mixed_precision != j.mixed_precision)
      both.push_back(fmt::format("mixed_precision ('{}' in the YAML, '{}' in the JSON)",
                                 to_string(*top.mixed_precision), to_string(j.mixed_precision)));
  }
  BatchConfig batch = j.batch;
  std::int64_t accumulation = j.gradient_accumulation_steps;
  if (top.accumulation) {
    if (j.batch.gradient_accumulation_steps && *j.batch.gradient_accumulation_steps != *top.accumulation)
      both.push_back(fmt::format("gradient_accumulation_steps ({} in the YAML, {} in the JSON)", *top.accumulation,
                                 *j.batch.gradient_accumulation_steps));
    batch.gradient_accumulation_steps = *top.accumulation;
    accumulation = *top.accumulation;
  }
  if (!both.empty())
    cd::fail(s.file(), fmt::format("the following keys are set in both {} and {} ({}): {}; remove them from the YAML: "
                                   "with a DeepSpeed config file, the JSON decides them",
                                   s.file(), json_path, s.path("deepspeed_config_file"), cd::join(both)));

  cfg.deepspeed_config_file = json_path;
  cfg.source = fmt::format("{} + {}", s.file(), json_path);
  cfg.mixed_precision = mp;
  cfg.batch = batch;
  cfg.gradient_accumulation_steps = accumulation;
  cfg.gradient_clipping = j.gradient_clipping;
  cfg.spec = j.spec;
  cfg.mics_shard_size = j.mics_shard_size;
  cfg.offload_optimizer_device = j.offload_optimizer_device;
  cfg.offload_param_device = j.offload_param_device;
  cfg.zero3_save_16bit_model = j.zero3_save_16bit_model;
  cfg.loss_scaler = j.loss_scaler;
  cfg.optimizer = j.optimizer;
  cfg.scheduler = j.scheduler;
  for (const auto& t : j.log_with)  // the JSON's enabled monitors join the YAML's log_with
    if (std::find(cfg.log_with.begin(), cfg.log_with.end(), t) == cfg.log_with.end()) cfg.log_with.push_back(t);
  for (const auto& entry : j.ignored) {
    const auto colon = entry.find(':');
    cd::note_ignored(cfg, entry.substr(0, colon), entry.substr(colon + 2));
  }
}

void read_deepspeed(const Section& s, const std::string& base_dir, const TopLevel& top, AcceleratorConfig& cfg) {
  if (s.has("deepspeed_config_file")) {
    merge_deepspeed_json(s, base_dir, top, cfg);
    return;
  }
  const int stage = static_cast<int>(s.integer("zero_stage", 0, 3, "0, 1, 2 or 3").value_or(2));  // plugin default 2
  cfg.spec = zero::ShardingSpec::zero(stage);
  if (auto t = s.text("offload_optimizer_device", "none, cpu or nvme"))
    cfg.offload_optimizer_device = cd::offload_device(s.file(), s.path("offload_optimizer_device"), *t);
  if (auto t = s.text("offload_param_device", "none, cpu or nvme"))
    cfg.offload_param_device = cd::offload_device(s.file(), s.path("offload_param_device"), *t);
  if (auto t = s.text("offload_optimizer_nvme_path", "a directory")) cfg.spec.offload.optimizer_nvme_path = *t;
  if (auto t = s.text("offload_param_nvme_path", "a directory")) cfg.spec.offload.param_nvme_path = *t;
  struct OffloadKeys {
    const char* key;
    const std::string *device, *path;
  };
  for (const OffloadKeys& o :
       {OffloadKeys{"offload_optimizer", &cfg.offload_optimizer_device, &cfg.spec.offload.optimizer_nvme_path},
        OffloadKeys{"offload_param", &cfg.offload_param_device, &cfg.spec.offload.param_nvme_path}})
    if (*o.device == "nvme" && o.path->empty())
      cd::fail(s.file(),
               fmt::format("{}_device is nvme but {}_nvme_path is not set; give the directory to offload into",
                           s.path(o.key), s.path(o.key)));
  if (cfg.offload_param_device != "none" && stage != 3)
    cd::fail(s.file(), fmt::format("{} is '{}', which needs zero_stage 3 (zero_stage is {}); use zero_stage 3 or "
                                   "offload_param_device none",
                                   s.path("offload_param_device"), cfg.offload_param_device, stage));
  if (s.has("gradient_accumulation_steps") && cd::lower(*s.text("gradient_accumulation_steps", "")) != "auto") {
    const auto ga = *s.integer("gradient_accumulation_steps", 1, std::numeric_limits<std::int64_t>::max(),
                               "an integer >= 1 or auto");
    if (top.accumulation && *top.accumulation != ga)
      cd::fail(s.file(), fmt::format("gradient_accumulation_steps is {} but {} is {}; keep one", *top.accumulation,
                                     s.path("gradient_accumulation_steps"), ga));
    cfg.gradient_accumulation_steps = ga;
    cfg.batch.gradient_accumulation_steps = ga;
  }
  if (s.has("gradient_clipping") && cd::lower(*s.text("gradient_clipping", "")) != "auto")
    cfg.gradient_clipping = *s.number("gradient_clipping", 0, "a number >= 0 (0: off) or auto");
  if (auto v = s.boolean("zero3_save_16bit_model")) cfg.zero3_save_16bit_model = *v;
}

// --- fp8_config --------------------------------------------------------------------------------

void read_fp8(const Section& s, AcceleratorConfig& cfg) {
  // The recipe keys are ignored (config_keys_table.cpp says why) but their values are still checked.
  s.choice("backend", {"AO", "TE", "MSAMP"});
  if (auto v = s.choice("fp8_format", {"HYBRID", "E4M3", "E5M2"})) {
    if (*v == "E5M2")  // (Transformer Engine's every-tensor-e5m2: not a recipe accel has)
      cd::note_ignored(cfg, s.path("fp8_format"),
                       "E5M2 (every tensor in e5m2) is not one of accel's recipes: it trains as HYBRID (e4m3 forward, "
                       "e5m2 gradients)");
    else
      cfg.fp8.fp8_format = *v;
  }
  s.integer("amax_history_len", 1, kIntMax, "an integer >= 1");
  s.choice("amax_compute_algo", {"max", "most_recent"});
  s.integer("margin", 0, kIntMax, "an integer >= 0");
  s.integer("interval", 1, kIntMax, "an integer >= 1");
  s.boolean("pad_inner_dim");
  s.boolean("use_autocast_during_eval");
  if (auto v = s.boolean("enable_fsdp_float8_all_gather")) cfg.fp8.enable_fsdp_float8_all_gather = *v;
  if (auto v = s.choice("recipe", {"tensorwise", "rowwise"})) cfg.fp8.recipe = *v;
}

// parallelism_config (Accelerate's ParallelismConfig): data parallelism as a 2-D mesh, dp_replicate_size
// copies of the model, each sharded over dp_shard_size consecutive ranks (FSDP2's HSDP). accel has no
// tensor, context or sequence parallelism: their sizes must be 1. Read after the strategy.
void read_parallelism(const Section& s, AcceleratorConfig& cfg) {
  const std::string& file = s.file();
  for (const char* size : {"parallelism_config_tp_size", "parallelism_config_cp_size", "parallelism_config_sp_size"})
    if (auto v = s.integer(size, 1, kIntMax, "an integer >= 1"); v && *v != 1)
      cd::fail(file, fmt::format("{} is {}: accel has no tensor, context or sequence parallelism (every rank holds "
                                 "whole layers and whole sequences); set it to 1 or remove it",
                                 s.path(size), *v));
  const auto replicate = s.integer("parallelism_config_dp_replicate_size", 1, kIntMax, "an integer >= 1");
  const auto shard = s.integer("parallelism_config_dp_shard_size", 1, kIntMax, "an integer >= 1");
  const AcceleratorConfig::DataParallelSizes sizes{static_cast<int>(replicate.value_or(1)),
                                                   static_cast<int>(shard.value_or(1))};
  if (sizes.replicate == 1 && sizes.shard == 1) return;  // sizes of 1 say nothing: the strategy as it is
  cfg.parallelism = sizes;
  if (static_cast<std::int64_t>(sizes.replicate) * sizes.shard > kIntMax)
    cd::fail(file, fmt::format("{} is more processes than accel can run", shard_group_source(cfg)));
  if (cfg.num_processes && *cfg.num_processes != sizes.processes())
    cd::fail(file, fmt::format("{} is {} processes, but num_processes is {}; make them agree", shard_group_source(cfg),
                               sizes.processes(), *cfg.num_processes));
  cd::apply_parallelism(cfg, file);
}

YAML::Node load_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    cd::fail(source,
             fmt::format("not valid YAML at line {}, column {}: {}", e.mark.line + 1, e.mark.column + 1, e.msg));
  } catch (const YAML::Exception& e) {
    cd::fail(source, std::string("not valid YAML: ") + e.what());
  }
}

}  // namespace

AcceleratorConfig parse_accelerate_yaml(const std::string& text, const std::string& source,
                                        const std::string& base_dir) {
  const YAML::Node root = load_yaml(text, source);
  AcceleratorConfig cfg;
  cfg.source = source;
  const Section top(root, source, "", accelerate_keys(""), cfg);
  cfg.distributed_type = read_distributed_type(top);
  read_machine(top, cfg);
  TopLevel tl;
  tl.mixed_precision = read_mixed_precision(top);
  if (tl.mixed_precision) cfg.mixed_precision = *tl.mixed_precision;
  tl.accumulation =
      top.integer("gradient_accumulation_steps", 1, std::numeric_limits<std::int64_t>::max(), "an integer >= 1");
  if (tl.accumulation) {
    cfg.gradient_accumulation_steps = *tl.accumulation;
    if (cfg.distributed_type == DistributedType::DeepSpeed) cfg.batch.gradient_accumulation_steps = *tl.accumulation;
  }
  read_trackers(top, cfg);

  const Section fsdp(top.has("fsdp_config") ? top.node("fsdp_config") : YAML::Node(), source, "fsdp_config.",
                     accelerate_keys("fsdp_config"), cfg, "fsdp_");
  const Section ds(top.has("deepspeed_config") ? top.node("deepspeed_config") : YAML::Node(), source,
                   "deepspeed_config.", accelerate_keys("deepspeed_config"), cfg);
  const Section fp8(top.has("fp8_config") ? top.node("fp8_config") : YAML::Node(), source, "fp8_config.",
                    accelerate_keys("fp8_config"), cfg);
  const Section parallelism(top.has("parallelism_config") ? top.node("parallelism_config") : YAML::Node(), source,
                            "parallelism_config.", accelerate_keys("parallelism_config"), cfg, "parallelism_config_");
  const std::string type = to_string(cfg.distributed_type);
  if (!fsdp.empty() && cfg.distributed_type != DistributedType::Fsdp)
    cd::fail(source, fmt::format("fsdp_config is set but distributed_type is {}; set distributed_type: FSDP or remove "
                                 "fsdp_config",
                                 type));
  if (!ds.empty() && cfg.distributed_type != DistributedType::DeepSpeed)
    cd::fail(source, fmt::format("deepspeed_config is set but distributed_type is {}; set distributed_type: DEEPSPEED "
                                 "or remove deepspeed_config",
                                 type));

  switch (cfg.distributed_type) {
    case DistributedType::Fsdp: read_fsdp(fsdp, cfg); break;
    case DistributedType::DeepSpeed: read_deepspeed(ds, base_dir, tl, cfg); break;
    default: cfg.spec = zero::ShardingSpec::ddp(); break;
  }

  read_parallelism(parallelism, cfg);
  read_fp8(fp8, cfg);
  if (!fp8.empty() && cfg.mixed_precision != MixedPrecision::Fp8)
    cd::fail(source, fmt::format("fp8_config is set but mixed_precision is '{}'; set mixed_precision: fp8 or remove "
                                 "fp8_config",
                                 to_string(cfg.mixed_precision)));
  try {
    cfg.spec.validate();
  } catch (const std::invalid_argument& e) {
    cd::fail(source, e.what());
  }
  return cfg;
}

}  // namespace accel
