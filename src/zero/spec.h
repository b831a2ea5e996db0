// accel::zero::ShardingSpec — every strategy as one point in one space (docs/design.md, "The strategy table").
//
//   strategy            | optimizer state | gradients            | parameters at rest | freed after forward
//   DDP / NO_SHARD      | replicated      | all-reduced          | replicated         | -
//   ZeRO-1              | sharded         | reduce-scattered into the own slice of a full buffer | replicated | -
//   ZeRO-2/SHARD_GRAD_OP| sharded         | sharded (reduce-scatter) | replicated, all-gathered after step | -
//   ZeRO-3 / FULL_SHARD | sharded         | sharded              | sharded, gathered per unit | yes
//   (reshard_after_forward) HYBRID_SHARD        | FULL_SHARD inside a node, gradients all-reduced across nodes
//   (shard_group_size: ZeRO-2/3 inside groups of n ranks, or of a node, replicated across the groups)
//
// ZeRO-1 reduce-scatters rather than all-reduces: it only needs its own slice of the reduced
// gradient, and that is what keeps its traffic at DDP's 2Ψ (ZeRO paper, Table 1).
// Dtypes: parameters are computed (and gathered) in param_dtype, gradients reduced in reduce_dtype,
// the optimizer steps master_dtype shards. Unset dtypes follow the model's parameters. The backward
// passes of an accumulation window add up in window_dtype() where it is wider than the gradients
// (accumulate_dtype; unset, reduce_dtype as FSDP2, so fp32 under bf16/fp16 compute with fp32
// reductions, except under bf16 masters).
#pragma once

#include "offload/async_file.h"
#include "sharding/wrap_policy.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace accel::zero {

enum class Strategy { NoShard, Zero1, Zero2, Zero3, HybridShard };

// The one table of strategies: a row per point of the space, holding what it shards and every name
// it goes by. Config parsers, `accel config explain`, `accel estimate-memory` and checkpoints read
// names and labels from here; nothing else spells them.
struct StrategyInfo {
  Strategy strategy;
  const char* name;         // accel's own, in checkpoints and logs: "ZERO_3"
  const char* short_label;  // for people: "ZeRO-3"
  const char* label;        // the ZeRO stage with the FSDP strategy that stores the same: "ZeRO-3 (FULL_SHARD)"
  const char* fsdp_name;    // Accelerate/FSDP fsdp_sharding_strategy, nullptr where FSDP has none (ZeRO-1)
  const char* fsdp_label;   // "FULL_SHARD (like ZeRO-3)"
  int fsdp_number;          // Accelerate's number for fsdp_name (1 FULL_SHARD .. 4 HYBRID_SHARD), 0 if none
  int zero_stage;           // DeepSpeed zero_optimization.stage that stores the same
  bool shards_optimizer, shards_gradients, shards_parameters, hybrid;
};
// Every row, in table order (NoShard, Zero1, Zero2, Zero3, HybridShard).
const std::vector<StrategyInfo>& strategies();
const StrategyInfo& info(Strategy s);
// The row FSDP calls `fsdp_name` (exact, upper case) / Accelerate numbers `fsdp_number`, or nullptr.
const StrategyInfo* find_fsdp(const std::string& fsdp_name);
const StrategyInfo* find_fsdp(int fsdp_number);
// FSDP's names in Accelerate's order ("FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD" with ", ").
std::string fsdp_names(const char* sep = ", ");
// FSDP's fifth strategy (Accelerate's number 5): SHARD_GRAD_OP inside each node, replicated across
// nodes. Not a row: ShardingSpec::fsdp makes it ZeRO-2 with the node as the shard group.
inline constexpr const char* kHybridShardZero2 = "HYBRID_SHARD_ZERO2";
inline constexpr int kHybridShardZero2Number = 5;
const char* to_string(Strategy s);  // info(s).name

using sharding::WrapPolicy;

// Where optimizer state and parameter shards live (DeepSpeed's offload_optimizer / offload_param,
// FSDP's CPUOffload). Nvme: in files under the path, streamed through a few buffers (zero/
// optimizer_offload.h, zero/param_offload.h). Cpu: in host memory, which on a CPU run is where they
// already are (a no-op the Accelerator reports).
enum class OffloadDevice { None, Cpu, Nvme };
const char* to_string(OffloadDevice d);  // "none", "cpu", "nvme"
struct OffloadSpec {
  OffloadDevice optimizer = OffloadDevice::None;
  OffloadDevice param = OffloadDevice::None;  // ZeRO-3 / FULL_SHARD / HYBRID_SHARD only
  std::string optimizer_nvme_path, param_nvme_path;
  int optimizer_buffer_count = 4;               // offload_optimizer.buffer_count
  int param_buffer_count = 5;                   // offload_param.buffer_count
  std::int64_t sub_group_size = 1'000'000'000;  // elements stepped per sub-group (zero_optimization.sub_group_size)
  offload::AioOptions aio;
  bool optimizer_on_disk() const { return optimizer == OffloadDevice::Nvme; }
  bool param_on_disk() const { return param == OffloadDevice::Nvme; }
  // Parameter shards leave the device's memory (to disk, or to pinned host memory for a model on a GPU).
  bool param_offloaded() const { return param != OffloadDevice::None; }
};

