// Private helpers shared by config.cpp, config_yaml.cpp and config_deepspeed.cpp (not installed).
// The text helpers and the shape of error messages: config_text.h.
#pragma once

#include "accelerator/config.h"
#include "accelerator/config_text.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace accel::config_detail {

// Appends "KEY: REASON" unless KEY is already listed.
void note_ignored(AcceleratorConfig& cfg, const std::string& key, const std::string& reason);

// An FSDP sharding strategy given as a name (any case) or Accelerate's 1-based number; returns the
// row's fsdp_name (zero/spec.h). HYBRID_SHARD_ZERO2 and anything else throw, naming WHERE and KEY.
std::string fsdp_strategy_name(const std::string& where, const std::string& key, const std::string& text);

// "none" | "cpu" | "nvme" (any case), else throws.
std::string offload_device(const std::string& where, const std::string& key, const std::string& text);

// The whole file, or ConfigError "PATH: cannot read config file (...)".
std::string read_text_file(const std::string& path);

// Every key of a dialect's key tables, for the tests that hold each key to "acted on or listed as
// ignored". `section` is the dotted block ("" for the top level, "fsdp_config",
// "zero_optimization.offload_param", ...); `ignored` is the reason when accel ignores the key
// whatever its value, nullptr when accel acts on it.
struct KeyRow {
  std::string section;
  std::string name;
  const char* ignored;
};
std::vector<KeyRow> accelerate_yaml_keys();
std::vector<KeyRow> deepspeed_json_keys();

// A DeepSpeed JSON as parse_deepspeed_json reads it, plus what the YAML dialect needs to merge it.
struct DeepSpeedJson {
  AcceleratorConfig cfg;
  bool precision_auto = false;   // fp16.enabled or bf16.enabled is "auto": the YAML's mixed_precision decides
  bool precision_given = false;  // fp16.enabled or bf16.enabled is true
};
DeepSpeedJson read_deepspeed_json(const std::string& text, const std::string& source);

}  // namespace accel::config_detail
