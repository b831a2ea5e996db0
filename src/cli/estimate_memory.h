// What `accel estimate-memory` computes: the per-rank memory of the model states (parameters,
// gradients, optimizer states) under DDP and ZeRO-1/2/3, with and without CPU offload, from the ZeRO
// paper's formulas (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", SC 2020, section 3 and figure 1). Pure arithmetic and text: no torch, no processes, no files.
//
// MODEL STATES ONLY. Like the paper, the figures leave out activations, temporary buffers
// (communication buckets, the one unit of parameters that ZeRO-3 gathers at a time, the gradient
// buckets that stream to the CPU under offload), the CUDA context and allocator fragmentation. Real
// peaks are higher; the table is a lower bound that tells the strategies apart.
//
// Notation: P parameters (the paper's Ψ), N ranks a state is sharded over: --num_processes, or with
// --shard_group_size S the S ranks of a shard group, whose copies hold the same shards (FSDP2's HSDP,
// DeepSpeed's MiCS, HYBRID_SHARD with S the ranks of a machine): per rank, the figures at N = S.
// Bytes per parameter, by precision (--dtype):
//   p  working parameters    g  gradients    K  optimizer state = fp32 master copy (if any) + moments
//   fp16, bf16  p = 2, g = 2, K = 4 + S   mixed precision over fp32 master weights (the paper's 2 + 2 + K)
//   fp32 (no)   p = 4, g = 4, K = S       the parameters are the fp32 weights: no separate master copy
//   fp8         p = 1, g = 2, K = 4 + S   accel's fp8 keeps an fp8 working copy of each parameter
//                                         (re-quantized from the fp32 master after each step, gathered in
//                                         fp8; per-tensor scales are negligible) and bf16 gradients. Layers
//                                         left in bf16 (norms, embeddings) put the truth between this and
//                                         the bf16 row. (fp8 in accel: docs/design.md, "One training step".)
// and by optimizer (--optimizer), the moments S in fp32:
//   adam, adamw  S = 8 (exp_avg + exp_avg_sq)    sgd  S = 4 (momentum buffer; plain SGD would be 0)
// So mixed-precision Adam has K = 12 (the paper's K), fp32 Adam K = 8: both give DDP 16P.
//
// Device bytes per rank, no offload (the paper's P_os, P_os+g, P_os+g+p):
//   DDP / FSDP NO_SHARD              (p + g + K) P                    16P         for mixed-precision Adam
//   ZeRO-1                           (p + g) P + K P / N              4P + 12P/N
//   ZeRO-2 / FSDP SHARD_GRAD_OP      p P + (g + K) P / N              2P + 14P/N
//   ZeRO-3 / FSDP FULL_SHARD         (p + g + K) P / N                16P/N
// The paper's example, P = 7.5e9, N = 64, K = 12: 120, 31.4, 16.6 and 1.9 GB (GB = 1e9 bytes).
//
// CPU offload (--offload; ZeRO-Offload / ZeRO-Infinity, as DeepSpeed's offload_optimizer and
// offload_param do it). The optimizer step runs on the CPU over the rank's shard, so the CPU holds,
// per parameter of the shard: the fp32 parameters it updates (the master copy; under fp32 a copy of
// the device weights), the moments S, and the fp32 gradient it steps from (what DeepSpeed's own
// estimator counts: its 16 bytes for mixed-precision Adam are our 4 + 8 + 4). The device gradients of
// ZeRO-2/3 stream through buckets to the CPU and are not kept; ZeRO-1 keeps its full device gradients.
//   optimizer           CPU (4 + S + 4) P / N for ZeRO-1/2/3; device ZeRO-1: (p + g) P, ZeRO-2: p P,
//                       ZeRO-3 p P / N
//   optimizer+params    ZeRO-3 also moves its parameter shard to the CPU: device 0 (only the gathered
//                       unit, a temporary), CPU (4 + S + 4 + p') P / N with p' = p under mixed precision
//                       (the working copy is separate from the master) and 0 under fp32 (it is the master).
//                       ZeRO-1/2 offload the optimizer only: their parameters are replicated.
// DDP offloads nothing: offload needs ZeRO (as in DeepSpeed), so its row is the same in every mode.
//
// Gradient accumulation (--gradient_accumulation_steps K > 1), as accel's engine holds it. A window's
// gradients add up in the reduction's dtype, fp32 under fp16/bf16/fp8 (s = 4 bytes, as FSDP2 with an
// fp32 reduce_dtype), and in the gradient buffer itself under fp32 (s = g). --grad_accum_dtype bf16
// (fp16 under fp16) is DeepSpeed's data_types.grad_accum_dtype keeping the sum in the gradients' own
// dtype: s = g = 2, as without accumulation for DDP and ZeRO-1.
//   micro-steps that do not reduce (NoSync, Accelerate's default): every rank keeps its whole,
//     unsharded sum on the device until the window's last backward reduces it. ZeRO-2 and ZeRO-3
//     then hold s P more, replicated, beside what they shard or stream to the host. DDP and ZeRO-1
//     hold the whole gradient anyway: no more under fp32, and (s - g) P more under mixed precision
//     (the sum in place of the gradient buffer, whose each flat's part goes once it is added).
//   micro-steps that reduce (--sync_each_batch; DeepSpeed's way, and accel's default under a DeepSpeed
//     ZeRO-2/3 config): the sum so far (reduced, in the reduction's dtype) is held beside each new
//     reduced gradient until the end of the backward adds them. That is s P more for DDP and s P / N
//     for ZeRO-1. ZeRO-2/3 add each reduced shard to the sum as its bucket finishes (on the host under
//     optimizer offload): they hold no more.
// Measured, 19.33M-parameter GPT in fp32 (gP = 77.3 MB) at 2 private ranks: the gradients' peak rises
// by 77.3 MB (DDP) and 38.6 MB (ZeRO-1) when reducing each micro-step, and by 49.7 MB (NoSync) and
// 21.3 MB (reducing) for ZeRO-2/3. Their in-flight buffers shrink at the same time (in place,
// for instance), so the states' term is an upper bound there. In bf16 (3.23M parameters, 2 ranks,
// 4 micro-steps NoSync) the peak rises by 2.0 bytes a parameter for DDP and ZeRO-1, (s - g), and by
// 3.5 for ZeRO-2 and FULL_SHARD, against s = 4.
//
// Every row is thus (device_rep + device_shard / N) P on the device and (cpu_rep + cpu_shard / N) P on
// the CPU, per rank; a strategy fits a budget B from N >= shard P / (B - rep P) ranks (never when
// rep P > B).
//
// Recommendation (with a --budget): the least-sharded, least-offloaded configuration that fits, i.e.
// the one that communicates least. The order is the one Hugging Face's DeepSpeed guide gives for speed:
//   DDP > ZeRO-1 > ZeRO-2 > ZeRO-2 + optimizer offload > ZeRO-3 > ZeRO-3 + optimizer offload
//   > ZeRO-3 + optimizer and parameter offload.
// DDP all-reduces the gradients (2P values sent and received per rank per step). ZeRO-1 and ZeRO-2
// replace that all-reduce by a reduce-scatter of the gradients plus an all-gather of the updated
// parameters: the same 2P, in more collectives. ZeRO-3 all-gathers the parameters in forward and again
// in backward: 3P (1.5x), on the critical path. Offload adds, every step, the gradient shard to the CPU
// and the parameters back over PCIe plus a CPU optimizer step. (ZeRO-1 + offload is never recommended:
// ZeRO-2 + offload needs less device memory for the same traffic.) The recommendation is searched over
// every offload mode, whatever --offload chose for the table, and says when it differs. The price of
// the least sharding is headroom for what the figures leave out, so it prints what is left per device
// and warns when that is under 10% of the budget, naming the next option.
#pragma once

