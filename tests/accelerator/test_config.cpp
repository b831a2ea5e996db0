// The config loader (accelerator/config.h): both dialects, strictly. Every key has a valid and an
// invalid value; errors are checked for the file, the dotted key, the value and what is allowed.
// Rank-independent: every rank runs the same checks on its own (temp files are per process).
#include "accelerator/config.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <vector>

namespace accel {
namespace {

using zero::Strategy;
using WrapKind = zero::WrapPolicy::Kind;

#define EXPECT_HAS(msg, part)                                                                   \
  do {                                                                                          \
    const std::string m_ = (msg);                                                               \
    EXPECT_NE(m_.find(part), std::string::npos) << "expected '" << (part) << "' in: " << m_;    \
  } while (0)

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError thrown>";
}

AcceleratorConfig yaml(const std::string& text, const std::string& base = ".") {
  return parse_accelerate_yaml(text, "t.yaml", base);
}
std::string yaml_error(const std::string& text, const std::string& base = ".") {
  return error_of([&] { yaml(text, base); });
}
AcceleratorConfig ds(const std::string& text) { return parse_deepspeed_json(text, "ds.json"); }
std::string ds_error(const std::string& text) {
  return error_of([&] { ds(text); });
}
bool ignored(const AcceleratorConfig& c, const std::string& key) {
  int n = 0;
  for (const auto& e : c.ignored) n += e.rfind(key + ":", 0) == 0;
  EXPECT_LE(n, 1) << key << " listed more than once";
  return n == 1;
}
std::string ignored_entry(const AcceleratorConfig& c, const std::string& key) {
  for (const auto& e : c.ignored)
    if (e.rfind(key + ":", 0) == 0) return e;
  return "";
}

// A directory of its own for this process (several ranks may run these tests at once). POSIX calls,
// not std::filesystem: libtorch.so exports its own copy of those, and its remove_all crashes.
class TempDir {
 public:
  TempDir() {
    std::string templ = "/tmp/accel_config_test_XXXXXX";
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    for (const auto& f : files_) ::unlink(f.c_str());
    ::rmdir(path_.c_str());
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    files_.push_back(p);
    return p;
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

std::string file_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Clears the launcher variables for the test and restores them afterwards.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* n : {"ACCEL_CONFIG_FILE", "ACCEL_MIXED_PRECISION", "ACCEL_GRADIENT_ACCUMULATION_STEPS",
                          "ACCEL_USE_CPU", "ACCEL_ZERO_STAGE", "ACCEL_FSDP_SHARDING_STRATEGY"}) {
      const char* v = std::getenv(n);
      saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(n);
    }
  }
  ~EnvGuard() {
    for (const auto& [n, v] : saved_) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

std::string source_path(const std::string& rel) { return std::string(ACCEL_SOURCE_DIR) + "/" + rel; }

// ---------------------------------------------------------------------------------------------------
// Top-level keys

TEST(ConfigYaml, MinimalIsDefaults) {
  const auto c = yaml("distributed_type: NO\n");
  EXPECT_EQ(c.distributed_type, DistributedType::No);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_EQ(c.num_processes, 1);
  EXPECT_EQ(c.num_machines, 1);
  EXPECT_EQ(c.machine_rank, 0);
  EXPECT_FALSE(c.use_cpu);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.spec.strategy, Strategy::NoShard);
  EXPECT_EQ(c.source, "t.yaml");
  EXPECT_TRUE(c.ignored.empty());
}

TEST(ConfigYaml, DistributedTypeValid) {
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\n").distributed_type, DistributedType::MultiCpu);
  EXPECT_EQ(yaml("distributed_type: multi_gpu\n").distributed_type, DistributedType::MultiGpu);
  const auto d = yaml("distributed_type: DEEPSPEED\n");
  EXPECT_EQ(d.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(d.spec.strategy, Strategy::Zero2);  // Accelerate's plugin default stage
  const auto f = yaml("distributed_type: FSDP\n");
  EXPECT_EQ(f.distributed_type, DistributedType::Fsdp);
  EXPECT_EQ(f.spec.strategy, Strategy::Zero3);  // FULL_SHARD
  EXPECT_TRUE(f.spec.reshard_after_forward);
  EXPECT_EQ(f.spec.wrap.kind, WrapKind::Marked);
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\n").spec.strategy, Strategy::NoShard);
}

TEST(ConfigYaml, DistributedTypeInvalid) {
  auto m = yaml_error("distributed_type: MULTI_CPUS\n");
  EXPECT_HAS(m, "t.yaml: distributed_type is 'MULTI_CPUS'");
  EXPECT_HAS(m, "did you mean 'MULTI_CPU'?");
  EXPECT_HAS(m, "allowed values: NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP");
  m = yaml_error("distributed_type: XLA\n");
  EXPECT_HAS(m, "t.yaml: distributed_type is 'XLA', which accel does not support");
  EXPECT_HAS(m, "allowed values: NO, MULTI_CPU");
}

TEST(ConfigYaml, MissingDistributedType) {
  auto m = yaml_error("num_processes: 2\nmixed_precision: 'no'\n");
  EXPECT_HAS(m, "t.yaml: missing required key 'distributed_type'");
  EXPECT_HAS(m, "allowed values: NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP");
  EXPECT_HAS(yaml_error(""), "missing required key 'distributed_type'");
}

TEST(ConfigYaml, MixedPrecisionValid) {
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: 'no'\n").mixed_precision, MixedPrecision::No);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: no\n").mixed_precision, MixedPrecision::No);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: fp16\n").mixed_precision, MixedPrecision::Fp16);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: BF16\n").mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(yaml("distributed_type: NO\nmixed_precision: fp8\n").mixed_precision, MixedPrecision::Fp8);
  // Accelerate's legacy key.
  EXPECT_EQ(yaml("distributed_type: NO\nfp16: true\n").mixed_precision, MixedPrecision::Fp16);
}

TEST(ConfigYaml, MixedPrecisionInvalid) {
  auto m = yaml_error("distributed_type: NO\nmixed_precision: fp32\n");
  EXPECT_HAS(m, "t.yaml: mixed_precision is 'fp32'");
  EXPECT_HAS(m, "allowed values: no, fp16, bf16, fp8");
  m = yaml_error("distributed_type: NO\nmixed_precision: bf16\nfp16: true\n");
  EXPECT_HAS(m, "t.yaml: fp16 is true but mixed_precision is 'bf16'");
}

TEST(ConfigYaml, NumProcesses) {
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\nnum_processes: 4\n").num_processes, 4);
  auto m = yaml_error("distributed_type: MULTI_CPU\nnum_processes: two\n");
  EXPECT_HAS(m, "t.yaml: num_processes is 'two', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: 0\n"), "num_processes is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: 1.5\n"), "num_processes is '1.5'");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: [1, 2]\n"), "num_processes is '[1, 2]'");
}

TEST(ConfigYaml, NumMachinesAndMachineRank) {
  const auto c = yaml("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmachine_rank: 1\n");
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.machine_rank, 1);
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_machines: 0\n"), "t.yaml: num_machines is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nnum_processes: 3\nnum_machines: 2\n"),
             "num_processes is 3, expected a multiple of num_machines (2)");
  auto m = yaml_error("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmachine_rank: 2\n");
  EXPECT_HAS(m, "t.yaml: machine_rank is 2, expected 0..1 (num_machines is 2)");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmachine_rank: -1\n"), "machine_rank is '-1', expected an integer >= 0");
}

TEST(ConfigYaml, MainProcessIpAndPort) {
  const auto c = yaml("distributed_type: MULTI_CPU\nmain_process_ip: 10.1.2.3\nmain_process_port: 29500\n");
  EXPECT_EQ(c.main_process_ip, "10.1.2.3");
  EXPECT_EQ(c.main_process_port, 29500);
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\nmain_process_ip: node-0.cluster\n").main_process_ip, "node-0.cluster");
  // null, as older `accelerate config` wrote, is absent.
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\nmain_process_ip: null\nmain_process_port: null\n").main_process_port, 0);
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmain_process_ip: my host\n"),
             "t.yaml: main_process_ip is 'my host', expected a host name or IP address");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmain_process_port: 70000\n"),
             "t.yaml: main_process_port is '70000', expected a port number 0..65535");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nmain_process_port: http\n"), "main_process_port is 'http'");
}

TEST(ConfigYaml, UseCpu) {
  EXPECT_TRUE(yaml("distributed_type: MULTI_CPU\nuse_cpu: true\n").use_cpu);
  EXPECT_FALSE(yaml("distributed_type: MULTI_CPU\nuse_cpu: false\n").use_cpu);
  EXPECT_TRUE(yaml("distributed_type: MULTI_CPU\nuse_cpu: yes\n").use_cpu);
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nuse_cpu: maybe\n"),
             "t.yaml: use_cpu is 'maybe', expected a boolean (true or false)");
}

