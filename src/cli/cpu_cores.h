// The CPUs this process may run on (sched_getaffinity) and the physical cores behind them: what
// `accel launch` shares among a machine's ranks, what accel-rank falls back on under srun, and what
// `accel env` reports per rank. Header-only, Linux + libc only (accel-rank links no torch).
#pragma once

#include <sched.h>

#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace accel::cli {

// Logical CPU ids in this process's affinity mask, ascending.
inline std::vector<int> affinity_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

// Physical cores among `cpus` (hyperthreads of one core count once), as hwloc and so Open MPI's
// `PE=` count them; the CPU count where sysfs does not say.
inline int physical_cores(const std::vector<int>& cpus) {
  std::set<std::pair<int, int>> cores;  // (package, core)
  for (int c : cpus) {
    auto read = [c](const char* what) {
      const std::string path = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/" + what;
      int v = -1;
      if (FILE* f = std::fopen(path.c_str(), "r")) {
        if (std::fscanf(f, "%d", &v) != 1) v = -1;
        std::fclose(f);
      }
      return v;
    };
    const int package = read("physical_package_id"), core = read("core_id");
    if (package < 0 || core < 0) return static_cast<int>(cpus.size());
    cores.insert({package, core});
  }
  return static_cast<int>(cores.size());
}

// "0-3,8,10-11": a CPU list as taskset and /proc/self/status (Cpus_allowed_list) write it.
inline std::string cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return s.empty() ? "?" : s;
}

}  // namespace accel::cli