#include "base/error.h"

#include "zero/spec.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace accel::cli {

// Every bad input (a flag's value that does not parse or is out of range) is one of these; the
// message names the flag and the value.
class EstimateError : public accel::InvalidArgumentError {
 public:
  using accel::InvalidArgumentError::InvalidArgumentError;
};

enum class Dtype { Fp32, Fp16, Bf16, Fp8 };
enum class OptimizerKind { AdamW, Adam, Sgd };
enum class Offload { None, Optimizer, OptimizerAndParams };

// "fp32" (also "no", "float32"), "fp16", "bf16", "fp8"; case-insensitive. `flag` names the option in
// the error message.
Dtype parse_dtype(std::string_view s, std::string_view flag = "--dtype");
// "adamw", "adam", "sgd"; case-insensitive.
OptimizerKind parse_optimizer(std::string_view s);
// "none", "optimizer" (also "cpu"), "optimizer+params" (also "all"); case-insensitive.
Offload parse_offload(std::string_view s);
// A positive parameter count: "7.5e9", "7.5B", "350M", "1.3b", "125k", "1T", "1000". Suffixes
// k/K = 1e3, m/M = 1e6, b/B/g/G = 1e9, t/T = 1e12. Rounded to a whole number, from 1 to 1e18.
double parse_param_count(std::string_view s);
// A positive byte size: "24GB", "24gb", "80GiB", "512MB", "1.5TB", "24G" (= GB), "24" (= GB).
// Decimal units KB/MB/GB/TB (and K/M/G/T) are powers of 1000, binary KiB/MiB/GiB/TiB powers of 1024.
// `flag` names the option in the error message; allow_zero: "0" is a size too (--overhead).
double parse_byte_size(std::string_view s, std::string_view flag = "--budget", bool allow_zero = false);
// A whole number of ranks, 1 or more; `flag` names the option in the error message.
int parse_num_processes(std::string_view s, std::string_view flag = "--num_processes");