TEST(ConfigYaml, GradientAccumulationSteps) {
  EXPECT_EQ(yaml("distributed_type: MULTI_CPU\ngradient_accumulation_steps: 4\n").gradient_accumulation_steps, 4);
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\ngradient_accumulation_steps: 0\n"),
             "t.yaml: gradient_accumulation_steps is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\ngradient_accumulation_steps: many\n"),
             "gradient_accumulation_steps is 'many'");
}

TEST(ConfigYaml, ComputeEnvironment) {
  EXPECT_EQ(yaml("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\n").distributed_type, DistributedType::No);
  EXPECT_HAS(yaml_error("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: NO\n"),
             "t.yaml: compute_environment is 'AMAZON_SAGEMAKER': accel does not launch SageMaker jobs");
  EXPECT_HAS(yaml_error("compute_environment: CLOUD\ndistributed_type: NO\n"),
             "compute_environment is 'CLOUD'; allowed values: LOCAL_MACHINE, AMAZON_SAGEMAKER");
}

TEST(ConfigYaml, UnknownKeyDidYouMean) {
  auto m = yaml_error("distributed_type: MULTI_CPU\nnum_proceses: 2\n");
  EXPECT_HAS(m, "t.yaml: unknown key 'num_proceses'; did you mean 'num_processes'?");
  EXPECT_HAS(m, "(valid keys: compute_environment, distributed_type,");
  m = yaml_error("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n");
  EXPECT_HAS(m, "t.yaml: unknown key 'fsdp_config.fsdp_sharding_stratgy'; did you mean 'fsdp_sharding_strategy'?");
  EXPECT_HAS(m, "valid keys: fsdp_version, fsdp_sharding_strategy");
  m = yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  stage: 3\n");
  EXPECT_HAS(m, "unknown key 'deepspeed_config.stage'; did you mean 'zero_stage'?");
  m = yaml_error("distributed_type: NO\ncompletely_unrelated_thing: 1\n");
  EXPECT_HAS(m, "unknown key 'completely_unrelated_thing' (valid keys:");
}

TEST(ConfigYaml, WrongShapeDuplicateAndSyntax) {
  EXPECT_HAS(yaml_error("distributed_type: FSDP\nfsdp_config: FULL_SHARD\n"),
             "t.yaml: fsdp_config is 'FULL_SHARD', expected a mapping of keys");
  EXPECT_HAS(yaml_error("- a\n- b\n"), "t.yaml: the file is '[a, b]', expected a mapping of keys");
  EXPECT_HAS(yaml_error("distributed_type: NO\ndistributed_type: FSDP\n"), "t.yaml: distributed_type is given twice");
  EXPECT_HAS(yaml_error("distributed_type: [NO\n"), "t.yaml: not valid YAML at line");
}

TEST(ConfigYaml, PythonOnlyKeysAreIgnoredOnce) {
  const auto c = yaml(R"(compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
dynamo_config:
  dynamo_backend: INDUCTOR
enable_cpu_affinity: false
gpu_ids: all
main_training_function: main
megatron_lm_config: {}
rdzv_backend: static
same_network: true
tpu_env: []
tpu_name: my-tpu
tpu_use_cluster: false
tpu_use_sudo: false
)");
  for (const char* k : {"debug", "downcast_bf16", "dynamo_config", "enable_cpu_affinity", "gpu_ids",
                        "main_training_function", "megatron_lm_config", "rdzv_backend", "same_network", "tpu_env",
                        "tpu_name", "tpu_use_cluster", "tpu_use_sudo"})
    EXPECT_TRUE(ignored(c, k)) << k;
  EXPECT_EQ(c.ignored.front().rfind("debug:", 0), 0u) << "file order";
  EXPECT_HAS(ignored_entry(c, "tpu_name"), "TPU only");
  EXPECT_HAS(ignored_entry(c, "dynamo_config"), "Python only");
}

TEST(ConfigYaml, EmptyBlocksOfOtherTypesAreFine) {
  // Older `accelerate config` wrote these empty blocks for every distributed type.
  const auto c = yaml("distributed_type: MULTI_GPU\nfsdp_config: {}\ndeepspeed_config: {}\nfp8_config: {}\n");
  EXPECT_EQ(c.distributed_type, DistributedType::MultiGpu);
}

TEST(ConfigYaml, BlocksUnderTheWrongDistributedType) {
  EXPECT_HAS(yaml_error("distributed_type: MULTI_CPU\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"),
             "t.yaml: fsdp_config is set but distributed_type is MULTI_CPU; set distributed_type: FSDP");
  EXPECT_HAS(yaml_error("distributed_type: FSDP\ndeepspeed_config:\n  zero_stage: 3\n"),
             "t.yaml: deepspeed_config is set but distributed_type is FSDP; set distributed_type: DEEPSPEED");
  EXPECT_HAS(yaml_error("distributed_type: FSDP\nparallelism_config:\n  parallelism_config_tp_size: 2\n"),
             "t.yaml: parallelism_config is set");
}

TEST(ConfigYaml, JsonSyntaxAccelerateConfig) {
  // Accelerate accepts .json configs: a JSON object with distributed_type is the YAML dialect.
  TempDir dir;
  const auto c = load_config_file(dir.write("acc.json", R"({"distributed_type": "FSDP", "num_processes": 2,
    "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}})"));
  EXPECT_EQ(c.distributed_type, DistributedType::Fsdp);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  EXPECT_EQ(c.num_processes, 2);
}

TEST(ConfigYaml, MissingFile) {
  auto m = error_of([] { load_config_file("/nonexistent/accel.yaml"); });
  EXPECT_HAS(m, "/nonexistent/accel.yaml: cannot read config file");
}

TEST(ConfigYaml, AccelerateTemplatesLoad) {
  // The shape of Accelerate's FSDP template (no layer class names) and of `accelerate config default`.
  const auto f = yaml(R"(compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
)");
  EXPECT_EQ(f.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(f.spec.wrap.kind, WrapKind::Marked);
  EXPECT_FALSE(f.spec.forward_prefetch);
  EXPECT_EQ(f.state_dict_type, "SHARDED_STATE_DICT");
  EXPECT_EQ(f.mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(f.num_processes, 8);
  const auto d = yaml(R"({"compute_environment": "LOCAL_MACHINE", "debug": false, "distributed_type": "MULTI_GPU",
    "downcast_bf16": false, "enable_cpu_affinity": false, "machine_rank": 0, "main_training_function": "main",
    "mixed_precision": "no", "num_machines": 1, "num_processes": 8, "rdzv_backend": "static",
    "same_network": false, "tpu_use_cluster": false, "tpu_use_sudo": false, "use_cpu": false})");
  EXPECT_EQ(d.distributed_type, DistributedType::MultiGpu);
  // The DeepSpeed plugin form (no JSON).
  const auto z = yaml(R"(compute_environment: LOCAL_MACHINE
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
mixed_precision: bf16
num_processes: 2
)");
  EXPECT_EQ(z.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(z.gradient_clipping, std::optional<double>(1.0));
}

// ---------------------------------------------------------------------------------------------------
// fsdp_config

AcceleratorConfig fsdp(const std::string& block) { return yaml("distributed_type: FSDP\nfsdp_config:\n" + block); }
std::string fsdp_error(const std::string& block) { return yaml_error("distributed_type: FSDP\nfsdp_config:\n" + block); }

TEST(ConfigFsdp, ShardingStrategyNamesAndNumbers) {
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: FULL_SHARD\n").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: SHARD_GRAD_OP\n").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: no_shard\n").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: HYBRID_SHARD\n").spec.strategy, Strategy::HybridShard);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 1\n").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 2\n").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 3\n").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 4\n").spec.strategy, Strategy::HybridShard);
  // Accelerate adds the fsdp_ prefix to keys without it.
  EXPECT_EQ(fsdp("  sharding_strategy: SHARD_GRAD_OP\n").spec.strategy, Strategy::Zero2);
}

TEST(ConfigFsdp, ShardingStrategyInvalid) {
  auto m = fsdp_error("  fsdp_sharding_strategy: FULL\n");
  EXPECT_HAS(m, "t.yaml: fsdp_config.fsdp_sharding_strategy is 'FULL'");
  EXPECT_HAS(m, "allowed values: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD");
  EXPECT_HAS(fsdp_error("  fsdp_sharding_strategy: 7\n"), "fsdp_config.fsdp_sharding_strategy is '7', expected a strategy name");
  for (const char* v : {"HYBRID_SHARD_ZERO2", "5"}) {
    m = fsdp_error(std::string("  fsdp_sharding_strategy: ") + v + "\n");
    EXPECT_HAS(m, "t.yaml: fsdp_config.fsdp_sharding_strategy is '");
    EXPECT_HAS(m, "HYBRID_SHARD_ZERO2 is not supported yet; use HYBRID_SHARD");
    EXPECT_HAS(m, "SHARD_GRAD_OP");
  }
}

