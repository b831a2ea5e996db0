// accel::get_logger — Accelerate's `get_logger(name)` (accelerate.logging): a logger for training
// scripts that knows the process layout. By default only the main process writes a message
// (main_process_only); with main_process_only = false every rank writes it, and with in_order too
// the ranks write one after another, rank 0 first (a barrier per rank, so every rank must make the
// same in_order call, as in Accelerate).
//
// Lines go to stderr through the library's logger (base/log.h, spdlog), shaped like the library's
// own: `[time] [name rank r/n] [level] message`. The level starts at ACCEL_LOG_LEVEL (default
// warning; `accel env` lists it) unless get_logger is given one.
//
//   auto logger = accel::get_logger("train");
//   logger.info(fmt::format("epoch {} loss {:.4f}", epoch, loss));          // main process only
//   logger.info("my shard is ready", {.main_process_only = false, .in_order = true});
#pragma once

#include "base/log.h"

#include <optional>
#include <string>
#include <string_view>

namespace accel {

struct LogOptions {
  bool main_process_only = true;
  bool in_order = false;  // with main_process_only = false: rank by rank, rank 0 first (collective)
};

class Logger {
 public:
  explicit Logger(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

  void log(log::Level level, std::string_view message, LogOptions options = {}) const;
  void debug(std::string_view message, LogOptions options = {}) const { log(log::Level::Debug, message, options); }
  void info(std::string_view message, LogOptions options = {}) const { log(log::Level::Info, message, options); }
  void warning(std::string_view message, LogOptions options = {}) const { log(log::Level::Warning, message, options); }
  void error(std::string_view message, LogOptions options = {}) const { log(log::Level::Error, message, options); }
  void critical(std::string_view message, LogOptions options = {}) const {
    log(log::Level::Critical, message, options);
  }

  // Whether a message at this level would be written on this process (skip building it otherwise).
  bool enabled(log::Level level) const { return log::enabled(name_, level); }
  void set_level(log::Level level) const { log::set_level(name_, level); }

 private:
  std::string name_;
};

// The logger called `name` (loggers of one name share their level). `level`: set it (else it stays
// at what it was, initially ACCEL_LOG_LEVEL). Uses the world communicator (comm::Communicator::world(),
// a world of one without mpirun) for the process index and in_order's barriers.
Logger get_logger(const std::string& name, std::optional<log::Level> level = std::nullopt);

}  // namespace accel
