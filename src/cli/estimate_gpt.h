// `accel estimate-memory` for a GPT shape (--d_model --layers --heads --seq --micro_batch [--vocab]):
// the whole per-rank peak of one training step of the examples' GPT (examples/models/gpt.h), model
// states plus what the ZeRO formulas leave out, with and without activation checkpointing. Pure
// arithmetic: no torch.
//
// The model: V vocabulary, d width, L blocks, H heads, T sequence, B micro-batch (sequences per rank).
//   root unit  R = V d + T d + 2d        token embedding (tied to the head), positions, final LayerNorm
//   block      U = 12 d^2 + 10 d         qkv 3d^2 (no bias), proj d^2 + d, fc1 4d^2 + 4d, fc2 4d^2 + d,
//                                        two LayerNorms 4d
//   P = R + L U
//
// Activations: what the forward keeps for backward, counted element by element for this GPT in e-byte
// elements (e = 4 in fp32, 2 under bf16/fp16/fp8 autocast). Per block, in units of B T d:
//   1 input (ln1's), 1 ln1 output (qkv's input), 3 q, k, v (matmul copies them contiguous), 1 attention
//   output (proj's input), 1 residual (ln2's input), 1 ln2 output, 4 fc1 output (gelu's input),
//   4 gelu output (fc2's input) = 16 B T d, plus the softmax output B H T^2, LayerNorm mean and rstd
//   4 B T, and the causal mask T^2 bytes (bool):
//     A_block = e (16 B T d + B H T^2 + 4 B T) + T^2
//   With --attention sdpa (GPTConfig::attention, the examples' default on CUDA), the fused kernel keeps
//   no B H T^2 scores and no mask, but its fp32 logsumexp, 4 B H T bytes (the CUDA kernels add a few
//   bytes of RNG state): A_block = e (16 B T d + 4 B T) + 4 B H T. Measured on the CPU (its flash
//   kernel) at the four shapes below, equal to the byte.
//   After the blocks: ln_f's output B T d and its mean/rstd 2 B T, the logits B T V and log_softmax's
//   output B T V, and the loss (8 bytes):
//     A_head = e (B T d + 2 B T + 2 B T V) + 8
//   (The composite loss, as on the CPU where this was measured. On CUDA the examples' loss is accel's
//   fused cross entropy, which keeps two floats a row instead of log_softmax's output: there A_head
//   is an upper bound by about e B T V.)
//   Without checkpointing: L A_block + A_head (the first block's input is the embedding's output,
//   made before the first unit: not an activation; the last block's output, ln_f's input, is in
//   A_head's place of it). Measured by step_bench (memory::Category::Activations, fp32, 2 ranks):
//   equal to the byte at B,T,d,H,L = 1,32,128,4,2 / 2,48,96,6,3 / 1,64,256,8,4 / 3,16,64,2,2.
//   With checkpointing every block keeps its input only, and backward recomputes one block at a time:
//     e L B T d + A_head + A_block.
//
// The per-rank peak of a step (N ranks; p, g, K bytes per parameter as in estimate_memory.h; F
// gradient buckets in flight, ShardingSpec::grad_buckets_in_flight = 2; bucket S = bucket_bytes):
//   states     the ZeRO formula's row (estimate_memory.h): DDP 16P, ZeRO-3 16P/N for fp32 AdamW
//   gathered   ZeRO-3: the root unit stays gathered, and at most 2 blocks (the one in use and the
//              prefetched one): p (R + 2U). Others 0 (their parameters are in the states).
//   in flight  gradients beyond those in the states, during backward:
//              DDP 0 (the buckets are the gradients' own memory); ZeRO-1: F staged buckets, F min(S, gP);
//              ZeRO-2/3: the root's full gradient (the tied embedding accumulates over all of backward)
//              plus F full-gradient buckets or units: g (R + F max(U, S/g)), at most g P.
//   backward   autograd's temporaries: the root's gradients before they are summed into the flat one
//              (embedding, head and their sum: 3 e R) and one block's activation gradients (A_block).
//   optimizer  AdamW's step temporaries (sqrt and the division: 2 x the largest tensor it steps, the
//              rank's shard of the largest unit under ZeRO, the whole unit under DDP), at step time.
//   overhead   per rank, not counted by the allocator: the libtorch + Open MPI runtime (354 MiB RSS
//              before any model, measured by step_bench's rss_base) and allocator and MPI slack
//              (about 0.2 GB measured at 31.5M parameters), 0.55 GB in all (--overhead).
//   peak = overhead + states + max(gathered + in flight + activations + backward, root gathered +
//          optimizer)
// This is the designed bound of the gradients (bounded gradient memory); an engine that
// keeps more gradients alive measures above it. Parameters are gathered only where they are sharded
// (zero::Plan::params_sharded): ZeRO-3 on one rank without parameter offload gathers nothing.
//
// Offload (--offload optimizer | optimizer+params, ZeRO-1/2/3 only: DDP has no row), a device's
// states in host memory (docs/offload.md):
//   states     the offload rows of estimate_memory.h: ZeRO-3 + optimizer p P / N (the parameter
//              shards), + optimizer and parameters 0, plus the root unit's shard p R / N (it is not
//              offloaded: it stays gathered, and its shard with it)
//   gathered   with the parameters offloaded, also the two blocks prefetched ahead, which arrive as
//              shards before their gathers: + 2 p U / N
//   in flight  as above: the reduced gradients stream to the host as their buckets finish
//   optimizer  0: the step runs on the host (its temporaries are host memory)
//   cpu        the host's states per rank (estimate_memory.h: (4 + S + 4) P / N, + p P / N for
//              offloaded parameters under mixed precision), besides its runtime
// Measured on an H100 by the project's GPU check (its offload file in benchmarks/results/), one rank,
// 8 GB cap, fp32 AdamW, 20 layers, seq 512, batch 1, sdpa (the caching allocator's peak, so against the
// peak less --overhead): ZeRO-3 + optimizer at d 2048 5.98 GB (estimate 6.05), at d 2304 7.38 GB
// (7.43); with checkpointing at d 2048 4.90 GB (4.86); + parameters, checkpointed, at d 2048 1.51 GB
// (1.67: the prefetched shards are counted as alive with everything else). A test holds them to that
// (EstimateGpt.OffloadRowsFollowWhatAGpuMeasured).
//
// Node-shared ZeRO-3 (CPU ranks on one machine, accel's default there; docs/design.md): the ranks'
// shards side by side in one buffer every rank maps are the full parameters, so nothing is gathered
// (gathered 0, the root unit's 0 beside the step too). Each rank's figures are its share (what its
// PSS shows; its RSS shows the whole p P of parameters it maps); the machine holds N times a row.
// Rows "ZeRO-3 node-shared" (with and without checkpointing) follow the others when N > 1.
#pragma once