TEST(ConfigFsdp, ReshardAfterForward) {
  auto c = fsdp("  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n");
  EXPECT_EQ(c.fsdp_version, 2);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_FALSE(c.spec.reshard_after_forward);
  EXPECT_TRUE(fsdp("  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n").spec.reshard_after_forward);
  // FSDP1: Accelerate's newer questionnaire writes the strategy under this key.
  EXPECT_EQ(fsdp("  fsdp_version: 1\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(fsdp("  fsdp_reshard_after_forward: HYBRID_SHARD\n  fsdp_sharding_strategy: HYBRID_SHARD\n").spec.strategy,
            Strategy::HybridShard);
  EXPECT_HAS(fsdp_error("  fsdp_version: 2\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"),
             "t.yaml: fsdp_config.fsdp_reshard_after_forward is 'SHARD_GRAD_OP', expected a boolean (true or false) "
             "with fsdp_version 2");
  EXPECT_HAS(fsdp_error("  fsdp_reshard_after_forward: NO_SHARD\n  fsdp_sharding_strategy: FULL_SHARD\n"),
             "fsdp_config.fsdp_reshard_after_forward is 'NO_SHARD' but fsdp_config.fsdp_sharding_strategy is 'FULL_SHARD'");
  EXPECT_HAS(fsdp_error("  fsdp_reshard_after_forward: sometimes\n"), "fsdp_config.fsdp_reshard_after_forward is 'sometimes'");
}

TEST(ConfigFsdp, AutoWrapPolicy) {
  auto c = fsdp("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: BlockImpl, MlpImpl\n");
  EXPECT_EQ(c.spec.wrap.kind, WrapKind::TypeName);
  EXPECT_EQ(c.spec.wrap.type_names, (std::vector<std::string>{"BlockImpl", "MlpImpl"}));
  c = fsdp("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: [BlockImpl, MlpImpl]\n");
  EXPECT_EQ(c.spec.wrap.type_names, (std::vector<std::string>{"BlockImpl", "MlpImpl"}));
  // No names (as Accelerate's own template writes it): the modules the model marked with accel::unit,
  // accel's counterpart of Transformers' _no_split_modules.
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n").spec.wrap.kind, WrapKind::Marked);
  c = fsdp("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1e8\n");
  EXPECT_EQ(c.spec.wrap.kind, WrapKind::Size);
  EXPECT_EQ(c.spec.wrap.min_num_params, 100000000);
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 2000\n").spec.wrap.min_num_params, 2000);
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n").spec.wrap.min_num_params, 100000000);
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: NO_WRAP\n").spec.wrap.kind, WrapKind::None);
  EXPECT_EQ(fsdp("  fsdp_offload_params: false\n").spec.wrap.kind, WrapKind::Marked);
  // A layer list without the transformer policy is reported, not silently used.
  c = fsdp("  fsdp_auto_wrap_policy: NO_WRAP\n  fsdp_transformer_layer_cls_to_wrap: BlockImpl\n");
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_transformer_layer_cls_to_wrap"));
  c = fsdp("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: BlockImpl\n"
           "  fsdp_min_num_params: 0\n");
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_min_num_params"));
}

TEST(ConfigFsdp, AutoWrapPolicyInvalid) {
  auto m = fsdp_error("  fsdp_auto_wrap_policy: LAYER_WRAP\n");
  EXPECT_HAS(m, "t.yaml: fsdp_config.fsdp_auto_wrap_policy is 'LAYER_WRAP'");
  EXPECT_HAS(m, "allowed values: TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP");
  EXPECT_HAS(fsdp_error("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: {a: b}\n"),
             "t.yaml: fsdp_config.fsdp_transformer_layer_cls_to_wrap is '{a: b}', expected module type names");
  EXPECT_HAS(fsdp_error("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: [[A]]\n"),
             "fsdp_config.fsdp_transformer_layer_cls_to_wrap is '[[A]]'");
  EXPECT_HAS(fsdp_error("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1.5\n"),
             "t.yaml: fsdp_config.fsdp_min_num_params is '1.5', expected an integer >= 0");
  EXPECT_HAS(fsdp_error("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: -5\n"),
             "fsdp_config.fsdp_min_num_params is '-5'");
}

TEST(ConfigFsdp, Prefetch) {
  EXPECT_TRUE(fsdp("  fsdp_backward_prefetch: BACKWARD_PRE\n").spec.backward_prefetch);
  EXPECT_TRUE(fsdp("  fsdp_backward_prefetch: BACKWARD_POST\n").spec.backward_prefetch);
  EXPECT_FALSE(fsdp("  fsdp_backward_prefetch: NO_PREFETCH\n").spec.backward_prefetch);
  EXPECT_FALSE(fsdp("  fsdp_backward_prefetch_policy: NO_PREFETCH\n").spec.backward_prefetch);  // old name
  EXPECT_HAS(fsdp_error("  fsdp_backward_prefetch: BEFORE\n"),
             "t.yaml: fsdp_config.fsdp_backward_prefetch is 'BEFORE'; allowed values: BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH");
  EXPECT_FALSE(fsdp("  fsdp_forward_prefetch: false\n").spec.forward_prefetch);
  EXPECT_TRUE(fsdp("  fsdp_forward_prefetch: true\n").spec.forward_prefetch);
  EXPECT_HAS(fsdp_error("  fsdp_forward_prefetch: often\n"),
             "fsdp_config.fsdp_forward_prefetch is 'often', expected a boolean");
}

TEST(ConfigFsdp, OffloadParams) {
  auto c = fsdp("  fsdp_offload_params: true\n");
  EXPECT_EQ(c.offload_param_device, "cpu");
  EXPECT_EQ(c.offload_optimizer_device, "cpu");
  EXPECT_EQ(fsdp("  fsdp_offload_params: false\n").offload_param_device, "none");
  EXPECT_HAS(fsdp_error("  fsdp_offload_params: cpu\n"), "fsdp_config.fsdp_offload_params is 'cpu', expected a boolean");
}

TEST(ConfigFsdp, StateDictType) {
  EXPECT_EQ(fsdp("  fsdp_state_dict_type: SHARDED_STATE_DICT\n").state_dict_type, "SHARDED_STATE_DICT");
  EXPECT_EQ(fsdp("  fsdp_state_dict_type: LOCAL_STATE_DICT\n").state_dict_type, "LOCAL_STATE_DICT");
  EXPECT_EQ(fsdp("  fsdp_version: 1\n").state_dict_type, "FULL_STATE_DICT");
  EXPECT_HAS(fsdp_error("  fsdp_state_dict_type: FULL\n"),
             "fsdp_config.fsdp_state_dict_type is 'FULL'; did you mean 'FULL_STATE_DICT'?");
  EXPECT_HAS(fsdp_error("  fsdp_version: 2\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n"),
             "which FSDP version 2 does not have; allowed values: FULL_STATE_DICT, SHARDED_STATE_DICT");
}

TEST(ConfigFsdp, ActivationCheckpointingAndVersion) {
  EXPECT_TRUE(fsdp("  fsdp_activation_checkpointing: true\n").activation_checkpointing);
  EXPECT_HAS(fsdp_error("  fsdp_activation_checkpointing: 2\n"),
             "fsdp_config.fsdp_activation_checkpointing is '2', expected a boolean");
  EXPECT_EQ(fsdp("  fsdp_version: 2\n").fsdp_version, 2);
  EXPECT_EQ(fsdp("  fsdp_version: '1'\n").fsdp_version, 1);
  EXPECT_HAS(fsdp_error("  fsdp_version: 3\n"), "t.yaml: fsdp_config.fsdp_version is '3', expected 1 or 2");
}

TEST(ConfigFsdp, PythonOnlyKeysAreIgnored) {
  const auto c = fsdp("  fsdp_sync_module_states: true\n  fsdp_use_orig_params: true\n"
                      "  fsdp_cpu_ram_efficient_loading: false\n");
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_sync_module_states"));
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_use_orig_params"));
  EXPECT_TRUE(ignored(c, "fsdp_config.fsdp_cpu_ram_efficient_loading"));
  EXPECT_HAS(ignored_entry(c, "fsdp_config.fsdp_sync_module_states"), "rank 0's weights");
  EXPECT_HAS(fsdp_error("  fsdp_use_orig_params: perhaps\n"), "fsdp_config.fsdp_use_orig_params is 'perhaps', expected a boolean");
}

// ---------------------------------------------------------------------------------------------------
// deepspeed_config (without a JSON)

AcceleratorConfig dsy(const std::string& block) { return yaml("distributed_type: DEEPSPEED\ndeepspeed_config:\n" + block); }
std::string dsy_error(const std::string& block) {
  return yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n" + block);
}

TEST(ConfigDeepSpeedYaml, ZeroStage) {
  EXPECT_EQ(dsy("  zero_stage: 0\n").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(dsy("  zero_stage: 1\n").spec.strategy, Strategy::Zero1);
  EXPECT_EQ(dsy("  zero_stage: 3\n").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(dsy("  zero3_init_flag: false\n").spec.strategy, Strategy::Zero2);
  EXPECT_HAS(dsy_error("  zero_stage: 4\n"), "t.yaml: deepspeed_config.zero_stage is '4', expected 0, 1, 2 or 3");
  EXPECT_HAS(dsy_error("  zero_stage: three\n"), "deepspeed_config.zero_stage is 'three'");
}

TEST(ConfigDeepSpeedYaml, OffloadDevices) {
  auto c = dsy("  zero_stage: 3\n  offload_optimizer_device: cpu\n  offload_param_device: cpu\n");
  EXPECT_EQ(c.offload_optimizer_device, "cpu");
  EXPECT_EQ(c.offload_param_device, "cpu");
  EXPECT_EQ(dsy("  offload_optimizer_device: nvme\n").offload_optimizer_device, "nvme");
  EXPECT_EQ(dsy("  offload_optimizer_device: none\n").offload_optimizer_device, "none");
  EXPECT_HAS(dsy_error("  offload_optimizer_device: disk\n"),
             "t.yaml: deepspeed_config.offload_optimizer_device is 'disk'; allowed values: none, cpu, nvme");
  EXPECT_HAS(dsy_error("  offload_param_device: gpu\n"), "deepspeed_config.offload_param_device is 'gpu'");
  EXPECT_HAS(dsy_error("  zero_stage: 2\n  offload_param_device: cpu\n"),
             "deepspeed_config.offload_param_device is 'cpu', which needs zero_stage 3 (zero_stage is 2)");
}

TEST(ConfigDeepSpeedYaml, AccumulationClippingAndSave) {
  auto c = dsy("  gradient_accumulation_steps: 4\n  gradient_clipping: 1.0\n  zero3_save_16bit_model: true\n");
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, std::optional<std::int64_t>(4));
  EXPECT_EQ(c.gradient_clipping, std::optional<double>(1.0));
  EXPECT_TRUE(c.zero3_save_16bit_model);
  c = dsy("  gradient_accumulation_steps: auto\n  gradient_clipping: auto\n");
  EXPECT_FALSE(c.batch.gradient_accumulation_steps.has_value());
  EXPECT_FALSE(c.gradient_clipping.has_value());
  EXPECT_HAS(dsy_error("  gradient_accumulation_steps: 0\n"),
             "t.yaml: deepspeed_config.gradient_accumulation_steps is '0', expected an integer >= 1 or auto");
  EXPECT_HAS(dsy_error("  gradient_clipping: -1\n"), "deepspeed_config.gradient_clipping is '-1', expected a number >= 0");
  EXPECT_HAS(dsy_error("  gradient_clipping: big\n"), "deepspeed_config.gradient_clipping is 'big'");
  EXPECT_HAS(dsy_error("  zero3_save_16bit_model: maybe\n"), "deepspeed_config.zero3_save_16bit_model is 'maybe', expected a boolean");
  // The top-level accumulation (accel extension) and the DeepSpeed one must agree.
  EXPECT_EQ(yaml("distributed_type: DEEPSPEED\ngradient_accumulation_steps: 2\n").batch.gradient_accumulation_steps,
            std::optional<std::int64_t>(2));
  EXPECT_HAS(yaml_error("distributed_type: DEEPSPEED\ngradient_accumulation_steps: 2\ndeepspeed_config:\n"
                        "  gradient_accumulation_steps: 4\n"),
             "gradient_accumulation_steps is 2 but deepspeed_config.gradient_accumulation_steps is 4");
}

TEST(ConfigDeepSpeedYaml, LauncherKeysAreIgnored) {
  const auto c = dsy("  zero3_init_flag: true\n  deepspeed_multinode_launcher: standard\n  deepspeed_hostfile: /job/hostfile\n");
  EXPECT_TRUE(ignored(c, "deepspeed_config.zero3_init_flag"));
  EXPECT_TRUE(ignored(c, "deepspeed_config.deepspeed_multinode_launcher"));
  EXPECT_TRUE(ignored(c, "deepspeed_config.deepspeed_hostfile"));
}

// ---------------------------------------------------------------------------------------------------
// deepspeed_config.deepspeed_config_file: the YAML names a DeepSpeed JSON

const char* kZero3Json = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": 1e6}
})";

