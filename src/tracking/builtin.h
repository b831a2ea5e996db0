// The built-in trackers' factories and the helpers they share (internal to src/tracking).
#pragma once

#include "tracking/tracker.h"

#include <memory>
#include <string>
#include <vector>

namespace accel::tracking {

std::unique_ptr<Tracker> make_tensorboard_tracker(const TrackerContext& ctx);
std::unique_ptr<Tracker> make_jsonl_tracker(const TrackerContext& ctx);
std::unique_ptr<Tracker> make_csv_tracker(const TrackerContext& ctx);

// A double as text that reads back as the same double ("nan", "inf", "-inf" for the others).
std::string format_number(double v);
// The candidate closest to `name` by edit distance; "" when none is close.
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);
// Creates `dir` and its parents; throws std::runtime_error naming the path (and what to change)
// when it cannot be created or written into.
void make_logging_dir(const std::string& dir, const std::string& tracker);
// Throws std::invalid_argument when `kwargs` holds a key outside `allowed` (naming the tracker).
void check_kwargs(const TrackerContext& ctx, const std::string& tracker, const std::vector<std::string>& allowed);
// The configuration as one JSON object (config.json beside the metrics).
std::string config_json(const Values& config);
// Writes config_json(config) to <dir>/config.json atomically (store_init_configuration).
void write_config_json(const std::string& dir, const Values& config);
// Seconds since the epoch (the wall_time of records).
double wall_time();

}  // namespace accel::tracking