const char* to_string(Dtype d);
const char* to_string(OptimizerKind o);
const char* to_string(Offload o);

// Bytes per parameter of each model state (see the table above).
struct BytesPerParam {
  double param = 0;    // p: working parameters, in the compute dtype
  double grad = 0;     // g: gradients
  double master = 0;   // fp32 master copy (0 under fp32: the parameters are the master)
  double moments = 0;  // S: the optimizer's own state, fp32
  double sum = 0;      // s: a gradient summed over micro-steps: fp32 (4) unless the accumulation dtype says 2
  double optimizer() const { return master + moments; }  // the paper's K
  double total() const { return param + grad + optimizer(); }
};
// accumulate: the dtype the window sums in (--grad_accum_dtype); unset, fp32.
BytesPerParam bytes_per_param(Dtype dtype, OptimizerKind optimizer, std::optional<Dtype> accumulate = {});

// Gradient accumulation as the estimate sees it (see the table above).
struct Accumulation {
  int steps = 1;                 // micro-steps a step (--gradient_accumulation_steps)
  bool sync_each_batch = false;  // each micro-step reduces (--sync_each_batch)
  std::optional<Dtype> dtype;    // what the window sums in (--grad_accum_dtype); unset: fp32
};

struct EstimateRequest {
  double params = 0;         // P
  int num_processes = 1;     // the job's ranks
  int shard_group_size = 0;  // S, dividing num_processes; 0: every rank (one group)
  // N of the formulas: the ranks a state is sharded over.
  int shard_over() const { return shard_group_size > 0 ? shard_group_size : num_processes; }
  // Groups of fewer ranks than the job's, each holding a copy (S = num_processes is the plain table).
  bool has_copies() const { return shard_group_size > 0 && shard_group_size < num_processes; }
  Dtype dtype = Dtype::Bf16;
  OptimizerKind optimizer = OptimizerKind::AdamW;
  Offload offload = Offload::None;
  std::optional<double> device_budget;  // bytes per device (--budget)
  std::optional<double> cpu_budget;     // bytes of CPU memory per rank (--cpu_budget)
  Accumulation accumulation;
};

// Throws EstimateError unless r.shard_group_size is 0 or a divisor of r.num_processes.
void validate_shard_groups(const EstimateRequest& r);