struct ShardingSpec {
  Strategy strategy = Strategy::NoShard;
  // FULL_SHARD/ZeRO-3: free the gathered parameters after each unit's forward (gather again in
  // backward). false: keep them from pre-forward until the unit's gradients are reduced.
  bool reshard_after_forward = true;
  bool forward_prefetch = true;
  bool backward_prefetch = true;
  // Gradient buckets: reductions of consecutive flat parameters are fused up to this many bytes;
  // 0 = one collective per flat parameter.
  std::int64_t bucket_bytes = 25 << 20;
  // Full-gradient buckets alive at once during backward, counting the one being filled: launching a
  // reduction waits for the oldest while more would be in flight (FSDP2: one reduce-scatter in flight
  // plus one being filled). Bounds the gradient peak to Psi/N + this many buckets or units. >= 1.
  int grad_buckets_in_flight = 2;
  // Every unit recomputes its forward during backward instead of keeping its activations (as if each
  // were marked accel::unit(m, {.checkpoint = true})). Accelerate fsdp_activation_checkpointing,
  // DeepSpeed activation_checkpointing.
  bool activation_checkpointing = false;
  // Each tensor starts at a multiple of this many elements inside its flat buffer.
  std::int64_t align_elements = 1;
  WrapPolicy wrap;
  std::optional<c10::ScalarType> param_dtype, reduce_dtype, master_dtype;
  std::optional<c10::ScalarType> accumulate_dtype;  // DeepSpeed data_types.grad_accum_dtype
  // The dtype a window of micro-steps adds up in, for gradients reduced in `reduce`: accumulate_dtype;
  // else bf16 under bf16 compute over bf16 masters (DeepSpeed's bf16_master_weights_and_grads keeps
  // its gradients in bf16, and the masters step on bf16 gradients whatever the window held); else
  // the reduction's.
  c10::ScalarType window_dtype(c10::ScalarType reduce) const;
  // ZeRO-3 / FULL_SHARD: sharded units travel as e4m3 bytes (1 per element) with one scale per
  // parameter, agreed across the shard group after each step (one all-reduce of amaxes for all
  // units), and are dequantized into param_dtype on arrival. Half the gather bytes of bf16.
  bool fp8_all_gather = false;
  // The optimizer steps each flat's fp32 master as soon as its reduced gradient is final, on a worker
  // thread while backward goes on (a device's masters in host memory: once that gradient has reached
  // the host), instead of all of them in optimizer.step(): the host's step overlaps the device's
  // backward. The same arithmetic and bits as the step in step(). It takes a step after every sync
  // backward with nothing changing the gradients in between (no clipping, no fp16 loss scaling),
  // sharded optimizer state, and Adam, AdamW or SGD; masters that are the parameters themselves, or on
  // disk, step in step() as before. (ACCEL_STEP_IN_BACKWARD=1 through the Accelerator.)
  bool step_in_backward = false;
  OffloadSpec offload;
  // Which ranks hold one sharded copy of the model (FSDP's HSDP device mesh, replicate x shard;
  // DeepSpeed's MiCS): kStrategyGroup, every rank (HYBRID_SHARD: the ranks of a node); kNodeGroup, the
  // ranks of a node (FSDP's HYBRID_SHARD_ZERO2 is ZeRO-2 so); n > 0, blocks of n consecutive ranks (n
  // divides the world size). Each group holds a whole sharded copy, and the groups average their
  // reduced gradient shards (an all-reduce across the ranks at the same place in every group). For
  // the strategies that shard gradients (ZeRO-2, ZeRO-3, HYBRID_SHARD).
  static constexpr int kStrategyGroup = 0, kNodeGroup = -1;
  int shard_group_size = kStrategyGroup;
  // Where the model trains, when it is handed over somewhere else: the engine flattens and shards it
  // where it is (the host) and moves each flat's buffers there, its shard with its values (or empty,
  // once an offloaded shard has left). For parameters sharded over ranks of a device (ZeRO-3,
  // FULL_SHARD, HYBRID_SHARD) or offloaded from it (ZeRO-Infinity): the model is never on the device
  // whole (zero::place_model). Unset: where the parameters are.
  std::optional<c10::Device> device;

  // The switches a strategy is made of (its row of the table).
  bool shards_optimizer() const { return info(strategy).shards_optimizer; }
  bool shards_gradients() const { return info(strategy).shards_gradients; }
  bool shards_parameters() const { return info(strategy).shards_parameters; }
  bool hybrid() const { return info(strategy).hybrid; }
  // Shard groups are a node's ranks (HYBRID_SHARD's own, or kNodeGroup), or blocks of n ranks (0: neither).
  bool groups_by_node() const {
    return shard_group_size == kNodeGroup || (shard_group_size == kStrategyGroup && hybrid());
  }
  int groups_of_ranks() const { return shard_group_size > 0 ? shard_group_size : 0; }

  // Named points: DeepSpeed stages and FSDP sharding strategies.
  static ShardingSpec ddp();
  static ShardingSpec zero(int stage);  // 0..3; throws std::invalid_argument otherwise
  // A row's fsdp_name (Accelerate/FSDP sharding_strategy), or kHybridShardZero2; throws otherwise,
  // listing them.
  static ShardingSpec fsdp(const std::string& sharding_strategy);

  // Throws std::invalid_argument naming the field for a bad value.
  void validate() const;
  std::string to_string() const;
};

}  // namespace accel::zero