TEST(ConfigDeepSpeedFile, LoadsTheJsonBesideTheYaml) {
  TempDir dir;
  dir.write("z3.json", kZero3Json);
  const std::string yml = dir.write("z3.yaml", "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                               "  deepspeed_config_file: z3.json\n  zero3_init_flag: false\n");
  const auto c = load_config_file(yml);
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(c.spec.bucket_bytes, 4000000);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, std::optional<std::int64_t>(4));
  EXPECT_EQ(c.gradient_clipping, std::optional<double>(1.0));
  EXPECT_EQ(c.num_processes, 2);
  EXPECT_EQ(c.deepspeed_config_file, dir.str() + "/z3.json");
  EXPECT_HAS(c.source, "z3.yaml");
  EXPECT_HAS(c.source, "z3.json");
  EXPECT_TRUE(ignored(c, "zero_optimization.overlap_comm"));
  EXPECT_TRUE(ignored(c, "deepspeed_config.zero3_init_flag"));
}

TEST(ConfigDeepSpeedFile, MissingJson) {
  TempDir dir;
  auto m = yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nope.json\n", dir.str());
  EXPECT_HAS(m, "t.yaml: deepspeed_config.deepspeed_config_file is 'nope.json', which is neither in the working directory");
  m = yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: /nonexistent/ds.json\n");
  EXPECT_HAS(m, "deepspeed_config.deepspeed_config_file is '/nonexistent/ds.json', which does not exist");
}

TEST(ConfigDeepSpeedFile, ErrorsInTheJsonNameTheJson) {
  TempDir dir;
  const std::string json = dir.write("bad.json", R"({"zero_optimization": {"stage": 5}})");
  auto m = yaml_error("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: " + json + "\n");
  EXPECT_HAS(m, json + ": zero_optimization.stage is '5', expected 0, 1, 2 or 3");
}

TEST(ConfigDeepSpeedFile, KeysTheJsonDecidesAreContradictions) {
  TempDir dir;
  const std::string json = dir.write("z3.json", kZero3Json);
  const std::string head = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: " + json + "\n";
  for (const char* line : {"  zero_stage: 3\n", "  offload_optimizer_device: cpu\n", "  offload_param_device: none\n",
                           "  gradient_accumulation_steps: 2\n", "  gradient_clipping: 1.0\n",
                           "  zero3_save_16bit_model: true\n"}) {
    const std::string key = std::string(line).substr(2, std::string(line).find(':') - 2);
    auto m = yaml_error(head + line);
    EXPECT_HAS(m, "t.yaml: the following keys are set in both t.yaml and " + json);
    EXPECT_HAS(m, "deepspeed_config." + key);
    EXPECT_HAS(m, "remove them from the YAML");
  }
  auto m = yaml_error(head + "  zero_stage: 3\n  gradient_clipping: 1.0\n");
  EXPECT_HAS(m, "deepspeed_config.zero_stage, deepspeed_config.gradient_clipping");
}

TEST(ConfigDeepSpeedFile, MixedPrecisionAgainstTheJson) {
  TempDir dir;
  const std::string bf16 = dir.write("bf16.json", kZero3Json);
  const std::string autop = dir.write("auto.json", R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})");
  const std::string fp32 = dir.write("fp32.json", R"({"zero_optimization": {"stage": 1}})");
  auto with = [](const std::string& mp, const std::string& json) {
    return "distributed_type: DEEPSPEED\nmixed_precision: " + mp + "\ndeepspeed_config:\n  deepspeed_config_file: " +
           json + "\n";
  };
  EXPECT_EQ(yaml(with("'no'", bf16)).mixed_precision, MixedPrecision::Bf16);  // 'no' = not set: the JSON decides
  EXPECT_EQ(yaml(with("bf16", bf16)).mixed_precision, MixedPrecision::Bf16);  // agree
  EXPECT_EQ(yaml(with("fp16", autop)).mixed_precision, MixedPrecision::Fp16);  // "auto": the YAML decides
  EXPECT_EQ(yaml(with("'no'", autop)).mixed_precision, MixedPrecision::No);
  auto m = yaml_error(with("fp16", bf16));
  EXPECT_HAS(m, "the following keys are set in both t.yaml and " + bf16);
  EXPECT_HAS(m, "mixed_precision ('fp16' in the YAML, 'bf16' in the JSON)");
  EXPECT_HAS(yaml_error(with("bf16", fp32)), "mixed_precision ('bf16' in the YAML, 'no' in the JSON)");
}

