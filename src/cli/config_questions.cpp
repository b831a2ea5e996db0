#include "cli/config_questions.h"
#include "accelerator/config_text.h"
#include "base/error.h"
#include "zero/spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <istream>
#include <limits>
#include <ostream>
#include <sstream>
#include <stdexcept>

namespace accel::cli {
namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

class Asker {
 public:
  Asker(std::istream& in, std::ostream& out) : in_(in), out_(out) {}

  // Asks until `accept` returns true for the answer (the default when the answer is empty); `accept`
  // stores the value and returns false with `why` set for a bad one.
  void ask(const std::string& question, const std::string& def,
           const std::function<bool(const std::string&, std::string& why)>& accept) {
    for (;;) {
      out_ << question << " [" << def << "]: " << std::flush;
      std::string line;
      if (!std::getline(in_, line))
        throw accel::RuntimeError(fmt::format(
            "input ended before the questions did (at: {}); `accel config default` writes a config without questions",
            question));
      std::string answer = trim(line);
      if (answer.empty()) answer = def;
      std::string why;
      if (accept(answer, why)) return;
      out_ << "  " << why << "\n";
    }
  }

  std::string choice(const std::string& question, const std::vector<std::string>& options, const std::string& def) {
    std::string value;
    std::string list;
    for (const auto& o : options) list += (list.empty() ? "" : ", ") + o;
    ask(fmt::format("{} ({})", question, list), def, [&](const std::string& a, std::string& why) {
      for (const auto& o : options)
        if (config_detail::lower(o) == config_detail::lower(a)) {
          value = o;
          return true;
        }
      why = "please answer one of: " + list;
      return false;
    });
    return value;
  }

  bool yes_no(const std::string& question, bool def) {
    bool value = def;
    ask(question + " (yes/no)", def ? "yes" : "no", [&](const std::string& a, std::string& why) {
      const std::string l = config_detail::lower(a);
      if (l == "yes" || l == "y") return value = true, true;
      if (l == "no" || l == "n") return value = false, true;
      why = "please answer yes or no";
      return false;
    });
    return value;
  }

  std::int64_t integer(const std::string& question, std::int64_t def, std::int64_t min, std::int64_t max) {
    std::int64_t value = def;
    ask(question, std::to_string(def), [&](const std::string& a, std::string& why) {
      try {
        std::size_t used = 0;
        const double d = std::stod(a, &used);  // 1e8 is a fine way to write a count
        if (used == a.size() && d == static_cast<double>(static_cast<std::int64_t>(d)) && d >= min && d <= max) {
          value = static_cast<std::int64_t>(d);
          return true;
        }
      } catch (const std::exception&) {
      }
      why = fmt::format("please answer a whole number from {} to {}", min, max);
      return false;
    });
    return value;
  }

  double number(const std::string& question, double def, double min) {
    double value = def;
    std::ostringstream d;
    d << def;
    ask(question, d.str(), [&](const std::string& a, std::string& why) {
      try {
        std::size_t used = 0;
        const double v = std::stod(a, &used);
        if (used == a.size() && v >= min) {
          value = v;
          return true;
        }
      } catch (const std::exception&) {
      }
      why = fmt::format("please answer a number >= {:f}", min);
      return false;
    });
    return value;
  }

 private:
  std::istream& in_;
  std::ostream& out_;
};

bool is_deepspeed(const std::string& s) { return s.rfind("zero", 0) == 0; }
bool is_fsdp(const std::string& s) { return s != "ddp" && !is_deepspeed(s); }
// Shard groups of fewer processes than the job's, each holding a copy.
bool has_copies(const ConfigAnswers& a) { return a.shard_group_size > 0 && a.shard_group_size < a.num_processes; }

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names{"ddp",      "zero1",        "zero2",
                                              "zero3",    "full_shard",   "shard_grad_op",
                                              "no_shard", "hybrid_shard", "hybrid_shard_zero2"};
  return names;
}

