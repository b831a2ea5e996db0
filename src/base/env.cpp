#include "base/env.h"
#include "base/error.h"

#include <cstdlib>
#include <stdexcept>
#include <string_view>

namespace accel::env {

const std::vector<Variable>& table() {
  static const std::vector<Variable> vars = {
      {"ACCEL_COMM_TIMEOUT_S", "300", "seconds a collective may take before it raises TimeoutError and the job fails"},
      {"ACCEL_COMM_CHECK", "1",
       "1: compare sizes/dtype/op/root across ranks before each collective (MismatchError instead of "
       "memory corruption); 0: skip that small all-reduce"},
      {"ACCEL_COMM_SHM", "1",
       "1: collectives on CPU tensors between the ranks of one node go through shared memory (groups spanning "
       "nodes: node-local shared memory plus MPI between nodes); 0: every CPU collective goes over MPI"},
      {"ACCEL_CUDA_COMM", "auto",
       "collectives on CUDA tensors: nccl (one GPU per rank), host (staged through pinned host memory over "
       "the CPU transport: works where ranks share a GPU, at host-copy speed), auto (nccl, unless ranks of the "
       "group share a GPU or the build has no NCCL: then host); set it alike on every rank"},
      {"ACCEL_COMM_SHM_CHUNK_KB", "256",
       "the shared-memory transport's chunk per rank and buffer, in KiB (pipelining grain; rank 0's value is used)"},
      {"ACCEL_COMM_SHM_SINGLE_COPY_KB", "1024",
       "all_gathers and reduce_scatters that move at least this many KiB per peer read each peer's data straight "
       "from its memory (process_vm_readv, where the kernel allows it and every rank has a core; node-shared "
       "inputs where they lie): each rank at its own pace instead of chunk by chunk in lock-step with its peers; "
       "0: never (rank 0's value is used)"},
      {"ACCEL_CPU_MALLOC_CACHE", "1",
       "1: once a model is prepared with sharded CPU parameters or gradients, freed CPU memory is kept for "
       "reuse (glibc's heap under 32 MiB, untrimmed; accel's allocator caches larger blocks by size, never "
       "beyond the most the process has had in use plus its largest block), so the gather/free cycle of each "
       "unit reuses warm pages instead of page-faulting fresh ones every step; 0: leave allocation as it is"},
      {"ACCEL_NODE_SHARED_PARAMS", "1",
       "1: sharded CPU parameters (ZeRO-3, FULL_SHARD, HYBRID_SHARD) whose shard group sits on one "
       "node live in shared memory that every rank of the group maps, the ranks' shards side by side: together "
       "they are the full parameters, so the node holds them once and gathering them moves no bytes (between "
       "steps a sharded unit's parameters throw on access, as private ones do; barriers order the step's writes "
       "against the peers' reads; each rank's RSS counts the shared pages); 0: each rank keeps its shard privately and "
       "all-gathers copies of the full "
       "parameters around each unit's use"},
      {"ACCEL_NODE_SHARED_GRADS", "1",
       "1: under ZeRO-2/3 and FSDP's sharded strategies on the CPU, a shard group on one node takes the full "
       "gradients it reduce-scatters from a shared-memory pool (room for grad_buckets_in_flight + 1 of them "
       "per rank), which the peers read in place: no copy through the transport's buffers, and no lock-step "
       "between the ranks; 0: private gradient buffers"},
      {"ACCEL_CPU_GEMM", "auto",
       "float32 CPU matrix products (mm, addmm: linear layers forward and backward) once an engine is built: "
       "onednn sends those of >= 2^20 multiply-adds to oneDNN's matmul, libtorch leaves them to libtorch's BLAS "
       "(MKL), auto picks onednn on CPUs with AVX-512 that are not Intel's (where MKL runs its AVX2 kernels)"},
      {"ACCEL_FP8_COLWISE", "single",
       "the fused fp8 casts on CUDA with one scale per column (the rowwise recipe's backward operands): single "
       "(one kernel, a block per 32 columns walking every row) or chunked (two kernels, the rows split among "
       "blocks too, the column maxima met by atomics: more parallel where columns are few); the same bytes"},
      {"ACCEL_STEP_IN_BACKWARD", "0",
       "1: under sharded optimizer state (ZeRO-1/2/3, FSDP's sharded strategies) the optimizer (Adam, AdamW, "
       "SGD) steps each fp32 master of its own as soon as its reduced gradient is final, on a worker thread while "
       "backward goes on (a device's masters in host memory, ZeRO-Offload: once the gradient has reached the "
       "host), instead of all of them in optimizer.step(); the same bits; refused with fp16 loss scaling and "
       "with gradient_clipping, and clipping by hand then throws"},
      {"ACCEL_RANKS_PER_NODE", "",
       "simulate nodes of this many ranks on one machine (node_rank = rank / k); must divide the "
       "world size; or a list of node sizes in rank order that add up to it (\"2,1\": uneven nodes)"},
      // Set by `accel launch` from its flags; read by accel::resolve_config (an explicit Accelerator
      // argument wins over these, these win over the config file).
      {"ACCEL_CONFIG_FILE", "", "the config file to read: Accelerate-style YAML or a DeepSpeed JSON"},
      {"ACCEL_MIXED_PRECISION", "", "override mixed_precision: no, fp16, bf16 or fp8"},
      {"ACCEL_GRADIENT_ACCUMULATION_STEPS", "", "override gradient_accumulation_steps (an integer >= 1)"},
      {"ACCEL_USE_CPU", "", "override use_cpu: 1/true runs on the CPU even when GPUs are present"},
      {"ACCEL_ZERO_STAGE", "", "force DEEPSPEED with this ZeRO stage (0, 1, 2 or 3)"},
      {"ACCEL_FSDP_SHARDING_STRATEGY", "",
       "force FSDP with this fsdp_sharding_strategy (a name or Accelerate's number 1..4; `accel launch --help` "
       "lists them)"},
      // Read by the `accel` command itself.
      {"ACCEL_HOME", "", "where `accel config` writes default_config.yaml (default ~/.cache/accel)"},
      {"ACCEL_AUTO_RESUME", "0",
       "1: Accelerator::prepare loads the newest checkpoint of <project_dir>/checkpoints when there is one "
       "(`accel launch --auto_resume` sets it; AcceleratorOptions::auto_resume wins)"},
      {"ACCEL_RESTART_COUNT", "",
       "set by `accel launch --max_restarts` on every rank: how many times the job was started again (0 the "
       "first time)"},
      {"ACCEL_TUNE", "",
       "set by `accel tune` for each run it measures: probe,report=PATH (prepare() reports the model and ends) or "
       "warmup=W,steps=S,report=PATH[,budget=BYTES] (the run times W+S optimizer steps, reports and ends; "
       "accelerator/tuning.h)"},
      {"ACCEL_INITIAL_WORLD_SIZE", "",
       "set by `accel launch --min_nodes` when it restarts a job on fewer hosts: the world size the job started "
       "with. The Accelerator multiplies gradient accumulation by it over the ranks running (and split_batches "
       "loaders read that many times smaller batches), so the global batch stays the same"},
      {"ACCEL_HOST_PROBE_TIMEOUT_S", "30",
       "`accel launch --min_nodes`: seconds a host has to start `true` through mpirun before each start; a host "
       "that does not is dropped"},
      {"ACCEL_MPIRUN", "mpirun", "the mpirun `accel launch` runs"},
      {"ACCEL_SRUN", "srun", "the srun `accel launch` runs inside a Slurm allocation"},
      {"ACCEL_LOG_LEVEL", "warning",
       "what the library and get_logger's loggers log (stderr, the rank in each line): trace, debug, "
       "info, warning, error, critical or off"},
      {"ACCEL_CHECK_ARGS", "",
       "DIR: a dry run of a script's commands: step_bench, the GPT example, the test binaries and "
       "torch_anchor.py write DIR/<pid>.start as they start and DIR/<pid>.ok once their arguments are "
       "checked, then stop before any work; accel runs its command as usual and writes .ok when it "
       "returns 0 (tests/scripts/gpu_args.sh runs the GPU scripts so)"},
      {"ACCEL_CHECKPOINT_PAUSE_MS", "0",
       "save_state pauses this long between writing and publishing a checkpoint (for crash tests)"},
      {"ACCEL_LAUNCH_STATUS_DIR", "",
       "set by `accel launch` for accel-rank: where a failing rank records its exit (not for users)"},
  };
  return vars;
}

static const Variable& find(const char* name) {
  for (const auto& v : table())
    if (std::string_view(v.name) == name) return v;
  throw accel::InvalidArgumentError(std::string("accel::env: ") + name + " is not in the variable table");
}

bool is_set(const char* name) {
  find(name);
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

std::string get(const char* name) {
  const Variable& var = find(name);
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : std::string(var.default_value);
}

long long get_int(const char* name) {
  std::string s = get(name);
  try {
    std::size_t pos = 0;
    long long x = std::stoll(s, &pos);
    if (pos == s.size()) return x;
  } catch (const std::exception&) {
  }
  throw accel::InvalidArgumentError(std::string(name) + "='" + s + "' is not an integer");
}

double get_double(const char* name) {
  std::string s = get(name);
  try {
    std::size_t pos = 0;
    double x = std::stod(s, &pos);
    if (pos == s.size()) return x;
  } catch (const std::exception&) {
  }
  throw accel::InvalidArgumentError(std::string(name) + "='" + s + "' is not a number");
}

}  // namespace accel::env