TEST(ConfigDeepSpeedFile, TopLevelAccumulationAgainstTheJson) {
  TempDir dir;
  const std::string fixed = dir.write("ga2.json", kZero3Json);
  const std::string autog = dir.write("auto.json", R"({"gradient_accumulation_steps": "auto"})");
  auto with = [](int ga, const std::string& json) {
    return "distributed_type: DEEPSPEED\ngradient_accumulation_steps: " + std::to_string(ga) +
           "\ndeepspeed_config:\n  deepspeed_config_file: " + json + "\n";
  };
  const auto c = yaml(with(8, autog));
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, std::optional<std::int64_t>(8));
  EXPECT_EQ(yaml(with(2, fixed)).gradient_accumulation_steps, 2);
  EXPECT_HAS(yaml_error(with(3, fixed)), "gradient_accumulation_steps (3 in the YAML, 2 in the JSON)");
}

// ---------------------------------------------------------------------------------------------------
// fp8_config

TEST(ConfigFp8, Keys) {
  const auto c = yaml(R"(distributed_type: FSDP
mixed_precision: fp8
fp8_config:
  backend: te
  fp8_format: E4M3
  amax_history_len: 16
  amax_compute_algo: most_recent
  margin: 1
  interval: 2
  use_autocast_during_eval: true
  enable_fsdp_float8_all_gather: false
  pad_inner_dim: false
  override_linear_precision: [false, false, false]
)");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::Fp8);
  EXPECT_EQ(c.fp8.backend, "TE");
  EXPECT_EQ(c.fp8.fp8_format, "E4M3");
  EXPECT_EQ(c.fp8.amax_history_len, 16);
  EXPECT_EQ(c.fp8.amax_compute_algo, "most_recent");
  EXPECT_EQ(c.fp8.margin, 1);
  EXPECT_EQ(c.fp8.interval, 2);
  EXPECT_TRUE(c.fp8.use_autocast_during_eval);
  EXPECT_FALSE(c.fp8.enable_fsdp_float8_all_gather);
  EXPECT_FALSE(c.fp8.pad_inner_dim);
  EXPECT_TRUE(ignored(c, "fp8_config.override_linear_precision"));
  // The names `accelerate config` writes.
  const auto q = yaml("distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  amax_history_length: 8\n"
                      "  amax_compute_algorithm: max\n  optimization_level: O2\n");
  EXPECT_EQ(q.fp8.amax_history_len, 8);
  EXPECT_TRUE(ignored(q, "fp8_config.optimization_level"));
  const auto d = yaml("distributed_type: NO\nmixed_precision: fp8\n");
  EXPECT_EQ(d.fp8.fp8_format, "HYBRID");
  EXPECT_EQ(d.fp8.amax_history_len, 1024);
}

TEST(ConfigFp8, Invalid) {
  const std::string head = "distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n";
  EXPECT_HAS(yaml_error(head + "  backend: XYZ\n"), "t.yaml: fp8_config.backend is 'XYZ'; allowed values: AO, TE, MSAMP");
  EXPECT_HAS(yaml_error(head + "  fp8_format: E3M4\n"), "fp8_config.fp8_format is 'E3M4'; did you mean 'E4M3'?");
  EXPECT_HAS(yaml_error(head + "  amax_history_len: 0\n"), "fp8_config.amax_history_len is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error(head + "  amax_compute_algo: average\n"),
             "fp8_config.amax_compute_algo is 'average'; allowed values: max, most_recent");
  EXPECT_HAS(yaml_error(head + "  margin: -1\n"), "fp8_config.margin is '-1', expected an integer >= 0");
  EXPECT_HAS(yaml_error(head + "  interval: 0\n"), "fp8_config.interval is '0', expected an integer >= 1");
  EXPECT_HAS(yaml_error(head + "  pad_inner_dim: sure\n"), "fp8_config.pad_inner_dim is 'sure', expected a boolean");
  EXPECT_HAS(yaml_error(head + "  use_autocast_during_eval: 3\n"), "fp8_config.use_autocast_during_eval is '3'");
  EXPECT_HAS(yaml_error(head + "  enable_fsdp_float8_all_gather: x\n"), "fp8_config.enable_fsdp_float8_all_gather is 'x'");
  EXPECT_HAS(yaml_error(head + "  amax_histroy_len: 3\n"),
             "unknown key 'fp8_config.amax_histroy_len'; did you mean 'amax_history_len'?");
  EXPECT_HAS(yaml_error("distributed_type: NO\nmixed_precision: bf16\nfp8_config:\n  backend: TE\n"),
             "t.yaml: fp8_config is set but mixed_precision is 'bf16'; set mixed_precision: fp8");
}

// ---------------------------------------------------------------------------------------------------
// DeepSpeed JSON on its own

TEST(ConfigJson, Stage) {
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 0}})").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 1}})").spec.strategy, Strategy::Zero1);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2}})").spec.strategy, Strategy::Zero2);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 3.0}})").spec.strategy, Strategy::Zero3);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": "auto"}})").spec.strategy, Strategy::NoShard);  // DeepSpeed's default
  EXPECT_EQ(ds(R"({"train_batch_size": 8})").spec.strategy, Strategy::NoShard);
  EXPECT_EQ(ds(R"({"zero_optimization": true})").spec.strategy, Strategy::Zero1);  // legacy bool form
  const auto c = ds("{}");
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.source, "ds.json");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 4}})"), "ds.json: zero_optimization.stage is '4', expected 0, 1, 2 or 3");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 1.5}})"), "zero_optimization.stage is '1.5', expected an integer");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": "two"}})"), "zero_optimization.stage is 'two', expected an integer");
  EXPECT_HAS(ds_error(R"({"zero_optimization": 3})"), "ds.json: zero_optimization is '3', expected an object");
}

TEST(ConfigJson, AliasesAutoAndFloats) {
  auto c = ds(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e8, "max_live_parameters": 1e9}})");
  EXPECT_TRUE(ignored(c, "zero_optimization.stage3_prefetch_bucket_size"));
  EXPECT_TRUE(ignored(c, "zero_optimization.max_live_parameters"));
  c = ds(R"({"zero_optimization": {"stage": 2, "prefetch_bucket_size": 100}})");
  EXPECT_TRUE(ignored(c, "zero_optimization.prefetch_bucket_size"));
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})"),
             "ds.json: both 'zero_optimization.prefetch_bucket_size' and its alias "
             "'zero_optimization.stage3_prefetch_bucket_size' are given");
  // 5e8 elements -> bytes; "auto" keeps accel's default bucket.
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}})").spec.bucket_bytes, 2000000000);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})").spec.bucket_bytes,
            zero::ShardingSpec().bucket_bytes);
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": "auto"}})").ignored.size(), 0u);
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"reduce_bucket_size": 1.5}})"),
             "ds.json: zero_optimization.reduce_bucket_size is '1.5', expected an integer");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"overlap_comm": "yes"}})"),
             "zero_optimization.overlap_comm is 'yes', expected a boolean");
}

TEST(ConfigJson, UnknownKeys) {
  auto m = ds_error(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sise": 5e8}})");
  EXPECT_HAS(m, "ds.json: unknown key 'zero_optimization.stage3_prefetch_bucket_sise'; did you mean "
                "'stage3_prefetch_bucket_size'?");
  m = ds_error(R"({"train_micro_batch_size_per_gpus": 4})");
  EXPECT_HAS(m, "ds.json: unknown key 'train_micro_batch_size_per_gpus'; did you mean 'train_micro_batch_size_per_gpu'?");
  EXPECT_HAS(ds_error(R"({"fp16": {"enabled": true, "initial_scale_pow": 8}})"),
             "unknown key 'fp16.initial_scale_pow'; did you mean 'initial_scale_power'?");
  EXPECT_HAS(ds_error(R"({"bf16": {"enable": true}})"), "unknown key 'bf16.enable'; did you mean 'enabled'?");
}

TEST(ConfigJson, PythonOnlyTopLevelKeysAreIgnored) {
  const auto c = ds(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    "scheduler": {"type": "WarmupLR"}, "steps_per_print": 10, "wall_clock_breakdown": false,
    "zero_allow_untested_optimizer": true, "activation_checkpointing": {}, "tensorboard": {"enabled": false},
    "prescale_gradients": false, "data_types": {"grad_accum_dtype": "fp32"}, "checkpoint": {}})");
  EXPECT_HAS(ignored_entry(c, "optimizer"), "accel uses the optimizer/scheduler passed to prepare()");
  EXPECT_HAS(ignored_entry(c, "scheduler"), "accel uses the optimizer/scheduler passed to prepare()");
  for (const char* k : {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
                        "activation_checkpointing", "tensorboard", "prescale_gradients", "data_types", "checkpoint"})
    EXPECT_TRUE(ignored(c, k)) << k;
}

