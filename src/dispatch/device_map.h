// accel::infer_auto_device_map — where each part of a model goes for inference, from parameter sizes
// alone (Accelerate's utils/modeling.py infer_auto_device_map, for accel's units).
//
// The places, in order: the CUDA devices named in max_memory ("cuda:0", "cuda:1", ...), then "cpu",
// then "disk" (unbounded). A model is cut into:
//   - groups: the outermost accel units, and the outermost modules whose class is in no_split and that
//     consist of units only (all their parameters are in units inside them). A group is placed whole;
//     it runs through its units' hooks, so it can live on another device than the rest or on disk
//     (paged in around each forward: dispatch.h);
//   - the rest (parameters and buffers outside every group): the model's own code, which runs with no
//     hook, so all of it lives on one device, the main device: the first place where it fits.
// The groups then fill the places in model order (Accelerate's "sequential"). When a group spills to
// disk, the cpu keeps room for the largest group (a disk group is paged into cpu memory while it
// runs), so the weights in memory stay within max_memory["cpu"] at any time. "balanced" (and "auto",
// as in Accelerate) first caps each of several GPUs but the last at an even share of the model plus
// the largest group, so the layers spread over all of them instead of filling the first.
//
// The result names modules (and parameters) with the device they go to, the smallest cover: a module
// whose parts all go to one place is one entry ("" for the whole model), as Accelerate's clean_result.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace accel {

// module or tensor name -> "cuda:N" | "cpu" | "disk". Keys as in named_modules() ("" = the model).
using DeviceMap = std::map<std::string, std::string>;
// place -> bytes it may hold ("cpu", "cuda:0"; "disk" is unbounded and needs no entry).
using MaxMemory = std::map<std::string, std::int64_t>;

// "2GB" (10^9), "1.5GiB" (2^30), "300MB", "64KiB", "1000" (bytes). Throws std::invalid_argument.
std::int64_t parse_size(const std::string& text);
// "cpu=2GB,cuda:0=10GiB" -> {"cpu": 2e9, "cuda:0": 10 GiB}. Throws std::invalid_argument.
MaxMemory parse_max_memory(const std::string& text);
// A place's canonical spelling: "cpu", "disk", "cuda:N" ("cuda" and "N" mean cuda:0 and cuda:N).
// Throws std::invalid_argument naming the text for anything else.
std::string canonical_place(const std::string& text);

// How the model is cut for placement (see the top of this file).
struct PlacementGroup {
  std::string name;  // module name
  torch::nn::Module* module = nullptr;
  std::int64_t bytes = 0;  // parameters and buffers, each tensor once
};
struct ModelPlan {
  std::vector<PlacementGroup> groups;  // in model order
  std::int64_t rest_bytes = 0;         // outside every group (the main device's share)
  std::int64_t total_bytes = 0;
  std::int64_t largest_group_bytes = 0;
};
// dtype: the floating-point dtype the weights will have (default: the parameters' own).
ModelPlan plan_model(torch::nn::Module& model, const std::vector<std::string>& no_split = {},
                     std::optional<c10::ScalarType> dtype = std::nullopt);

// strategy: "auto" | "balanced" | "sequential". max_memory: the places to use (empty: the cpu with
// the memory the system reports available). Throws std::invalid_argument for an unknown strategy or
// place, or when the model's own code (outside every group) fits on no memory place.
DeviceMap infer_auto_device_map(torch::nn::Module& model, const MaxMemory& max_memory = {},
                                const std::vector<std::string>& no_split = {}, const std::string& strategy = "auto",
                                std::optional<c10::ScalarType> dtype = std::nullopt);

// "{model.embed_tokens: cpu, model.layers.0: cpu, ...}" in model order, for messages and logs.
std::string to_string(const DeviceMap& map, torch::nn::Module* model = nullptr);

}  // namespace accel