// One strategy under one offload mode: bytes per parameter, replicated and sharded over N.
struct StrategyCoefficients {
  double device_rep = 0, device_shard = 0;  // device bytes = (device_rep + device_shard / N) * P
  double cpu_rep = 0, cpu_shard = 0;        // CPU bytes    = (cpu_rep + cpu_shard / N) * P
  std::string note;                         // why the requested offload does not (fully) apply, or ""
};
// The rows are the first four of the strategy table (zero/spec.h), named by its label and
// short_label: NoShard (DDP), Zero1, Zero2, Zero3. HybridShard is not a row: each rank stores what
// ZeRO-3 stores over the ranks of one machine, so its figures are the Zero3 row's with
// --shard_group_size = ranks per machine; coefficients() throws EstimateError for it.
// With accumulation (K > 1), each row gains what its micro-steps hold (the table above), with a note.
StrategyCoefficients coefficients(zero::Strategy s, const BytesPerParam& b, Offload offload,
                                  const Accumulation& accumulation = {});

struct StrategyRow {
  zero::Strategy strategy = zero::Strategy::NoShard;
  StrategyCoefficients coef;
  double device_bytes = 0;   // per rank
  double cpu_bytes = 0;      // per rank
  std::optional<bool> fits;  // set when a budget was given
  std::optional<long long>
      min_ranks;  // smallest N (group size) at which it fits (all budgets); nullopt: never or no budget
};

// A strategy under an offload mode, with its per-rank bytes.
struct Choice {
  zero::Strategy strategy = zero::Strategy::NoShard;
  Offload offload = Offload::None;
  double device_bytes = 0, cpu_bytes = 0;
};

// The order in which the recommendation tries configurations (least communication first).
const std::vector<std::pair<zero::Strategy, Offload>>& recommendation_order();

struct Estimate {
  EstimateRequest request;
  BytesPerParam bytes;
  std::vector<StrategyRow> rows;  // DDP, ZeRO-1, ZeRO-2, ZeRO-3 under request.offload
  // With a budget: the first configuration of recommendation_order() that fits; nothing if none does
  // (possible only with a --cpu_budget, since full offload leaves no model state on the device).
  std::optional<Choice> recommended;
  std::optional<Choice> passed_over;      // the configuration just before it in the order, which does not fit
  std::optional<Choice> next_option;      // the first one after it that fits with less device memory
  std::optional<Choice> without_offload;  // when it offloads: the first one after it that fits without
};

// Throws EstimateError for fewer than 1 micro-step, or an accumulation dtype that cannot hold the
// gradients of `compute` (fp8; bf16 under fp32 or fp16; fp16 under anything but fp16), as the
// config's data_types.grad_accum_dtype is refused under mixed precision (under fp32 the window is the
// gradient buffer whatever the key says).
void validate(const Accumulation& a, Dtype compute);

// Validates the request (P >= 1, N >= 1, budgets > 0; throws EstimateError) and fills the table.
Estimate estimate_memory(const EstimateRequest& request);

// The smallest N >= 1 at which (rep + shard / N) * P <= budget, or nullopt if there is none (rep * P
// reaches the budget) or it is above 1e12.
std::optional<long long> min_ranks_to_fit(double rep, double shard, double params, double budget);
// The smallest N at which a row fits every budget of the request (device and CPU), or nullopt. With
// --shard_group_size, N is a group's size, so the smallest that also divides the job's ranks.
std::optional<long long> min_ranks_within_budgets(const StrategyCoefficients& c, const EstimateRequest& r);

// "4P + 12P/N", "16P", "16P/N", "0" (device or CPU side of a row).
std::string formula(double rep, double shard);
// Bytes as GB (1e9): one decimal from 1 GB up (the paper's 31.4), three significant digits below.
std::string format_gb(double bytes);
// 7.5e9 -> "7.5B", 3.5e8 -> "350M", 1.25e5 -> "125k".
std::string format_param_count(double params);

// " in shard groups of S (C copies of each shard: ...)" after the header's rank count with
// --shard_group_size, else "".
std::string shard_groups_line(const EstimateRequest& r);

// The header's line for --gradient_accumulation_steps K > 1 ("" without accumulation), pointing at the
// table's notes or (the GPT report, which has none) at its states column.
std::string accumulation_line(const Accumulation& a, bool notes = true);

// The whole report `accel estimate-memory` prints: header, aligned table, notes, recommendation.
std::string format_estimate(const Estimate& e);

}  // namespace accel::cli