ConfigAnswers ask_config_questions(std::istream& in, std::ostream& out, int cuda_devices) {
  Asker q(in, out);
  ConfigAnswers a;
  out << "accel config: answer each question, or press Enter for the default in brackets.\n";
  a.num_machines = static_cast<int>(q.integer("How many machines will train?", 1, 1, 1 << 16));
  const int per_machine_default = std::max(cuda_devices, 2);
  for (;;) {
    a.num_processes =
        static_cast<int>(q.integer("How many processes in total, over all machines?",
                                   static_cast<std::int64_t>(per_machine_default) * a.num_machines, 1, 1 << 24));
    if (a.num_processes % a.num_machines == 0) break;
    out << "  " << a.num_processes << " processes do not spread evenly over " << a.num_machines << " machines\n";
  }
  a.use_cpu = q.yes_no("Train on the CPU only?", cuda_devices == 0);
  a.strategy = q.choice("Which strategy?", strategy_names(), "ddp");
  if (a.strategy.rfind("hybrid_shard", 0) == 0 && a.num_machines == 1)
    out << fmt::format(
        "  note: on one machine {} shards like {} (it replicates across machines)\n", config_detail::upper(a.strategy),
        zero::info(a.strategy == "hybrid_shard" ? zero::Strategy::Zero3 : zero::Strategy::Zero2).fsdp_name);
  if ((a.strategy == "full_shard" || a.strategy == "shard_grad_op") && a.num_processes > 1)
    for (;;) {
      a.shard_group_size = static_cast<int>(
          q.integer("Shard over how many processes? Each group of that many holds one whole copy, and the groups "
                    "average their gradients (FSDP2's HSDP); all of them: one copy",
                    a.num_processes, 1, a.num_processes));
      if (a.num_processes % a.shard_group_size == 0) break;
      out << "  " << a.num_processes << " processes do not split into groups of " << a.shard_group_size << "\n";
    }
  if (a.strategy == "shard_grad_op" && has_copies(a))
    out << "  note: copies of shard groups are FSDP2's, where SHARD_GRAD_OP is fsdp_reshard_after_forward: false "
           "(a unit's parameters stay gathered from its forward to its backward, sharded between steps; accel "
           "explains it as FULL_SHARD keeping them through backward)\n";
  if (is_deepspeed(a.strategy)) {
    const auto nvme_path = [&](const char* what) {
      std::string path;
      q.ask(fmt::format("Directory on a fast disk for the {} files (it must exist; accel checks its room)", what),
            "/tmp", [&](const std::string& s, std::string& why) {
              if (trim(s).empty()) return why = "give a directory", false;
              return path = trim(s), true;
            });
      return path;
    };
    a.offload_optimizer = q.choice(
        "Where does the optimizer state live: none (with the rank), cpu (host memory, ZeRO-Offload) or nvme (files "
        "on disk, ZeRO-Infinity)?",
        {"none", "cpu", "nvme"}, "none");
    if (a.offload_optimizer == "nvme") a.offload_optimizer_nvme_path = nvme_path("optimizer state");
    if (a.strategy == "zero3") {
      a.offload_params = q.choice("And the parameters: none, cpu or nvme?", {"none", "cpu", "nvme"}, "none");
      if (a.offload_params == "nvme") a.offload_param_nvme_path = nvme_path("parameter");
    }
    a.gradient_clipping = q.number("Clip gradients to this global norm (0: no clipping)?", 1.0, 0);
  }
  if (is_fsdp(a.strategy)) {
    a.wrap_policy = q.choice("How is the model split into units (each gathered on its own)?",
                             {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"}, "TRANSFORMER_BASED_WRAP");
    if (a.wrap_policy == "TRANSFORMER_BASED_WRAP") {
      std::string types;
      q.ask("Module type names that are units, comma-separated (empty: the modules marked accel::unit)", "",
            [&](const std::string& s, std::string&) { return types = s, true; });
      std::istringstream list(types);
      for (std::string t; std::getline(list, t, ',');)
        if (!trim(t).empty()) a.layer_types.push_back(trim(t));
    } else if (a.wrap_policy == "SIZE_BASED_WRAP") {
      a.min_num_params =
          q.integer("Smallest unit, in parameters?", 100000000, 1, std::numeric_limits<std::int64_t>::max());
    }
    a.activation_checkpointing = q.yes_no(
        "Activation checkpointing: recompute each unit's forward in backward instead of keeping its activations?",
        false);
  }
  a.gradient_accumulation_steps = q.integer("Gradient accumulation steps?", 1, 1, 1 << 20);
  a.mixed_precision = q.choice("Mixed precision?", {"no", "fp16", "bf16", "fp8"}, "no");
  return a;
}

std::string config_yaml(const ConfigAnswers& a) {
  std::ostringstream y;
  y << "# Written by accel config. `accel config explain` on this file says what it will do.\n";
  y << "compute_environment: LOCAL_MACHINE\n";
  if (is_deepspeed(a.strategy)) {
    y << "distributed_type: DEEPSPEED\n";
    y << "deepspeed_config:\n";
    y << "  zero_stage: " << a.strategy.substr(4) << "\n";
    y << "  offload_optimizer_device: " << a.offload_optimizer << "\n";
    if (!a.offload_optimizer_nvme_path.empty())
      y << "  offload_optimizer_nvme_path: " << a.offload_optimizer_nvme_path << "\n";
    y << "  offload_param_device: " << a.offload_params << "\n";
    if (!a.offload_param_nvme_path.empty()) y << "  offload_param_nvme_path: " << a.offload_param_nvme_path << "\n";
    y << "  gradient_accumulation_steps: " << a.gradient_accumulation_steps << "\n";
    if (a.gradient_clipping > 0) y << "  gradient_clipping: " << a.gradient_clipping << "\n";
  } else if (is_fsdp(a.strategy)) {
    // Copies of shard groups are FSDP2's (Accelerate takes a parallelism_config with fsdp_version 2 only),
    // whose reshard_after_forward names the strategy and which has no prefetch keys.
    const bool copies = has_copies(a);
    y << "distributed_type: FSDP\n";
    y << "fsdp_config:\n";
    if (copies) {
      y << "  fsdp_version: 2\n";
      y << "  fsdp_reshard_after_forward: " << (a.strategy == "full_shard" ? "true" : "false") << "\n";
    } else {
      y << "  fsdp_sharding_strategy: " << config_detail::upper(a.strategy) << "\n";
    }
    y << "  fsdp_auto_wrap_policy: " << a.wrap_policy << "\n";
    if (a.wrap_policy == "TRANSFORMER_BASED_WRAP" && !a.layer_types.empty()) {
      y << "  fsdp_transformer_layer_cls_to_wrap: ";
      for (std::size_t i = 0; i < a.layer_types.size(); ++i) y << (i ? "," : "") << a.layer_types[i];
      y << "\n";
    }
    if (a.wrap_policy == "SIZE_BASED_WRAP") y << "  fsdp_min_num_params: " << a.min_num_params << "\n";
    if (!copies) {
      y << "  fsdp_backward_prefetch: BACKWARD_PRE\n";
      y << "  fsdp_forward_prefetch: true\n";
    }
    y << "  fsdp_state_dict_type: SHARDED_STATE_DICT\n";
    y << "  fsdp_activation_checkpointing: " << (a.activation_checkpointing ? "true" : "false") << "\n";
    // FSDP's CPUOffload: parameters, gradients and the optimizer step on the host (accel tune's
    // optimizer+params candidates; optimizer offload alone has no FSDP key).
    if (a.offload_params != "none") y << "  fsdp_offload_params: true\n";
    if (copies)
      y << "parallelism_config:\n"
        << "  parallelism_config_dp_replicate_size: " << a.num_processes / a.shard_group_size << "\n"
        << "  parallelism_config_dp_shard_size: " << a.shard_group_size << "\n";
  } else {
    y << "distributed_type: " << (a.num_processes == 1 ? "NO" : a.use_cpu ? "MULTI_CPU" : "MULTI_GPU") << "\n";
  }
  if (!is_deepspeed(a.strategy)) y << "gradient_accumulation_steps: " << a.gradient_accumulation_steps << "\n";
  y << "mixed_precision: '" << a.mixed_precision << "'\n";
  y << "num_machines: " << a.num_machines << "\n";
  y << "num_processes: " << a.num_processes << "\n";
  y << "machine_rank: 0\n";
  y << "use_cpu: " << (a.use_cpu ? "true" : "false") << "\n";
  return y.str();
}

ConfigAnswers default_answers(int cuda_devices, const std::string& mixed_precision) {
  ConfigAnswers a;
  a.use_cpu = cuda_devices == 0;
  a.num_processes = cuda_devices > 1 ? cuda_devices : 1;
  a.strategy = "ddp";
  a.mixed_precision = mixed_precision;
  return a;
}

}  // namespace accel::cli
