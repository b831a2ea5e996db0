// Compiled without torch's include path (its bundled fmt would shadow the one Debian's spdlog is
// built against): see the accel_log target in src/CMakeLists.txt.
#include "base/log.h"
#include "base/error.h"

#include "base/env.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace accel::log {
namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::Trace: return spdlog::level::trace;
    case Level::Debug: return spdlog::level::debug;
    case Level::Info: return spdlog::level::info;
    case Level::Warning: return spdlog::level::warn;
    case Level::Error: return spdlog::level::err;
    case Level::Critical: return spdlog::level::critical;
    case Level::Off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

std::string pattern(std::string_view name, const std::string& rank) {
  return "[%Y-%m-%d %H:%M:%S.%e] [" + std::string(name) + rank + "] [%l] %v";
}

// Every logger writes through one sink (so lines of different loggers never interleave mid-line).
// The registry is guarded by its mutex; spdlog loggers are themselves thread-safe.
struct Registry {
  std::mutex mutex;
  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  std::string rank;  // " rank r/n" once known
};

Registry& registry() {
  static Registry r;
  return r;
}

spdlog::logger& named(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.loggers.find(name);
  if (it == r.loggers.end()) {
    auto l = std::make_shared<spdlog::logger>(std::string(name), r.sink);
    l->set_pattern(pattern(name, r.rank));
    l->set_level(to_spdlog(parse_level(env::get("ACCEL_LOG_LEVEL"))));
    l->flush_on(spdlog::level::trace);  // every line reaches the terminal before a crash or an abort
    it = r.loggers.emplace(std::string(name), std::move(l)).first;
  }
  return *it->second;
}

spdlog::logger& logger() {
  static spdlog::logger& lg = named("accel");
  return lg;
}

}  // namespace

Level parse_level(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "trace") return Level::Trace;
  if (t == "debug") return Level::Debug;
  if (t == "info") return Level::Info;
  if (t == "warning" || t == "warn") return Level::Warning;
  if (t == "error") return Level::Error;
  if (t == "critical") return Level::Critical;
  if (t == "off") return Level::Off;
  throw accel::InvalidArgumentError("ACCEL_LOG_LEVEL='" + std::string(text) +
                                    "' is not one of trace, debug, info, warning, error, critical, off");
}

bool enabled(Level level) { return logger().should_log(to_spdlog(level)); }

void write(Level level, std::string_view message) { logger().log(to_spdlog(level), "{}", message); }

void write(std::string_view name, Level level, std::string_view message) {
  named(name).log(to_spdlog(level), "{}", message);
}

bool enabled(std::string_view name, Level level) { return named(name).should_log(to_spdlog(level)); }

void set_level(std::string_view name, Level level) { named(name).set_level(to_spdlog(level)); }

void set_rank(int rank, int world_size) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.rank = " rank " + std::to_string(rank) + "/" + std::to_string(world_size);
  for (auto& [name, l] : r.loggers) l->set_pattern(pattern(name, r.rank));
}

}  // namespace accel::log
