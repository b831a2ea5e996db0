// `accel config explain`: what a config will do, in words, for a given number of ranks and machines:
// the strategy and which state each rank holds (and over which ranks it is sharded), units, precision,
// accumulation and batch sizes, offload, clipping, and every ignored key with the reason.
#pragma once

#include "accelerator/config.h"

#include <optional>
#include <string>

namespace accel::cli {

// num_processes / num_machines: the launch's counts when they differ from the file's (flags).
std::string explain_config(const AcceleratorConfig& cfg, std::optional<int> num_processes = std::nullopt,
                           std::optional<int> num_machines = std::nullopt);

}  // namespace accel::cli