TEST(ConfigJson, TransformersZero3Example) {
  // The shape of the ZeRO-3 config in Transformers' DeepSpeed guide.
  const auto c = ds(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "cpu", "pin_memory": true},
      "overlap_comm": true,
      "contiguous_gradients": true,
      "sub_group_size": 1e9,
      "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto",
      "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9,
      "stage3_gather_16bit_weights_on_model_save": true
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
  })");
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  EXPECT_EQ(c.offload_param_device, "cpu");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_TRUE(c.zero3_save_16bit_model);
  EXPECT_TRUE(ignored(c, "zero_optimization.stage3_max_live_parameters"));
}

TEST(ConfigJson, SyntaxDuplicatesAndShape) {
  EXPECT_HAS(ds_error(R"({"train_batch_size": 8,})"), "ds.json: not valid JSON");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 1, "stage": 2}})"),
             "ds.json: duplicate key 'zero_optimization.stage'");
  EXPECT_HAS(ds_error("[1, 2]"), "ds.json: a DeepSpeed config is a JSON object");
}

TEST(ConfigJson, Offload) {
  auto c = ds(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                                      "offload_param": {"device": "nvme", "nvme_path": "/local"}}})");
  EXPECT_EQ(c.offload_optimizer_device, "cpu");
  EXPECT_EQ(c.offload_param_device, "nvme");
  EXPECT_TRUE(ignored(c, "zero_optimization.offload_optimizer.pin_memory"));
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "offload_optimizer": null}})").offload_optimizer_device, "none");
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}})").offload_optimizer_device, "none");
  // Deprecated aliases.
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})").offload_optimizer_device, "cpu");
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})").offload_optimizer_device, "none");
  EXPECT_EQ(ds(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true}})").offload_param_device, "cpu");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})"),
             "ds.json: both the deprecated 'zero_optimization.cpu_offload' and its replacement "
             "'zero_optimization.offload_optimizer' are given");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}})"),
             "ds.json: zero_optimization.offload_optimizer.device is 'disk'; allowed values: none, cpu, nvme");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memroy": true}}})"),
             "unknown key 'zero_optimization.offload_optimizer.pin_memroy'; did you mean 'pin_memory'?");
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"),
             "zero_optimization.offload_param offloads parameters to 'cpu', which needs stage 3");
}

TEST(ConfigJson, Gather16BitWeights) {
  EXPECT_TRUE(ds(R"({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}})").zero3_save_16bit_model);
  EXPECT_TRUE(ds(R"({"zero_optimization": {"stage": 3, "gather_16bit_weights_on_model_save": true}})").zero3_save_16bit_model);
  EXPECT_TRUE(ds(R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})").zero3_save_16bit_model);
  EXPECT_HAS(ds_error(R"({"zero_optimization": {"stage3_gather_fp16_weights_on_model_save": true,
                                                "stage3_gather_16bit_weights_on_model_save": true}})"),
             "both the deprecated 'zero_optimization.stage3_gather_fp16_weights_on_model_save'");
}

TEST(ConfigJson, Fp16LossScaler) {
  const auto c = ds(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                                "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.5}})");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::Fp16);
  EXPECT_EQ(c.loss_scaler.loss_scale, 0);
  EXPECT_EQ(c.loss_scaler.initial_scale_power, 12);
  EXPECT_EQ(c.loss_scaler.loss_scale_window, 500);
  EXPECT_EQ(c.loss_scaler.hysteresis, 3);
  EXPECT_TRUE(c.loss_scaler.consecutive_hysteresis);
  EXPECT_EQ(c.loss_scaler.min_loss_scale, 0.5);
  EXPECT_EQ(ds(R"({"fp16": {"enabled": true, "loss_scale": 128}})").loss_scaler.loss_scale, 128);
  const auto d = ds(R"({"fp16": {"enabled": true, "initial_scale_power": "auto"}})");
  EXPECT_EQ(d.loss_scaler.initial_scale_power, 16);  // "auto" -> DeepSpeed's default
  EXPECT_EQ(ds(R"({"fp16": {"enabled": false}})").mixed_precision, MixedPrecision::No);
  EXPECT_EQ(ds(R"({"fp16": {"enabled": "auto"}})").mixed_precision, MixedPrecision::No);
  EXPECT_HAS(ds_error(R"({"fp16": {"enabled": true, "loss_scale": -1}})"), "ds.json: fp16.loss_scale is '-1', expected a number >= 0");
  EXPECT_HAS(ds_error(R"({"fp16": {"loss_scale_window": 0}})"), "fp16.loss_scale_window is '0', expected an integer >= 1");
  EXPECT_HAS(ds_error(R"({"fp16": {"min_loss_scale": 0}})"), "fp16.min_loss_scale is '0', expected a number > 0");
  EXPECT_HAS(ds_error(R"({"fp16": {"hysteresis": 1.5}})"), "fp16.hysteresis is '1.5', expected an integer");
  EXPECT_HAS(ds_error(R"({"fp16": {"enabled": "yes"}})"), "fp16.enabled is 'yes', expected a boolean");
}

TEST(ConfigJson, Bf16AndBoth) {
  EXPECT_EQ(ds(R"({"bf16": {"enabled": true}})").mixed_precision, MixedPrecision::Bf16);
  EXPECT_EQ(ds(R"({"bfloat16": {"enabled": true}})").mixed_precision, MixedPrecision::Bf16);
  // bf16 master weights are an option (read, not ignored); bf16_optimizer_states follows them.
  EXPECT_FALSE(ds(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": false}})").spec.master_dtype.has_value());
  EXPECT_EQ(ds(R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})").spec.master_dtype,
            c10::ScalarType::BFloat16);
  EXPECT_FALSE(ds(R"({"bf16": {"enabled": false, "bf16_master_weights_and_grads": true}})").spec.master_dtype.has_value());
  EXPECT_TRUE(ignored(ds(R"({"bf16": {"enabled": true, "bf16_optimizer_states": true}})"), "bf16.bf16_optimizer_states"));
  auto m = ds_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_HAS(m, "ds.json: fp16.enabled and bf16.enabled are both true; enable at most one");
  EXPECT_HAS(ds_error(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})"), "its alias 'bfloat16'");
  EXPECT_HAS(ds_error(R"({"bf16": true})"), "ds.json: bf16 is 'true', expected an object");
}

TEST(ConfigJson, CommunicationDataTypeAndClipping) {
  EXPECT_EQ(ds(R"({"communication_data_type": "fp16"})").spec.reduce_dtype, c10::ScalarType::Half);
  EXPECT_EQ(ds(R"({"communication_data_type": "bf16"})").spec.reduce_dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(ds(R"({"communication_data_type": "fp32"})").spec.reduce_dtype, c10::ScalarType::Float);
  EXPECT_FALSE(ds("{}").spec.reduce_dtype.has_value());
  EXPECT_HAS(ds_error(R"({"communication_data_type": "int8"})"),
             "ds.json: communication_data_type is 'int8'; allowed values: fp32, fp16, bf16");
  EXPECT_EQ(ds(R"({"gradient_clipping": 0.5})").gradient_clipping, std::optional<double>(0.5));
  EXPECT_FALSE(ds(R"({"gradient_clipping": "auto"})").gradient_clipping.has_value());
  EXPECT_HAS(ds_error(R"({"gradient_clipping": -1})"), "ds.json: gradient_clipping is '-1', expected a number >= 0");
  EXPECT_HAS(ds_error(R"({"gradient_clipping": "high"})"), "gradient_clipping is 'high'");
  EXPECT_HAS(ds_error(R"({"gradient_allreduce_op": "sum"})"), "gradient_allreduce_op is 'sum'");
  EXPECT_HAS(ds_error(R"({"amp": {"enabled": true}})"), "amp.enabled is true");
}

TEST(ConfigJson, BatchValues) {
  auto c = ds(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})");
  EXPECT_EQ(c.batch.train_batch_size, std::optional<std::int64_t>(32));
  EXPECT_EQ(c.batch.micro_batch_per_gpu, std::optional<std::int64_t>(4));
  EXPECT_EQ(c.batch.gradient_accumulation_steps, std::optional<std::int64_t>(2));
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  c = ds(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"})");
  EXPECT_FALSE(c.batch.train_batch_size || c.batch.micro_batch_per_gpu || c.batch.gradient_accumulation_steps);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(ds(R"({"train_batch_size": 1e3})").batch.train_batch_size, std::optional<std::int64_t>(1000));
  EXPECT_HAS(ds_error(R"({"train_batch_size": 0})"), "ds.json: train_batch_size is '0', expected a positive integer or \"auto\"");
  EXPECT_HAS(ds_error(R"({"train_micro_batch_size_per_gpu": 2.5})"), "train_micro_batch_size_per_gpu is '2.5'");
  EXPECT_HAS(ds_error(R"({"gradient_accumulation_steps": "four"})"), "gradient_accumulation_steps is 'four'");
  EXPECT_HAS(ds_error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})"),
             "ds.json: train_batch_size 30 must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size");
}

