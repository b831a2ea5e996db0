// Where the `accel` command keeps things.
#pragma once

#include "base/env.h"

#include <cstdlib>
#include <string>

namespace accel::cli {

// The config `accel config` writes and `accel launch` / `accel test` read when no --config_file is
// given: $ACCEL_HOME/default_config.yaml, else ~/.cache/accel/default_config.yaml.
inline std::string default_config_path() {
  if (const std::string h = env::get("ACCEL_HOME"); !h.empty()) return h + "/default_config.yaml";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/accel/default_config.yaml";
}

}  // namespace accel::cli
