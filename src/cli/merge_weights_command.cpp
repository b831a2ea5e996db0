// `accel merge-weights CHECKPOINT_DIR OUTPUT_DIR`: a save_state checkpoint (sharded at any world size
// under any strategy, or full) to the model's full weights as Hugging Face safetensors, in one process
// with no model and no ranks (checkpoint/merge_weights.h). Accelerate's `accelerate merge-weights`,
// DeepSpeed's zero_to_fp32.py.
#include "cli/commands.h"

#include "base/files.h"
#include "checkpoint/merge_weights.h"
#include "dispatch/device_map.h"

#include <fmt/core.h>

#include <map>
#include <memory>
#include <string>

namespace accel::cli {
namespace {

struct MergeArgs {
  std::string checkpoint, out, dtype = "saved", max_shard_size = "10GB";
  bool remove_checkpoint_dir = false;
};

int run_merge(const MergeArgs& a) {
  checkpoint::MergeOptions o;
  static const std::map<std::string, std::optional<c10::ScalarType>> kDtypes = {
      {"saved", std::nullopt}, {"fp32", c10::kFloat}, {"bf16", c10::kBFloat16}, {"fp16", c10::kHalf}};
  o.dtype = kDtypes.at(a.dtype);
  o.max_shard_size = parse_size(a.max_shard_size);  // (checked by the option's validator)
  o.progress = true;
  if (a.remove_checkpoint_dir && files::is_link(a.checkpoint)) {
    fmt::print(stderr,
               "accel merge-weights: --remove_checkpoint_dir: {} is a symbolic link; name the directory itself, "
               "or remove it yourself\n",
               a.checkpoint);
    return 1;
  }
  const checkpoint::MergeResult r = checkpoint::merge_weights(a.checkpoint, a.out, o);
  const double mb = static_cast<double>(r.total_bytes) / 1e6;
  const std::string size = mb >= 1000 ? fmt::format("{:.2f} GB", mb / 1000) : fmt::format("{:.1f} MB", mb);
  fmt::print("accel merge-weights: {} tensors, {}, from {} (saved by {} at {} rank(s), step {}) -> {}/{}{}\n",
             r.tensors, size, a.checkpoint, r.strategy, r.world_size, r.step, a.out, r.files.front(),
             r.files.size() > 1 ? fmt::format(" ... {} files + model.safetensors.index.json", r.files.size()) : "");
  if (a.remove_checkpoint_dir) {
    files::remove_tree(a.checkpoint);
    if (files::exists(a.checkpoint)) {
      fmt::print(stderr, "accel merge-weights: could not remove all of {} (the weights are written)\n", a.checkpoint);
      return 1;
    }
    fmt::print("accel merge-weights: removed {}\n", a.checkpoint);
  }
  return 0;
}

}  // namespace

void add_merge_weights_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<MergeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "merge-weights",
      "Merge a save_state checkpoint (sharded by any strategy at any world size, or full) into the model's full "
      "weights as Hugging Face safetensors (model.safetensors, or shards + index), offline in one process");
  cmd->add_option("checkpoint_dir", args->checkpoint,
                  "the checkpoint: a directory save_state wrote (holding index.json and shard_<r>.bin)")
      ->required();
  cmd->add_option("output_dir", args->out,
                  "where the weights go (created if missing; earlier weights there are replaced)")
      ->required();
  cmd->add_option(
         "--dtype", args->dtype,
         "saved (default: as the checkpoint holds them, the fp32 masters under mixed precision), fp32, bf16 or "
         "fp16 (floating-point parameters converted; buffers keep their dtype)")
      ->check(CLI::IsMember({"saved", "fp32", "bf16", "fp16"}));
  cmd->add_option("--max_shard_size,--max-shard-size", args->max_shard_size,
                  "start a new file past this size: 10GB (default, 10^9 bytes a GB), 500MB, 2GiB, or bytes")
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            try {
              return parse_size(text) > 0 ? "" : "the size must be positive, not '" + text + "'";
            } catch (const std::exception& e) {
              return e.what();
            }
          },
          "SIZE"));
  cmd->add_flag("--remove_checkpoint_dir,--remove-checkpoint-dir", args->remove_checkpoint_dir,
                "remove the checkpoint directory once the weights are written");
  cmd->callback([args, &exit_code] { exit_code = run_merge(*args); });
}

}  // namespace accel::cli
