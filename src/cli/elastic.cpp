#include "cli/elastic.h"

#include <fmt/format.h>

namespace accel::cli {

ShrinkPlan plan_shrink(const ShrinkRequest& r) {
  ShrinkPlan p;
  std::vector<HostSlots> usable;
  std::string dropped;
  for (std::size_t m = 0; m < r.machines.size(); ++m) {
    const bool gone = m < r.dropped.size() && !r.dropped[m].empty();
    if (gone)
      dropped += fmt::format("{}{} ({})", dropped.empty() ? "" : ", ", r.machines[m].host, r.dropped[m]);
    else
      usable.push_back(r.machines[m]);
  }
  int n = static_cast<int>(usable.size());
  while (n > 0 && r.initial_machines % n != 0) --n;
  const std::string lost = dropped.empty() ? std::string("no host dropped") : "dropped " + dropped;
  if (n < r.min_nodes || n == 0) {
    p.why = fmt::format("{}; {} usable host(s) left, fewer than --min_nodes {}{}", lost, usable.size(), r.min_nodes,
                        n != static_cast<int>(usable.size())
                            ? fmt::format(" that can keep the global batch (a count dividing {})", r.initial_machines)
                            : "");
    return p;
  }
  p.ok = true;
  p.machines.assign(usable.begin(), usable.begin() + n);
  p.why = fmt::format("{}; {} of {} host(s)", lost, n, r.initial_machines);
  if (n < static_cast<int>(usable.size()))
    p.why += fmt::format(" ({} usable, but the global batch needs a host count dividing {}: {} left out)",
                         usable.size(), r.initial_machines, usable.size() - n);
  return p;
}

}  // namespace accel::cli
