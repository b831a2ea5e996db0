// Accelerator: trackers (Accelerate's log_with, init_trackers, log, get_tracker, end_training) and
// the step metrics accel knows (accelerator.h, "trackers and metrics"). The trackers themselves live
// in src/tracking/, torch-free; this file decides which process runs them and turns tensors and
// counters into plain numbers.
#include "accelerator/accelerator.h"
#include "base/error.h"

#include "base/memory.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <stdexcept>

namespace accel {

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

std::vector<tracking::LogWith> resolve_log_with(const AcceleratorOptions& options, const AcceleratorConfig& cfg) {
  const std::string& project_dir = resolve_project_dir(options, cfg);
  const bool from_config = options.log_with.empty();
  std::vector<tracking::LogWith> given;
  if (from_config)
    for (const auto& n : cfg.log_with) given.emplace_back(n);
  else
    given = options.log_with;
  const std::string where = from_config ? (cfg.source.empty() ? "the configuration" : cfg.source) + ": log_with"
                                        : std::string("AcceleratorOptions::log_with");
  std::vector<tracking::LogWith> expanded;
  for (const auto& w : given) {
    if (w.tracker) {
      expanded.push_back(w);
      continue;
    }
    if (w.name == "all") {
      for (const auto& n : tracking::builtin_tracker_names()) expanded.emplace_back(n);
      continue;
    }
    try {
      tracking::tracker_info(w.name);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(where + ": " + e.what());
    }
    expanded.push_back(w);
  }
  // Each name once ("all" plus a name it covers).
  std::vector<tracking::LogWith> out;
  for (const auto& w : expanded) {
    bool dup = false;
    for (const auto& x : out) dup = dup || (!w.tracker && !x.tracker && x.name == w.name);
    if (!dup) out.push_back(w);
  }
  if (!project_dir.empty()) return out;
  std::vector<std::string> need;
  for (const auto& w : out)
    if (!w.tracker && tracking::tracker_info(w.name).requires_logging_directory) need.push_back(w.name);
  if (!need.empty())
    throw ConfigError(fmt::format(
        "{}: tracker(s) {} write files under <project_dir>/<project_name>, but no project directory is set: set "
        "AcceleratorOptions::project_dir (or project_dir in the config file; the examples' --project_dir)",
        where, joined(need)));
  return out;
}

void Accelerator::check_log_with() {
  log_with_ = resolve_log_with(opts_, cfg_);
  opts_.project_dir = resolve_project_dir(opts_, cfg_);
}

void Accelerator::init_trackers(const std::string& project_name, const tracking::Values& config,
                                const std::map<std::string, std::map<std::string, std::string>>& init_kwargs) {
  if (project_name.empty() || project_name.find_first_of("/\\") != std::string::npos || project_name == "." ||
      project_name == "..")
    throw accel::InvalidArgumentError(fmt::format(
        "Accelerator::init_trackers: '{}' cannot name a run (a non-empty name without slashes)", project_name));
  finish_trackers();
  logging_dir_ = opts_.project_dir.empty() ? std::string() : opts_.project_dir + "/" + project_name;
  for (const auto& [name, kw] : init_kwargs) {
    bool known = false;
    for (const auto& w : log_with_) known = known || (w.tracker ? w.tracker->name() : w.name) == name;
    if (!known)
      throw accel::InvalidArgumentError(fmt::format(
          "Accelerator::init_trackers: init_kwargs names '{}', which is not among the trackers of log_with", name));
  }
  // Build and start on the processes that run each tracker; a failure anywhere fails every rank (the
  // others would otherwise train on towards a collective the failed one never reaches).
  std::string error;
  try {
    for (const auto& w : log_with_) {
      std::shared_ptr<tracking::Tracker> t = w.tracker;
      if (!t) {
        tracking::TrackerContext ctx;
        ctx.project_name = project_name;
        ctx.logging_dir = logging_dir_;
        ctx.process_index = process_index();
        ctx.resume_after = step() > 0 ? step() : -1;  // after load_state: the earlier run's records up to it stay
        if (auto it = init_kwargs.find(w.name); it != init_kwargs.end()) ctx.kwargs = it->second;
        t = tracking::tracker_info(w.name).make(ctx);  // no I/O yet: option errors on every rank
      }
      if (t->main_process_only() && !is_main_process()) continue;
      trackers_.push_back(t);
    }
    for (const auto& t : trackers_) t->start();
    for (const auto& t : trackers_) t->store_init_configuration(config);
  } catch (const std::exception& e) {
    error = e.what();
    trackers_.clear();
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::kInt);
  if (num_processes() > 1) world_->all_reduce(failed);
  if (!error.empty()) throw accel::RuntimeError("Accelerator::init_trackers: " + error);
  if (failed.item<int>() > 0) {
    trackers_.clear();
    throw accel::RuntimeError(
        "Accelerator::init_trackers: a tracker failed to start on another process (its error "
        "is in that process's output)");
  }
}

void Accelerator::log(const tracking::Values& values, std::optional<std::int64_t> step) {
  const std::int64_t s = step.value_or(this->step());
  for (const auto& t : trackers_) t->log(values, s);
}

void Accelerator::log_histogram(const std::string& tag, const at::Tensor& values, std::optional<std::int64_t> step) {
  if (trackers_.empty()) return;
  at::Tensor v = values.detach().to(at::kCPU, at::kDouble).contiguous().view({-1});
  std::vector<double> xs(v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
  const std::int64_t s = step.value_or(this->step());
  for (const auto& t : trackers_) t->log_histogram(tag, xs, s);
}

tracking::Tracker& Accelerator::get_tracker(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& t : trackers_) {
    if (t->name() == name) return *t;
    names.push_back(t->name());
  }
  throw accel::InvalidArgumentError(
      fmt::format("Accelerator::get_tracker: no tracker '{}' on this process (running here: {}){}", name,
                  names.empty() ? std::string("none") : joined(names),
                  is_main_process() ? "" : "; the built-in trackers run on the main process only"));
}

void Accelerator::finish_trackers() {
  auto trackers = std::move(trackers_);
  trackers_.clear();
  std::string error;
  for (const auto& t : trackers) {
    try {
      t->finish();
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) throw accel::RuntimeError("Accelerator: finishing a tracker: " + error);
}

tracking::Values Accelerator::step_metrics(const StepMetricsOptions& o) {
  tracking::Values m;
  const std::int64_t step = this->step();
  m.emplace_back("optimizer_step", step);
  if (o.loss) m.emplace_back("loss", *o.loss);
  if (optimizer_) {
    auto& groups = optimizer_->param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g)
      m.emplace_back(g == 0 ? std::string("lr") : fmt::format("lr/group{}", g), groups[g].options().get_lr());
  }
  if (!std::isnan(state_->last_grad_norm)) m.emplace_back("grad_norm", state_->last_grad_norm);
  if (auto scale = loss_scale()) {
    m.emplace_back("loss_scale", *scale);
    m.emplace_back("skipped_steps", state_->skipped_steps);
  }

  // This rank's communicators, each once (the gather group may be the shard group, which may be
  // the world). Read before this call's own collective, and again after it for the next call's
  // baseline, so the metrics never count their own traffic.
  auto read_counters = [&] {
    std::vector<std::pair<std::string, comm::Counters>> out = {{"world", world_->counters()}};
    if (!engine_) return out;
    auto add = [&](const char* name, const std::shared_ptr<comm::Communicator>& c,
                   std::initializer_list<const comm::Communicator*> seen) {
      if (!c) return;
      for (const auto* s : seen)
        if (c.get() == s) return;
      out.emplace_back(name, c->counters());
    };
    add("shard", engine_->shard_group(), {world_.get()});
    add("replicate", engine_->replicate_group(), {world_.get()});
    add("gather", engine_->gather_group(), {world_.get(), engine_->shard_group().get()});
    return out;
  };
  const auto counters = read_counters();
  const double now = now_s();
  if (metrics_mark_.set && step > metrics_mark_.step) {
    const double steps = static_cast<double>(step - metrics_mark_.step);
    const double dt = (now - metrics_mark_.time) / steps;
    m.emplace_back("step_time_s", dt);
    const std::int64_t samples =
        o.samples_per_step.value_or(micro_batch_ * num_processes() * state_->accumulation_steps);
    if (samples > 0 && dt > 0) {
      m.emplace_back("samples_per_s", samples / dt);
      if (o.tokens_per_sample > 0) m.emplace_back("tokens_per_s", samples * o.tokens_per_sample / dt);
    }
    for (const auto& [name, c] : counters) {
      comm::CollectiveCount before{};
      for (const auto& [n0, c0] : metrics_mark_.counters)
        if (n0 == name) before = c0.total();
      const comm::CollectiveCount now_c = c.total();
      m.emplace_back(fmt::format("comm/{}/sent_bytes_per_step", name),
                     static_cast<double>(now_c.bytes_sent - before.bytes_sent) / steps);
      m.emplace_back(fmt::format("comm/{}/received_bytes_per_step", name),
                     static_cast<double>(now_c.bytes_received - before.bytes_received) / steps);
    }
  }
  const bool new_mark = !metrics_mark_.set || step > metrics_mark_.step;
  if (new_mark) {
    metrics_mark_.set = true;
    metrics_mark_.step = step;
    metrics_mark_.time = now;
  }

  if (o.per_rank_memory && memory::counting_installed()) {
    const memory::Snapshot snap = memory::snapshot();
    constexpr int K = memory::kNumCategories + 1;
    at::Tensor row = at::empty({K}, at::kLong);
    row[0] = snap.total.peak;
    for (int c = 0; c < memory::kNumCategories; ++c) row[c + 1] = snap.by_category[c].peak;
    at::Tensor all = num_processes() > 1 ? gather(row.to(device_)).to(at::kCPU) : row;
    const auto* v = all.data_ptr<std::int64_t>();
    constexpr double MiB = 1024.0 * 1024.0;
    for (int r = 0; r < num_processes(); ++r) {
      m.emplace_back(fmt::format("memory/rank{}/total_peak_mib", r), v[r * K] / MiB);
      for (int c = 0; c < memory::kNumCategories; ++c)
        m.emplace_back(fmt::format("memory/rank{}/{}_peak_mib", r, memory::to_string(static_cast<memory::Category>(c))),
                       v[r * K + c + 1] / MiB);
    }
  }
  if (new_mark) metrics_mark_.counters = read_counters();
  return m;
}

}  // namespace accel
