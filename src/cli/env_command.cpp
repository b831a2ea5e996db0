// `accel env`: what a bug report needs. Under mpirun every rank reports its topology, the CPUs it
// may run on (sched_getaffinity: what `accel launch` bound it to) and libtorch's intra-op threads;
// rank 0 prints.
#include "cli/commands.h"
#include "cli/cpu_cores.h"

#include "accel/version.h"
#include "base/env.h"
#include "comm/communicator.h"
#include "comm/cuda_comm.h"
#include "comm/transport/mpi/mpi_backend.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "kernels/cpu_gemm.h"

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <fmt/core.h>
#include <torch/headeronly/version.h>

#include <cstring>
#include <string>
#include <vector>

namespace accel::cli {
namespace {

int run_env() {
  auto world = comm::Communicator::world();
  const comm::Topology& t = world->topology();

  // Gather every rank's topology line to rank 0 (fixed-size records through our own all_gather).
  constexpr int kLine = 320;
  const std::vector<int> cpus = affinity_cpus();
  std::string mine = fmt::format("{} cpus {} ({} core(s)) intra-op threads {}", t.to_string(), cpu_list(cpus),
                                 physical_cores(cpus), at::get_num_threads());
  mine.resize(kLine - 1);  // (a longer line is cut; the last byte stays the terminating NUL)
  mine.resize(kLine, '\0');
  at::Tensor local = at::from_blob(mine.data(), {kLine}, at::kByte).clone();
  at::Tensor all = at::empty({world->size() * kLine}, at::kByte);
  world->all_gather(local, all);
  if (world->rank() != 0) return 0;

  const int devices = comm::cuda_device_count();
  fmt::print("accel version     {}\n", ACCEL_VERSION);
  fmt::print("libtorch          {} (headers {}), CUDA usable by libtorch: {}\n", ACCEL_TORCH_VERSION, TORCH_VERSION,
             at::hasCUDA() ? "yes" : "no");
  fmt::print("MPI               {}\n", comm::mpi_library_version());
  fmt::print("NCCL backend      {}: {}\n", comm::nccl_compiled() ? "compiled" : "not compiled", comm::nccl_version());
  fmt::print("CUDA devices      {}{}\n", devices, devices == 0 ? " (CUDA tensors unusable; CPU/MPI only)" : "");
  if (devices > 0)
    fmt::print("CUDA collectives  {} (ACCEL_CUDA_COMM, for the {} rank(s) on rank 0's node)\n",
               comm::describe_cuda_comm(t.ranks_on_this_machine(), devices), t.ranks_on_this_machine());
  std::string gemm;
  try {
    gemm = cpu_gemm::describe(cpu_gemm::from_env()) + ", once an engine is built";
  } catch (const std::invalid_argument& e) {
    gemm = e.what();
  }
  fmt::print("CPU fp32 matmuls  {}\n", gemm);
  fmt::print("world             {} rank(s) on {} node(s){}\n", t.world_size, t.num_nodes,
             t.simulated ? " (simulated by ACCEL_RANKS_PER_NODE)" : "");
  const char* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < world->size(); ++r) fmt::print("  {}\n", std::string(base + r * kLine).c_str());
  fmt::print("environment\n");
  for (const auto& v : env::table()) {
    fmt::print("  {:<22} = {:<6} {}\n", v.name, env::get(v.name).empty() ? "(unset)" : env::get(v.name),
               env::is_set(v.name) ? "(set)" : "(default)");
  }
  return 0;
}

}  // namespace

void add_env_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("env", "Print versions, build features, devices and the rank topology");
  cmd->callback([&exit_code] { exit_code = run_env(); });
}

}  // namespace accel::cli
