// accel::tracking — experiment trackers in Accelerate's shape (GeneralTracker): a Tracker receives the
// run's configuration once and a record of named values per log() call. Built in: "tensorboard"
// (event files the tensorboard package reads), "jsonl" and "csv" (one flushed record per call). A
// program adds its own by implementing Tracker and either passing the object to
// AcceleratorOptions::log_with or registering a factory under a name (register_tracker).
//
// This layer knows nothing of torch or of ranks: the Accelerator decides which process calls what
// (main_process_only) and turns tensors into plain numbers before they get here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel::tracking {

// One logged or configured value: a number, a boolean or a text. Built implicitly from any
// arithmetic type, a string or a string literal, so `{{"loss", 0.5}, {"step", 3}, {"opt", "adamw"}}`
// is a Values list.
class Value {
 public:
  enum class Kind { Number, Bool, Text };
  template <class T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Value(T v) : kind_(Kind::Number), number_(static_cast<double>(v)) {}  // NOLINT(implicit)
  Value(bool b) : kind_(Kind::Bool), number_(b ? 1 : 0) {}              // NOLINT(implicit)
  Value(std::string s) : kind_(Kind::Text), text_(std::move(s)) {}      // NOLINT(implicit)
  Value(const char* s) : kind_(Kind::Text), text_(s) {}                 // NOLINT(implicit)

  Kind kind() const { return kind_; }
  bool is_text() const { return kind_ == Kind::Text; }
  // Numbers and booleans (1/0); NaN for a text.
  double number() const;
  const std::string& text() const { return text_; }
  // How it reads in a text file: a number round-trips (%.17g, shortest form), "true"/"false", the text.
  std::string to_string() const;
  bool operator==(const Value& o) const = default;

 private:
  Kind kind_;
  double number_ = 0;
  std::string text_;
};

// Named values in the caller's order (files keep it: CSV columns, JSONL keys). Names are unique.
using Values = std::vector<std::pair<std::string, Value>>;

// What a tracker is built with (Accelerate: run_name, logging_dir, **init_kwargs).
struct TrackerContext {
  std::string project_name;
  std::string logging_dir;                    // <project_dir>/<project_name>; "" when no project_dir was given
  std::map<std::string, std::string> kwargs;  // init_kwargs[<tracker name>]
  int process_index = 0;                      // for trackers that run on every process
  // >= 0: the run resumes after this step (init_trackers after load_state): a tracker writing files
  // keeps what an earlier run logged up to it and drops the rest; -1: a new run.
  std::int64_t resume_after = -1;
};

class Tracker {
 public:
  virtual ~Tracker() = default;
  virtual std::string name() const = 0;
  // Needs TrackerContext::logging_dir (the Accelerator refuses to build it without project_dir).
  virtual bool requires_logging_directory() const { return false; }
  // Only the main process calls it (Accelerate's default); false: every process does.
  virtual bool main_process_only() const { return true; }
  // Opens files / connections. Throws (naming the path) when it cannot.
  virtual void start() {}
  // The run's hyperparameters, once, after start().
  virtual void store_init_configuration(const Values& config) { (void)config; }
  // One record. `step`: the x-axis value (the Accelerator passes its optimizer step when not given).
  virtual void log(const Values& values, std::int64_t step) = 0;
  // A distribution (e.g. a tensor's elements); trackers without histograms ignore it.
  virtual void log_histogram(const std::string& tag, const std::vector<double>& values, std::int64_t step) {
    (void)tag, (void)values, (void)step;
  }
  // The run continues after `step` (load_state after start()): as TrackerContext::resume_after says,
  // for a tracker that has not logged in this run yet.
  virtual void resume(std::int64_t step) { (void)step; }
  // Flushes and closes; nothing is written afterwards. Called once by Accelerator::end_training.
  virtual void finish() {}
};

// --- the registry: names -> factories --------------------------------------------------------------

using TrackerFactory = std::function<std::unique_ptr<Tracker>(const TrackerContext&)>;

struct TrackerInfo {
  TrackerFactory make;
  bool requires_logging_directory = false;  // checked before anything is built
};

// Adds (or replaces) a tracker under `name`; AcceleratorOptions::log_with may then name it.
// Throws std::invalid_argument for an empty name or "all".
void register_tracker(const std::string& name, TrackerInfo info);
// Every registered name, sorted (the built-ins: csv, jsonl, tensorboard).
std::vector<std::string> tracker_names();
// The built-in names "all" stands for.
std::vector<std::string> builtin_tracker_names();
// The registration of `name`; throws std::invalid_argument naming the known trackers (and the
// closest one: "did you mean") when there is none.
const TrackerInfo& tracker_info(const std::string& name);

// One entry of AcceleratorOptions::log_with: a registered name ("all": every built-in one) or an
// object the program built itself.
struct LogWith {
  LogWith(std::string n) : name(std::move(n)) {}  // NOLINT(implicit)
  LogWith(const char* n) : name(n) {}             // NOLINT(implicit)
  template <class T, std::enable_if_t<std::is_base_of_v<Tracker, T>, int> = 0>
  LogWith(std::shared_ptr<T> t) : tracker(std::move(t)) {}  // NOLINT(implicit)
  std::string name;
  std::shared_ptr<Tracker> tracker;
};

// "tensorboard,jsonl" or "tensorboard jsonl" -> {"tensorboard", "jsonl"} (empty parts dropped).
std::vector<std::string> split_names(const std::string& list);

}  // namespace accel::tracking