#include "cli/estimate_memory.h"

#include <optional>
#include <string>
#include <vector>

namespace accel::cli {

struct GptShape {
  long long vocab = 4096;  // step_bench's default
  long long d_model = 0, layers = 0, heads = 0, seq = 0, micro_batch = 1;
  bool sdpa = false;  // attention fused in at::scaled_dot_product_attention (--attention sdpa)
};

// Throws EstimateError naming the flag (every field >= 1, heads divides d_model).
void validate(const GptShape& s);
double gpt_root_params(const GptShape& s);   // R
double gpt_block_params(const GptShape& s);  // U
double gpt_params(const GptShape& s);        // P = R + L U

struct GptActivations {
  double block = 0;          // A_block
  double head = 0;           // A_head
  double without_ckpt = 0;   // L A_block + A_head
  double with_ckpt = 0;      // e L B T d + A_head + A_block
  double element_bytes = 4;  // e
};
GptActivations gpt_activations(const GptShape& s, Dtype dtype);

// The runtime knobs the peak depends on.
struct GptRuntime {
  double overhead = 0.55e9;        // bytes per rank (--overhead)
  double bucket_bytes = 25 << 20;  // ShardingSpec::bucket_bytes
  int buckets_in_flight = 2;       // ShardingSpec::grad_buckets_in_flight
};

// One strategy, with or without checkpointing: the terms above, in bytes per rank.
struct GptPeak {
  zero::Strategy strategy = zero::Strategy::NoShard;
  bool checkpoint = false;
  bool node_shared = false;  // ZeRO-3 with its parameters in memory the machine's ranks share
  Offload offload = Offload::None;
  double states = 0, gathered = 0, in_flight = 0, activations = 0, backward = 0, optimizer = 0, overhead = 0;
  double total = 0;          // the device's peak
  double cpu = 0;            // the host's states per rank (offload)
  std::string note;          // why the offload asked for does not (fully) apply, or ""
  std::optional<bool> fits;  // within --budget and --cpu_budget
};
// (accumulation: the states' term as estimate_memory's rows take it, cli/estimate_memory.h; num_processes:
// the ranks a state is sharded over, EstimateRequest::shard_over())
GptPeak gpt_peak(zero::Strategy s, bool checkpoint, const GptShape& shape, int num_processes, Dtype dtype,
                 OptimizerKind optimizer, const GptRuntime& rt, bool node_shared = false,
                 const Accumulation& accumulation = {}, Offload offload = Offload::None);

struct GptEstimate {
  GptShape shape;
  EstimateRequest request;  // params = P
  GptRuntime runtime;
  GptActivations activations;
  // DDP (not under offload), ZeRO-1, ZeRO-2, ZeRO-3, each without then with checkpointing; then, when
  // N > 1 and nothing is offloaded, ZeRO-3 node-shared without and with.
  std::vector<GptPeak> rows;
  // With a budget: the first row, in that order, that fits (not node-shared; under offload not ZeRO-1,
  // which ZeRO-2 beats with less device memory for the same traffic).
  std::optional<GptPeak> recommended;
};
// Validates (shape, N >= 1, budgets > 0) and fills the rows.
GptEstimate estimate_gpt(const GptShape& shape, const EstimateRequest& request, const GptRuntime& rt);

// The report `accel estimate-memory` prints for a GPT shape.
std::string format_gpt_estimate(const GptEstimate& e);

}  // namespace accel::cli
