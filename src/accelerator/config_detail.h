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
// row's fsdp_name (zero/spec.h), or HYBRID_SHARD_ZERO2 (5); anything else throws, naming WHERE and KEY.
std::string fsdp_strategy_name(const std::string& where, const std::string& key, const std::string& text);

// cfg.mics_shard_size against the distributed type and stage in force: DeepSpeed at stage 3 shards in
// blocks of that many ranks; anything else lists the key as ignored, saying why (replacing an earlier
// reason). Nothing without cfg.mics_shard_size.
void apply_mics(AcceleratorConfig& cfg);
inline constexpr const char* kMicsKey = "zero_optimization.mics_shard_size";

// cfg.parallelism against the distributed type and strategy: under FSDP a strategy that shards
// gradients takes blocks of `shard` ranks as its shard groups; anything the type cannot do (shards under
// DDP, NO_SHARD or DeepSpeed's stage 0, copies under ZeRO without MiCS, a mics_shard_size of another
// size) throws, naming WHERE. Nothing without cfg.parallelism.
void apply_parallelism(AcceleratorConfig& cfg, const std::string& where);

// "none" | "cpu" | "nvme" (any case), else throws.
std::string offload_device(const std::string& where, const std::string& key, const std::string& text);

// The whole file, or ConfigError "PATH: cannot read config file (...)".
std::string read_text_file(const std::string& path);

// A DeepSpeed JSON as parse_deepspeed_json reads it, plus what the YAML dialect needs to merge it.
struct DeepSpeedJson {
  AcceleratorConfig cfg;
  bool precision_auto = false;   // fp16.enabled or bf16.enabled is "auto": the YAML's mixed_precision decides
  bool precision_given = false;  // fp16.enabled or bf16.enabled is true
};
DeepSpeedJson read_deepspeed_json(const std::string& text, const std::string& source);

}  // namespace accel::config_detail
