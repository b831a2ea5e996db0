#include "accelerator/tuning.h"

#include "accelerator/config.h"
#include "base/env.h"
#include "base/memory.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace accel {
namespace {

double resident_peak_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

double device_peak_bytes(const c10::Device& d) {
  if (d.is_cpu()) return 0;
  const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<double>(at::accelerator::getDeviceStats(d.index()).allocated_bytes[agg].peak);
}

// The largest value over ranks.
double max_over(comm::Communicator& world, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  world.all_reduce(t, {comm::ReduceOp::Max});
  return t.item<double>();
}

}  // namespace

TuneSpec parse_tune_spec(const std::string& text, const std::string& where) {
  TuneSpec s;
  auto bad = [&](const std::string& part, const std::string& why) {
    throw ConfigError(
        fmt::format("{}: '{}' in '{}' {}; expected probe,report=PATH or "
                    "warmup=W,steps=S,report=PATH[,budget=BYTES]",
                    where, part, text, why));
  };
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, comma - at);
    at = comma + 1;
    if (part.empty()) continue;
    if (part == "probe") {
      s.probe = true;
      continue;
    }
    const std::size_t eq = part.find('=');
    if (eq == std::string::npos) bad(part, "is not KEY=VALUE");
    const std::string key = part.substr(0, eq), value = part.substr(eq + 1);
    if (key == "report") {
      s.report = value;
      continue;
    }
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(v >= 0)) bad(part, "is not a number >= 0");
    if (key == "warmup") {
      if (v < 1) bad(part, "must be >= 1");
      s.warmup = static_cast<int>(v);
    } else if (key == "steps") {
      if (v < 1) bad(part, "must be >= 1");
      s.steps = static_cast<int>(v);
    } else if (key == "budget") {
      s.budget_bytes = v;
    } else {
      bad(part, "has an unknown key");
    }
  }
  if (s.report.empty()) bad(text, "names no report file");
  return s;
}

std::optional<TuneSpec> tune_spec_from_env() {
  if (!env::is_set("ACCEL_TUNE")) return std::nullopt;
  return parse_tune_spec(env::get("ACCEL_TUNE"));
}

TuneRun::TuneRun(TuneSpec spec, std::shared_ptr<comm::Communicator> world, c10::Device device,
                 std::int64_t global_batch, std::int64_t params)
    : spec_(std::move(spec)),
      world_(std::move(world)),
      device_(device),
      global_batch_(global_batch),
      params_(params),
      last_(std::chrono::steady_clock::now()) {}

void TuneRun::end(const std::string& json, int code) {
  if (world_->rank() == 0) {
    std::ofstream(spec_.report, std::ios::app) << json << '\n';
  }
  world_->barrier();
  std::exit(code);  // (MPI is finalized at exit; the shared-memory objects were unlinked when mapped)
}

void TuneRun::after_prepare(std::int64_t micro_batch, std::int64_t accumulation) {
  if (!spec_.probe) return;
  end(fmt::format(R"({{"status": "probe", "params": {}, "micro_batch": {}, "accumulation": {}, "ranks": {}, )"
                  R"("global_batch": {}, "device": "{}"}})",
                  params_, micro_batch, accumulation, world_->size(), global_batch_, device_.str()),
      0);
}

void TuneRun::after_step() {
  // On a device the step ends when its work does, not when the host has queued it (a step whose host
  // never waits would otherwise time as fast as its launches).
  if (!device_.is_cpu()) at::accelerator::synchronizeDevice(device_.index());
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  ++done_;
  if (done_ == spec_.warmup) {  // the measured steps start: their peaks only
    memory::reset_peaks();
    if (!device_.is_cpu()) at::accelerator::resetPeakStats(device_.index());
  }
  if (done_ > spec_.warmup) step_s_.push_back(dt);
  // The budget holds the device's memory on a device, the host's on a CPU run.
  const double rss = max_over(*world_, resident_peak_bytes());
  const double held = device_.is_cpu() ? rss : max_over(*world_, device_peak_bytes(device_));
  if (spec_.budget_bytes > 0 && held > spec_.budget_bytes)
    end(fmt::format(R"({{"status": "over_budget", "step": {}, "peak_rss": {:.0f}, "peak": {:.0f}, "budget": {:.0f}}})",
                    done_, rss, held, spec_.budget_bytes),
        3);
  if (done_ < spec_.warmup + spec_.steps) {
    last_ = std::chrono::steady_clock::now();  // (the all-reduce above is the tuner's, not the step's)
    return;
  }
  std::vector<double> s = step_s_;
  std::sort(s.begin(), s.end());
  const double median = s[s.size() / 2];
  const double counted = max_over(*world_, static_cast<double>(memory::snapshot().total.peak));
  const double dev = max_over(*world_, device_peak_bytes(device_));
  end(fmt::format(R"({{"status": "ok", "step_ms": {:.3f}, "samples_per_s": {:.3f}, "global_batch": {}, )"
                  R"("peak_rss": {:.0f}, "counted_peak": {:.0f}, "device_peak": {:.0f}, "params": {}, "ranks": {}, )"
                  R"("nodes": {}, "steps": {}, "device": "{}"}})",
                  median * 1e3, static_cast<double>(global_batch_) / median, global_batch_, rss, counted, dev, params_,
                  world_->size(), world_->topology().num_nodes, spec_.steps, device_.str()),
      0);
}

}  // namespace accel
