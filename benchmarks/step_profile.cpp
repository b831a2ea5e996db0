#include "step_profile.h"

#include "base/files.h"

#include <c10/core/DeviceType.h>
#include <fmt/format.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace accel::bench {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda) a.insert(ActivityType::CUDA);
  return a;
}

ProfilerConfig config() { return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/false, false); }

struct Total {
  double ns = 0;
  std::int64_t calls = 0;
};

// The `n` largest totals, one line each.
std::string top(const std::map<std::string, Total>& by_name, std::size_t n, int steps, const std::string& prefix) {
  std::vector<std::pair<std::string, Total>> v(by_name.begin(), by_name.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < n; ++i) {
    std::string name = v[i].first;
    if (name.size() > 90) name = name.substr(0, 87) + "...";
    s += fmt::format("{}  {:>9.3f} ms a step  {:>6.1f} calls a step  {}\n", prefix, v[i].second.ns / 1e6 / steps,
                     static_cast<double>(v[i].second.calls) / steps, name);
  }
  return s;
}

// The length of the union of [start, end) intervals, in ns.
double union_ns(std::vector<std::pair<std::uint64_t, std::uint64_t>> v) {
  std::sort(v.begin(), v.end());
  double ns = 0;
  std::uint64_t open_start = 0, open_end = 0;
  for (const auto& [s, t] : v) {
    if (s > open_end) {
      ns += static_cast<double>(open_end - open_start);
      open_start = s;
      open_end = t;
    } else {
      open_end = std::max(open_end, t);
    }
  }
  return ns + static_cast<double>(open_end - open_start);
}

}  // namespace

StepProfile::StepProfile(bool cuda) : cuda_(cuda) {
  prof::prepareProfiler(config(), activities(cuda));
  prof::enableProfiler(config(), activities(cuda));
}

StepProfile::~StepProfile() {
  if (active_) prof::disableProfiler();
}

std::string StepProfile::finish(const std::string& label, int steps, double wall_s, const std::string& trace_path) {
  active_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  if (!trace_path.empty()) {
    if (const std::string dir = files::parent_dir(trace_path); !dir.empty()) files::make_dirs(dir);
    result->save(trace_path);
  }
  steps = std::max(steps, 1);
  std::map<std::string, Total> kernels, host, scopes;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> busy;       // the device's activity intervals
  std::vector<std::pair<std::uint64_t, std::uint64_t>> computing;  // of them, kernels (no copies, memsets)
  std::int64_t device_events = 0;
  // The device's own work: kernels, copies and memsets. Kineto also reports, as CUDA events, a span per
  // user scope (accel::*) and stream from its first to its last device activity (GPU_USER_ANNOTATION):
  // not work, and a union with them would count the gaps inside each scope as busy.
  using libkineto::ActivityType;
  for (const auto& e : result->events()) {
    const std::string name = e.name();
    const double ns = static_cast<double>(e.durationNs());
    if (e.deviceType() == c10::DeviceType::CUDA) {
      const auto t = static_cast<ActivityType>(e.activityType());
      const bool kernel = t == ActivityType::CONCURRENT_KERNEL;
      if (!kernel && t != ActivityType::GPU_MEMCPY && t != ActivityType::GPU_MEMSET) continue;
      ++device_events;
      kernels[name].ns += ns;
      ++kernels[name].calls;
      busy.emplace_back(e.startNs(), e.endNs());
      if (kernel) computing.emplace_back(e.startNs(), e.endNs());
    } else if (name.rfind("accel::", 0) == 0) {
      scopes[name].ns += ns;
      ++scopes[name].calls;
    } else if (name.rfind("aten::", 0) == 0 || name.rfind("cuda", 0) == 0) {
      host[name].ns += ns;  // (inclusive times: an op's children are counted again under their names)
      ++host[name].calls;
    }
  }
  const double busy_ns = union_ns(busy), computing_ns = union_ns(computing);
  // (No device activity at all: CUPTI delivered nothing, e.g. another subscriber holds it. The shares
  // stay unknown, -1 and null in step_bench's JSON, rather than reading as an idle GPU.)
  if (cuda_ && device_events > 0) {
    busy_share_ = busy_ns / 1e9 / std::max(wall_s, 1e-12);
    compute_share_ = computing_ns / 1e9 / std::max(wall_s, 1e-12);
  }
  const double step_ms = wall_s * 1e3 / steps;
  std::string s = fmt::format("{}: {} profiled step(s), {:.2f} ms a step", label, steps, step_ms);
  if (cuda_ && device_events > 0)
    s += fmt::format("; device: {:.1f} kernels and copies a step, busy {:.1f} ms a step = {:.1f}% of the step",
                     static_cast<double>(device_events) / steps, busy_ns / 1e6 / steps, 100 * busy_share_);
  else if (cuda_)
    s += "; no device activity recorded (CUPTI delivered none): the busy share is unknown";
  s += fmt::format("{}\n", trace_path.empty() ? "" : "; trace " + trace_path);
  if (cuda_) s += fmt::format("{} top device kernels:\n{}", label, top(kernels, 12, steps, label));
  s += fmt::format("{} accel's scopes (inclusive):\n{}", label, top(scopes, 10, steps, label));
  s += fmt::format("{} top host ops (inclusive):\n{}", label, top(host, 12, steps, label));
  return s;
}

}  // namespace accel::bench
