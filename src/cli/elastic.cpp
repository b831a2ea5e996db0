#include "cli/elastic.h"

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <utility>

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

const RankFailure* first_failure(const std::vector<RankFailure>& failures) {
  const RankFailure* first = nullptr;
  auto key = [](const RankFailure& f) { return std::make_pair(f.signal == SIGTERM, f.time_ns); };
  for (const auto& f : failures)
    if (!first || key(f) < key(*first)) first = &f;
  return first;
}

std::vector<std::string> hosts_failed(const std::vector<RankFailure>& failures, const std::vector<bool>& reached) {
  const int machines = static_cast<int>(reached.size());
  std::vector<std::string> why(reached.size());
  const RankFailure* first = first_failure(failures);
  if (!first) return why;
  if (first->signal != SIGTERM) {  // a rank killed by a signal of its own: its host
    if (first->signal && first->node >= 0 && first->node < machines)
      why[first->node] = fmt::format("rank {} was killed by signal {} first", first->rank, first->signal);
    return why;
  }
  // Only ranks stopped by the launcher reported: the host that failed is one whose ranks started (and
  // reached the status directory) but could not.
  std::vector<bool> reported(why.size());
  for (const auto& f : failures)
    if (f.node >= 0 && f.node < machines) reported[f.node] = true;
  for (int m = 0; m < machines; ++m)
    if (reached[m] && !reported[m])
      why[m] = fmt::format("its ranks started, then none reported; the others were stopped (signal {})", SIGTERM);
  return why;
}

}  // namespace accel::cli
