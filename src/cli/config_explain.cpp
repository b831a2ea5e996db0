#include "cli/config_explain.h"

#include "accelerator/precision.h"
#include "base/env.h"

#include <fmt/core.h>

#include <sstream>
#include <vector>

namespace accel::cli {
namespace {

std::string rank_range(int first, int count) {
  return count == 1 ? fmt::format("{{{}}}", first) : fmt::format("{{{}..{}}}", first, first + count - 1);
}

// "{0..1}, {2..3}" for groups of `size` consecutive ranks; "{0,2}, {1,3}" for strided ones.
std::string groups(int world, int size, bool strided) {
  std::vector<std::string> out;
  if (!strided) {
    for (int g = 0; g * size < world; ++g) out.push_back(rank_range(g * size, size));
  } else {
    const int n = world / size;  // groups of `size` ranks, `n` apart
    for (int first = 0; first < n; ++first) {
      std::string s = "{";
      for (int k = 0; k < size; ++k) s += fmt::format("{}{}", k ? "," : "", first + k * n);
      out.push_back(s + "}");
    }
  }
  std::string joined;
  const std::size_t shown = std::min<std::size_t>(out.size(), 4);
  for (std::size_t i = 0; i < shown; ++i) joined += (i ? ", " : "") + out[i];
  if (out.size() > shown) joined += fmt::format(", ... ({} groups)", out.size());
  return joined;
}

const char* dtype_name(const std::optional<c10::ScalarType>& t, const char* unset) {
  return t ? dtype_label(*t) : unset;
}

std::string explained_strategy(const AcceleratorConfig& c) {
  const zero::StrategyInfo& row = zero::info(c.spec.strategy);
  // Shard groups other than the strategy's own: blocks of n ranks (MiCS, parallelism_config), or a
  // node's ranks under ZeRO-2 (HYBRID_SHARD_ZERO2).
  const int g = c.spec.groups_of_ranks();
  const std::string source = shard_group_source(c);
  const std::string blocks =
      g > 0 ? fmt::format(", each copy sharded over {} consecutive rank{} ({})", g, g == 1 ? "" : "s",
                          source.empty() ? "ShardingSpec::shard_group_size" : source)
            : "";
  switch (c.distributed_type) {
    case DistributedType::No: return fmt::format("NO (one process; several ranks make it {})", row.short_label);
    case DistributedType::MultiCpu:
    case DistributedType::MultiGpu: return fmt::format("{} ({})", row.short_label, to_string(c.distributed_type));
    case DistributedType::DeepSpeed:
      return fmt::format("DeepSpeed ZeRO stage {}{}", row.zero_stage, g > 0 ? " with MiCS" + blocks : "");
    case DistributedType::Fsdp:
      if (c.spec.groups_by_node() && !c.spec.hybrid())
        return fmt::format("FSDP {} ({} inside each machine, replicated across machines); FSDP version {}",
                           zero::kHybridShardZero2, row.fsdp_name, c.fsdp_version);
      // (HYBRID_SHARD's label says machines: in blocks, its name alone)
      return fmt::format("FSDP {}{}; FSDP version {}", g > 0 && c.spec.hybrid() ? row.fsdp_name : row.fsdp_label,
                         blocks, c.fsdp_version);
  }
  return "?";
}

std::string units(const zero::WrapPolicy& w) {
  switch (w.kind) {
    case zero::WrapPolicy::Kind::Marked: return "every module the model marks with accel::unit";
    case zero::WrapPolicy::Kind::TypeName: {
      std::string t;
      for (const auto& n : w.type_names) t += (t.empty() ? "" : ", ") + n;
      return "marked modules of type " + t;
    }
    case zero::WrapPolicy::Kind::Size:
      return fmt::format("marked modules holding at least {} parameters of their own", w.min_num_params);
    case zero::WrapPolicy::Kind::None: return "the whole model as one unit";
  }
  return "?";
}

}  // namespace

std::string explain_config(const AcceleratorConfig& given, std::optional<int> num_processes,
                           std::optional<int> num_machines) {
  AcceleratorConfig cfg = given;
  apply_precision_policy(cfg);  // the dtypes mixed_precision gives, as the Accelerator will use them
  // (a parallelism_config's copies x shards is the only count it runs at)
  const int n = num_processes.value_or(cfg.num_processes.value_or(cfg.parallelism ? cfg.parallelism->processes() : 1));
  const int m = num_machines.value_or(cfg.num_machines.value_or(1));
  const zero::ShardingSpec& s = cfg.spec;
  std::ostringstream o;
  auto row = [&](const std::string& k, const std::string& v) { o << fmt::format("{:<14}{}\n", k, v); };

  row("Config", cfg.source.empty() ? "(defaults)" : cfg.source);
  row("Strategy", explained_strategy(cfg));
  if (n % m != 0) {
    row("Ranks",
        fmt::format("{} processes on {} machines: they do not spread evenly (accel launch refuses this)", n, m));
  } else {
    row("Ranks", m == 1 ? fmt::format("{} process{} on 1 machine", n, n == 1 ? "" : "es")
                        : fmt::format("{} processes on {} machines, {} per machine", n, m, n / m));
  }

  // Which ranks a shard is split over: every rank, the ranks of one machine (HYBRID_SHARD), or blocks
  // of g consecutive ranks (MiCS, parallelism_config).
  const int per_machine = m > 0 && n % m == 0 ? n / m : n;
  const int g = s.groups_of_ranks();
  const bool refused = cfg.parallelism && cfg.parallelism->processes() != n;  // (said under Shard groups)
  const bool blocks = g > 0 && n % g == 0;
  const int shard_over = blocks ? g : s.groups_by_node() ? per_machine : n;
  const std::string fraction =
      shard_over == 1 ? std::string("all of it (one rank in the group)") : fmt::format("1/{} of it", shard_over);
  const std::string over = blocks               ? fmt::format("sharded over a block of {} consecutive ranks", g)
                           : s.groups_by_node() ? fmt::format("sharded over the {} ranks of its machine", shard_over)
                                                : fmt::format("sharded over all {} ranks", shard_over);
  std::string across;  // how the copies' gradients meet (none at a count the job refuses)
  if (!refused && blocks && n / g > 1)
    across = fmt::format(" inside the block, then all-reduce across the {} copies", n / g);
  else if (!refused && s.groups_by_node() && m > 1)
    across = fmt::format(" inside the machine, then all-reduce across the {} machines", m);
  o << "Each rank holds\n";
  const std::string master = dtype_name(s.master_dtype, "the model's dtype");
  if (s.shards_optimizer()) {
    row("  optimizer", fmt::format("{} ({}), master weights in {}", fraction, over, master));
  } else {
    row("  optimizer", fmt::format("all of it (replicated on every rank), master weights in {}", master));
  }
  if (s.shards_gradients()) {
    row("  gradients", fmt::format("{}: reduce-scatter{}", fraction, across));
  } else if (s.shards_optimizer()) {
    row("  gradients", "a full buffer; reduce-scatter fills its own slice, which the optimizer steps");
  } else {
    row("  gradients", "all of them, all-reduced (averaged) over the ranks");
  }
  if (s.shards_parameters()) {
    row("  parameters",
        fmt::format("{} at rest; one unit at a time is all-gathered in full for forward and backward, {}", fraction,
                    s.reshard_after_forward ? "freed after the unit's forward"
                                            : "kept from forward until its gradients are reduced"));
  } else {
    row("  parameters", s.shards_optimizer() ? "all of them; all-gathered again after each optimizer step"
                                             : "all of them (replicated)");
  }
  // On CPUs a shard group on one machine shares memory instead (the engine's default; base/env.cpp).
  if (shard_over > 1 && s.shards_gradients() && cfg.offload_param_device != "nvme") {
    const bool params = s.shards_parameters() && env::get_int("ACCEL_NODE_SHARED_PARAMS") != 0;
    const bool grads = env::get_int("ACCEL_NODE_SHARED_GRADS") != 0;
    if (params || grads)
      row("Node-shared",
          fmt::format("on CPUs (no GPU, or use_cpu), the {} ranks of a shard group on one machine keep {} in "
                      "memory they all map: {}each rank is counted its share, the node holds them once (each rank's "
                      "RSS shows all of it). {} turn{} that off: the path a GPU or several machines take",
                      shard_over,
                      params && grads ? "the sharded parameters and the gradients they reduce-scatter"
                      : params        ? "the sharded parameters"
                                      : "the gradients they reduce-scatter",
                      params ? "nothing is all-gathered, " : "",
                      params && grads ? "ACCEL_NODE_SHARED_PARAMS=0 ACCEL_NODE_SHARED_GRADS=0"
                      : params        ? "ACCEL_NODE_SHARED_PARAMS=0"
                                      : "ACCEL_NODE_SHARED_GRADS=0",
                      params && grads ? "" : "s"));
  }
  if (s.shards_parameters() || cfg.distributed_type == DistributedType::Fsdp) row("Units", units(s.wrap));
  if (s.shards_parameters())
    row("Not in a unit",
        "only units are gathered one at a time; parameters in no unit form the root unit, kept whole on every rank "
        "from step to step: a model that marks no module with accel::unit stays whole on every rank (DDP's "
        "parameter memory), and prepare warns when that is at least half of the model");
  if (refused) {
    row("Shard groups",
        fmt::format("{} is {} processes, not {}: accel refuses this (launch {})", shard_group_source(cfg),
                    cfg.parallelism->processes(), n, cfg.parallelism->processes()));
  } else if (g > 0) {
    if (!blocks)
      row("Shard groups", fmt::format("blocks of {} consecutive ranks, which do not divide the {} process{}: accel "
                                      "refuses this (launch a multiple of {})",
                                      g, n, n == 1 ? "" : "es", g));
    else if (n / g > 1) {
      row("Shard groups", groups(n, g, false));
      row("Replicas", groups(n, n / g, true) + " (all-reduce across the copies)");
    } else {
      row("Shard group", rank_range(0, n) + " (one copy: the block is every rank)");
    }
  } else if (s.groups_by_node()) {
    if (m > 1 && n % m == 0) {
      row("Shard groups", groups(n, per_machine, false));
      row("Replicas", groups(n, m, true) + " (all-reduce across machines)");
    } else {
      row("Shard groups", s.hybrid()
                              ? fmt::format("one machine: {} shards like {} over all ranks",
                                            zero::info(zero::Strategy::HybridShard).fsdp_name,
                                            zero::info(zero::Strategy::Zero3).fsdp_name)
                              : fmt::format("one machine: {} shards like {} over all ranks", zero::kHybridShardZero2,
                                            zero::info(zero::Strategy::Zero2).fsdp_name));
    }
  } else if (s.shards_optimizer() && n > 1) {
    row("Shard group", rank_range(0, n));
  }
  if (s.shards_parameters() || s.shards_gradients())
    row("Prefetch",
        fmt::format("forward {}, backward {}", s.forward_prefetch ? "on" : "off", s.backward_prefetch ? "on" : "off"));
  row("Buckets", s.bucket_bytes == 0
                     ? std::string("one collective per flat parameter")
                     : fmt::format("gradient reductions fused up to {} MiB", s.bucket_bytes / double(1 << 20)));

  switch (cfg.mixed_precision) {
    case MixedPrecision::No: row("Precision", "fp32 compute, no mixed precision"); break;
    case MixedPrecision::Bf16: row("Precision", "bf16 compute, fp32 master weights"); break;
    case MixedPrecision::Fp16:
      row("Precision",
          cfg.loss_scaler.loss_scale > 0
              ? fmt::format("fp16 compute, fp32 master weights, static loss scale {}", cfg.loss_scaler.loss_scale)
              : fmt::format("fp16 compute, fp32 master weights, dynamic loss scale from 2^{} (window {}, "
                            "hysteresis {}, minimum {})",
                            cfg.loss_scaler.initial_scale_power, cfg.loss_scaler.loss_scale_window,
                            cfg.loss_scaler.hysteresis, cfg.loss_scaler.min_loss_scale));
      break;
    case MixedPrecision::Fp8:
      row("Precision", fmt::format("fp8: Float8Linear layers compute in e4m3 (weights, activations) and e5m2 "
                                   "(gradients) with dynamic tensorwise scales, the rest in bf16; fp32 master "
                                   "weights; sharded units all-gathered as fp8 {}",
                                   s.fp8_all_gather ? std::string("(on)")
                                                    : fmt::format("(off: enable_fsdp_float8_all_gather, {})",
                                                                  zero::info(zero::Strategy::Zero3).label)));
      break;
  }
  if (s.param_dtype || s.reduce_dtype || s.master_dtype || s.accumulate_dtype)
    row("Dtypes",
        fmt::format("parameters {}, gradient reduction {}, accumulation {}, master {}",
                    dtype_name(s.param_dtype, "as the model"), dtype_name(s.reduce_dtype, "as the parameters"),
                    s.accumulate_dtype                              ? dtype_label(*s.accumulate_dtype)
                    : s.window_dtype(c10::kFloat) == c10::kBFloat16 ? "bf16 (as the bf16 masters' gradients)"
                                                                    : "as the reduction",
                    dtype_name(s.master_dtype, "as the model")));

  const std::int64_t acc = cfg.gradient_accumulation_steps;
  row("Accumulation", fmt::format("{} micro-step{} per optimizer step", acc, acc == 1 ? "" : "s"));
  if (cfg.distributed_type == DistributedType::DeepSpeed &&
      (cfg.batch.train_batch_size || cfg.batch.micro_batch_per_gpu)) {
    try {
      const BatchConfig b = resolve_batch(cfg.batch, n, std::nullopt, acc, cfg.source);
      row("Batch", fmt::format("{} per optimizer step = {} per rank x {} micro-steps x {} ranks", *b.train_batch_size,
                               *b.micro_batch_per_gpu, *b.gradient_accumulation_steps, n));
    } catch (const ConfigError& e) {
      row("Batch", std::string("does not work out at this world size: ") + e.what());
    }
  } else {
    row("Batch",
        fmt::format(
            "each rank's micro batch comes from its data loader; per optimizer step: micro batch x {} x {} rank{}", acc,
            n, n == 1 ? "" : "s"));
  }
  if (cfg.gradient_clipping) row("Clipping", fmt::format("every step, to global norm {}", *cfg.gradient_clipping));
  // The optimizer and scheduler blocks: what create_optimizer / create_scheduler build from them.
  for (const auto* b : {cfg.optimizer ? &*cfg.optimizer : nullptr, cfg.scheduler ? &*cfg.scheduler : nullptr}) {
    if (!b) continue;
    std::string params;
    for (const auto& [k, v] : b->params)
      params += fmt::format("{}{} {}", params.empty() ? "" : ", ", k,
                            v.kind != optim::ConfigValue::Kind::Auto ? v.text
                            : v.text == "null"                       ? std::string("null (the optimizer's lr)")
                                                                     : std::string("auto (the program's)"));
    row(b->name == "optimizer" ? "Optimizer" : "Schedule",
        fmt::format("{}{}, built by Accelerator::create_{} (a program passing its own to {} keeps it)", b->type,
                    params.empty() ? "" : " (" + params + ")", b->name == "optimizer" ? "optimizer" : "scheduler",
                    b->name == "optimizer" ? "prepare" : "prepare_scheduler"));
  }
  row("Activations", s.activation_checkpointing
                         ? "checkpointed per unit: each unit keeps only its inputs and recomputes its forward in "
                           "backward (one more forward of compute; same results, dropout included)"
                         : "kept from forward to backward (no activation checkpointing; accel::unit(m, "
                           "{.checkpoint = true}) still checkpoints single units)");
  row("Checkpoints", cfg.state_dict_type == StateDictType::Full
                         ? "save_state writes full checkpoints (rank 0 writes every tensor whole)"
                     : !across.empty() ? "save_state writes sharded checkpoints (each rank of the first "
                                         "copy its own slices)"
                                       : "save_state writes sharded checkpoints (each rank its own slices)");
  if (cfg.offload_optimizer_device != "none" || cfg.offload_param_device != "none") {
    const auto& off = s.offload;
    const std::string share =
        shard_over > 1 && s.shards_optimizer() ? fmt::format(" of its 1/{} shard", shard_over) : "";
    auto where_to = [&](const std::string& dev, const std::string& path) {
      if (dev == "nvme") return fmt::format("in a file per rank under {}", path);
      return std::string(
          "in host memory (training on a GPU: pinned, stepped on the CPU; on a CPU run that is where it already is: "
          "no change)");
    };
    if (cfg.offload_optimizer_device != "none")
      row("Offload",
          fmt::format("optimizer: fp32 master weights and optimizer state{} {}: per parameter 4 bytes of master + "
                      "8 of Adam/AdamW moments (SGD with momentum: 4), stepped {} elements at a time through {} "
                      "buffers with accel's fused CPU step",
                      share, where_to(cfg.offload_optimizer_device, off.optimizer_nvme_path), off.sub_group_size,
                      off.optimizer_buffer_count));
    if (cfg.offload_param_device != "none")
      row(cfg.offload_optimizer_device != "none" ? "" : "Offload",
          fmt::format("parameters: each unit's shard (parameter dtype: 4 bytes per parameter in fp32, 2 in bf16/fp16) "
                      "{}, read ahead of its all-gather and dropped after; gradients stay in memory",
                      where_to(cfg.offload_param_device, off.param_nvme_path)));
  }
  row("Device", cfg.use_cpu ? "CPU (use_cpu)" : "a GPU per rank where there are GPUs, else the CPU");
  if (cfg.ignored.empty()) {
    row("Ignored keys", "none");
  } else {
    o << fmt::format("Ignored keys ({}), accepted so files from Accelerate/DeepSpeed load unchanged:\n",
                     cfg.ignored.size());
    for (const auto& i : cfg.ignored) o << "  " << i << "\n";
  }
  return o.str();
}

}  // namespace accel::cli
