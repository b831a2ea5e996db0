// Value formatting and the tracker registry (tracker.h).
#include "tracking/tracker.h"
#include "base/error.h"

#include "base/edit_distance.h"
#include "tracking/builtin.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <stdexcept>

namespace accel::tracking {

double Value::number() const { return kind_ == Kind::Text ? std::numeric_limits<double>::quiet_NaN() : number_; }

std::string Value::to_string() const {
  switch (kind_) {
    case Kind::Text: return text_;
    case Kind::Bool: return number_ != 0 ? "true" : "false";
    case Kind::Number: break;
  }
  return format_number(number_);
}

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // The shortest text that reads back as the same double (0.1 stays "0.1").
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, TrackerInfo>& registry() {
  static std::map<std::string, TrackerInfo> r = [] {
    std::map<std::string, TrackerInfo> m;
    m["tensorboard"] = {make_tensorboard_tracker, true};
    m["jsonl"] = {make_jsonl_tracker, true};
    m["csv"] = {make_csv_tracker, true};
    return m;
  }();
  return r;
}

}  // namespace

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Close means at most a third of the name's letters (at least 2) differ.
  return best_d <= std::max<std::size_t>(2, name.size() / 3) ? best : std::string();
}

void register_tracker(const std::string& name, TrackerInfo info) {
  if (name.empty() || name == "all")
    throw accel::InvalidArgumentError("register_tracker: '" + name + "' cannot name a tracker");
  if (!info.make) throw accel::InvalidArgumentError("register_tracker: '" + name + "' has no factory");
  std::lock_guard lock(registry_mutex());
  registry()[name] = std::move(info);
}

std::vector<std::string> tracker_names() {
  std::lock_guard lock(registry_mutex());
  std::vector<std::string> out;
  for (const auto& [n, info] : registry()) out.push_back(n);
  return out;
}

std::vector<std::string> builtin_tracker_names() { return {"tensorboard", "jsonl", "csv"}; }

const TrackerInfo& tracker_info(const std::string& name) {
  {
    std::lock_guard lock(registry_mutex());
    auto it = registry().find(name);
    if (it != registry().end()) return it->second;
  }
  std::vector<std::string> names = tracker_names();
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  const std::string near = closest_name(name, names);
  throw accel::InvalidArgumentError(
      "unknown tracker '" + name + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
      "; known trackers: " + known + ", or \"all\" (register your own with accel::tracking::register_tracker)");
}

std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : list + ",") {
    if (c == ',' || c == ' ' || c == '\t') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

}  // namespace accel::tracking