TEST(ConfigJson, LoadConfigFileTellsTheDialectApart) {
  const auto c = load_config_file(source_path("configs/deepspeed/zero2.json"));
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  TempDir dir;
  EXPECT_HAS(error_of([&] { load_config_file(dir.write("broken.json", "{\"zero_optimization\": {\"stage\": 2,}}")); }),
             "broken.json: not valid JSON");
}

// ---------------------------------------------------------------------------------------------------
// resolve_batch: DeepSpeed's table (deepspeed.md §1.2)

using OptI = std::optional<std::int64_t>;
BatchConfig triad(OptI t, OptI m, OptI g) { return BatchConfig{t, m, g}; }

TEST(ConfigBatch, AllThree) {
  const auto b = resolve_batch(triad(32, 4, 2), 4, std::nullopt, 1, "ds.json");
  EXPECT_EQ(b.train_batch_size, OptI(32));
  auto m = error_of([] { resolve_batch(triad(32, 4, 2), 2, std::nullopt, 1, "ds.json"); });
  EXPECT_HAS(m, "ds.json: batch sizes do not fit");
  EXPECT_HAS(m, "32 != 4 * 2 * 2");
}

TEST(ConfigBatch, Derivations) {
  auto b = resolve_batch(triad(32, 4, std::nullopt), 2, std::nullopt, 7, "s");  // TBS + MBS -> GAS (not the default)
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(4));
  b = resolve_batch(triad(32, std::nullopt, 2), 4, std::nullopt, 1, "s");  // TBS + GAS -> MBS
  EXPECT_EQ(b.micro_batch_per_gpu, OptI(4));
  b = resolve_batch(triad(std::nullopt, 4, 2), 3, std::nullopt, 1, "s");  // MBS + GAS -> TBS
  EXPECT_EQ(b.train_batch_size, OptI(24));
  b = resolve_batch(triad(16, std::nullopt, std::nullopt), 4, std::nullopt, 1, "s");  // TBS only
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(1));
  EXPECT_EQ(b.micro_batch_per_gpu, OptI(4));
  b = resolve_batch(triad(std::nullopt, 8, std::nullopt), 2, std::nullopt, 1, "s");  // MBS only
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(1));
  EXPECT_EQ(b.train_batch_size, OptI(16));
  // "auto" everywhere: the loader gives the micro batch, the Accelerator the accumulation.
  b = resolve_batch(triad(std::nullopt, std::nullopt, std::nullopt), 2, 8, 3, "s");
  EXPECT_EQ(b.micro_batch_per_gpu, OptI(8));
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(3));
  EXPECT_EQ(b.train_batch_size, OptI(48));
  // TBS given, micro from the loader: accumulation derived.
  b = resolve_batch(triad(64, std::nullopt, std::nullopt), 2, 8, 1, "s");
  EXPECT_EQ(b.gradient_accumulation_steps, OptI(4));
}

TEST(ConfigBatch, Failures) {
  EXPECT_HAS(error_of([] { resolve_batch(triad(30, 4, std::nullopt), 2, std::nullopt, 1, "ds.json"); }),
             "ds.json: cannot derive gradient_accumulation_steps: train_batch_size is not a multiple of "
             "train_micro_batch_size_per_gpu * world size (train_batch_size 30, train_micro_batch_size_per_gpu 4");
  EXPECT_HAS(error_of([] { resolve_batch(triad(30, std::nullopt, 4), 2, std::nullopt, 1, "ds.json"); }),
             "cannot derive train_micro_batch_size_per_gpu");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, std::nullopt, 2), 2, std::nullopt, 1, "ds.json"); }),
             "ds.json: either train_batch_size or train_micro_batch_size_per_gpu needs to be given");
  EXPECT_HAS(error_of([] { resolve_batch(triad(0, 4, 1), 1, std::nullopt, 1, "ds.json"); }),
             "ds.json: train_batch_size is 0, expected a positive integer");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, -2, 1), 1, std::nullopt, 1, "ds.json"); }),
             "train_micro_batch_size_per_gpu is -2");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, 4, 0), 1, std::nullopt, 1, "ds.json"); }),
             "gradient_accumulation_steps is 0");
  EXPECT_HAS(error_of([] { resolve_batch(triad(std::nullopt, std::nullopt, 1), 1, 0, 1, "ds.json"); }),
             "the prepared loader's batch size is 0");
  EXPECT_HAS(error_of([] { resolve_batch(triad(8, 4, 2), 0, std::nullopt, 1, "ds.json"); }), "world size is 0");
}

// ---------------------------------------------------------------------------------------------------
// Helpers and describe()

TEST(ConfigHelpers, ClosestKey) {
  const std::vector<std::string> keys = {"num_processes", "num_machines", "machine_rank", "zero_stage"};
  EXPECT_EQ(closest_key("num_proceses", keys), "num_processes");
  EXPECT_EQ(closest_key("NUM_MACHINES", keys), "num_machines");
  EXPECT_EQ(closest_key("stage", keys), "zero_stage");
  EXPECT_EQ(closest_key("learning_rate", keys), "");
  EXPECT_EQ(closest_key("x", {}), "");
}

TEST(ConfigHelpers, Names) {
  EXPECT_STREQ(to_string(DistributedType::DeepSpeed), "DEEPSPEED");
  EXPECT_STREQ(to_string(DistributedType::MultiCpu), "MULTI_CPU");
  EXPECT_STREQ(to_string(MixedPrecision::Bf16), "bf16");
  EXPECT_EQ(parse_mixed_precision("FP16", "argument"), MixedPrecision::Fp16);
  EXPECT_HAS(error_of([] { parse_mixed_precision("half", "argument"); }),
             "argument: mixed_precision is 'half'; allowed values: no, fp16, bf16, fp8");
}

TEST(ConfigHelpers, Describe) {
  auto d = load_config_file(source_path("configs/fsdp/full_shard.yaml")).describe();
  EXPECT_HAS(d, "FSDP FULL_SHARD");
  EXPECT_HAS(d, "parameters sharded");
  EXPECT_HAS(d, "BlockImpl");
  EXPECT_HAS(d, "fp32");
  EXPECT_HAS(d, "Gradients accumulate over 1 micro-step");
  EXPECT_HAS(d, "Ignored keys: ");
  EXPECT_HAS(d, "fsdp_config.fsdp_use_orig_params");
  d = load_config_file(source_path("configs/deepspeed/zero2.yaml")).describe();
  EXPECT_HAS(d, "DeepSpeed ZeRO stage 2");
  EXPECT_HAS(d, "gradients sharded");
  EXPECT_HAS(d, "train_batch_size auto");
  d = ds(R"({"fp16": {"enabled": true}, "train_batch_size": 16})").describe();
  EXPECT_HAS(d, "fp16 compute");
  EXPECT_HAS(d, "dynamic loss scale from 2^16");
  EXPECT_HAS(d, "train_batch_size 16");
  EXPECT_HAS(AcceleratorConfig().describe(), "no config file");
}

// ---------------------------------------------------------------------------------------------------
// resolve_config: explicit argument > ACCEL_* environment > file > default

TEST(ConfigEnv, NoFileAnywhereGivesDefaults) {
  EnvGuard env;
  const auto c = resolve_config();
  EXPECT_EQ(c.source, "");
  EXPECT_EQ(c.distributed_type, DistributedType::No);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
}

TEST(ConfigEnv, ConfigFile) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/shard_grad_op.yaml"));
  EXPECT_EQ(resolve_config().spec.strategy, Strategy::Zero2);
  ConfigOverrides args;
  args.config_file = source_path("configs/ddp.yaml");
  EXPECT_EQ(resolve_config(args).distributed_type, DistributedType::MultiCpu);  // the argument wins
  env.set("ACCEL_CONFIG_FILE", "/nonexistent/x.yaml");
  EXPECT_HAS(error_of([] { resolve_config(); }), "/nonexistent/x.yaml: cannot read config file");
}

TEST(ConfigEnv, MixedPrecision) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/ddp.yaml"));
  EXPECT_EQ(resolve_config().mixed_precision, MixedPrecision::No);  // the file's
  env.set("ACCEL_MIXED_PRECISION", "bf16");
  EXPECT_EQ(resolve_config().mixed_precision, MixedPrecision::Bf16);  // environment > file
  ConfigOverrides args;
  args.mixed_precision = "fp16";
  EXPECT_EQ(resolve_config(args).mixed_precision, MixedPrecision::Fp16);  // argument > environment
  env.set("ACCEL_MIXED_PRECISION", "fp64");
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "ACCEL_MIXED_PRECISION (environment): mixed_precision is 'fp64'; did you mean 'fp16'?");
  EXPECT_HAS(error_of([] { resolve_config(); }), "allowed values: no, fp16, bf16, fp8");
  args.mixed_precision = "half";
  EXPECT_HAS(error_of([&] { resolve_config(args); }), "argument: mixed_precision is 'half'");
}

TEST(ConfigEnv, GradientAccumulationSteps) {
  EnvGuard env;
  env.set("ACCEL_GRADIENT_ACCUMULATION_STEPS", "4");
  auto c = resolve_config();
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  ConfigOverrides args;
  args.gradient_accumulation_steps = 2;
  EXPECT_EQ(resolve_config(args).gradient_accumulation_steps, 2);
  // Over a DeepSpeed JSON, the override is a given value of the batch triad.
  env.set("ACCEL_CONFIG_FILE", source_path("configs/deepspeed/zero1.yaml"));
  c = resolve_config();
  EXPECT_EQ(c.batch.gradient_accumulation_steps, OptI(4));
  env.set("ACCEL_GRADIENT_ACCUMULATION_STEPS", "x");
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "ACCEL_GRADIENT_ACCUMULATION_STEPS (environment): gradient_accumulation_steps is 'x', expected an integer >= 1");
  env.set("ACCEL_GRADIENT_ACCUMULATION_STEPS", "0");
  EXPECT_HAS(error_of([] { resolve_config(); }), "gradient_accumulation_steps is '0'");
  args.gradient_accumulation_steps = 0;
  EXPECT_HAS(error_of([&] { resolve_config(args); }), "argument: gradient_accumulation_steps is '0'");
}

TEST(ConfigEnv, UseCpu) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/full_shard.yaml"));
  EXPECT_FALSE(resolve_config().use_cpu);
  env.set("ACCEL_USE_CPU", "1");
  EXPECT_TRUE(resolve_config().use_cpu);
  ConfigOverrides args;
  args.use_cpu = false;
  EXPECT_FALSE(resolve_config(args).use_cpu);
  env.set("ACCEL_USE_CPU", "maybe");
  EXPECT_HAS(error_of([] { resolve_config(); }), "ACCEL_USE_CPU (environment): use_cpu is 'maybe', expected a boolean");
}

TEST(ConfigEnv, ZeroStageForcesDeepSpeed) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/ddp.yaml"));
  env.set("ACCEL_ZERO_STAGE", "3");
  auto c = resolve_config();
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero3);
  ConfigOverrides args;
  args.zero_stage = 1;
  EXPECT_EQ(resolve_config(args).spec.strategy, Strategy::Zero1);
  env.set("ACCEL_ZERO_STAGE", "7");
  EXPECT_HAS(error_of([] { resolve_config(); }), "ACCEL_ZERO_STAGE (environment): zero_stage is '7', expected 0, 1, 2 or 3");
  args.zero_stage = -1;
  EXPECT_HAS(error_of([&] { resolve_config(args); }), "argument: zero_stage is '-1'");
}

TEST(ConfigEnv, FsdpStrategyForcesFsdp) {
  EnvGuard env;
  env.set("ACCEL_CONFIG_FILE", source_path("configs/ddp.yaml"));
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP");
  auto c = resolve_config();
  EXPECT_EQ(c.distributed_type, DistributedType::Fsdp);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero2);
  // Over an FSDP file, only the strategy changes; the wrap policy stays.
  env.set("ACCEL_CONFIG_FILE", source_path("configs/fsdp/full_shard.yaml"));
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "3");
  c = resolve_config();
  EXPECT_EQ(c.spec.strategy, Strategy::NoShard);
  EXPECT_EQ(c.spec.wrap.kind, WrapKind::TypeName);
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "HYBRID_SHARD_ZERO2");
  EXPECT_HAS(error_of([] { resolve_config(); }),
             "ACCEL_FSDP_SHARDING_STRATEGY (environment): fsdp_sharding_strategy is 'HYBRID_SHARD_ZERO2': "
             "HYBRID_SHARD_ZERO2 is not supported yet");
  // Both at the same level is ambiguous; an argument beats the environment.
  env.set("ACCEL_FSDP_SHARDING_STRATEGY", "FULL_SHARD");
  env.set("ACCEL_ZERO_STAGE", "2");
  EXPECT_HAS(error_of([] { resolve_config(); }), "zero_stage (DEEPSPEED) and fsdp_sharding_strategy (FSDP) are both given");
  ConfigOverrides args;
  args.zero_stage = 1;
  c = resolve_config(args);
  EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
  EXPECT_EQ(c.spec.strategy, Strategy::Zero1);
  EXPECT_TRUE(ignored(c, "fsdp_sharding_strategy (ACCEL_FSDP_SHARDING_STRATEGY (environment))"));
}

// ---------------------------------------------------------------------------------------------------
// The shipped configs

TEST(ConfigShipped, Ddp) {
  const auto c = load_config_file(source_path("configs/ddp.yaml"));
  EXPECT_EQ(c.distributed_type, DistributedType::MultiCpu);
  EXPECT_EQ(c.spec.strategy, Strategy::NoShard);
  EXPECT_EQ(c.num_processes, 2);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
  EXPECT_TRUE(c.use_cpu);
}

TEST(ConfigShipped, Fsdp) {
  const std::pair<const char*, Strategy> files[] = {{"full_shard", Strategy::Zero3},
                                                    {"shard_grad_op", Strategy::Zero2},
                                                    {"no_shard", Strategy::NoShard},
                                                    {"hybrid_shard", Strategy::HybridShard}};
  for (const auto& [name, strategy] : files) {
    SCOPED_TRACE(name);
    const auto c = load_config_file(source_path(std::string("configs/fsdp/") + name + ".yaml"));
    EXPECT_EQ(c.distributed_type, DistributedType::Fsdp);
    EXPECT_EQ(c.spec.strategy, strategy);
    EXPECT_EQ(c.spec.wrap.kind, WrapKind::TypeName);
    EXPECT_EQ(c.spec.wrap.type_names, std::vector<std::string>{"BlockImpl"});
    EXPECT_EQ(c.num_processes, 2);
    EXPECT_EQ(c.num_machines, 1);
    EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
    EXPECT_EQ(c.offload_param_device, "none");
  }
}

TEST(ConfigShipped, DeepSpeed) {
  const std::pair<const char*, Strategy> files[] = {{"zero1", Strategy::Zero1},
                                                    {"zero2", Strategy::Zero2},
                                                    {"zero3", Strategy::Zero3},
                                                    {"zero3_offload", Strategy::Zero3}};
  for (const auto& [name, strategy] : files) {
    SCOPED_TRACE(name);
    const auto c = load_config_file(source_path(std::string("configs/deepspeed/") + name + ".yaml"));
    EXPECT_EQ(c.distributed_type, DistributedType::DeepSpeed);
    EXPECT_EQ(c.spec.strategy, strategy);
    EXPECT_EQ(c.num_processes, 2);
    EXPECT_EQ(c.mixed_precision, MixedPrecision::No);
    EXPECT_EQ(file_name(c.deepspeed_config_file), std::string(name) + ".json");
    EXPECT_FALSE(c.batch.train_batch_size || c.batch.micro_batch_per_gpu || c.batch.gradient_accumulation_steps);
    EXPECT_FALSE(c.gradient_clipping.has_value());
    const bool offload = std::string(name) == "zero3_offload";
    EXPECT_EQ(c.offload_optimizer_device, offload ? "cpu" : "none");
    EXPECT_EQ(c.offload_param_device, offload ? "cpu" : "none");
    // The JSON alone reads the same.
    EXPECT_EQ(load_config_file(c.deepspeed_config_file).spec.strategy, strategy);
    // With a loader of 4 samples per process on 2 ranks, "auto" resolves.
    const auto b = resolve_batch(c.batch, 2, 4, c.gradient_accumulation_steps, c.source);
    EXPECT_EQ(b.train_batch_size, OptI(8));
  }
  EXPECT_EQ(load_config_file(source_path("configs/deepspeed/zero1.yaml")).spec.bucket_bytes, 20000000);
  EXPECT_TRUE(load_config_file(source_path("configs/deepspeed/zero3.yaml")).zero3_save_16bit_model);
}

}  // namespace
}  // namespace accel
