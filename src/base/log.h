// accel::log — the library's logger: spdlog underneath, one line per message on stderr, each with the
// rank that wrote it. Level from ACCEL_LOG_LEVEL (trace, debug, info, warning, error, critical, off;
// default warning). The library writes nothing to std::cerr except through here; user-facing
// loggers (Accelerate's get_logger) are built on the same sink.
//
// The header is torch-free and fmt-free: format the message first (fmt::format), then log it. Thread-
// safe (spdlog's _mt sink). Which ranks log is the caller's choice (e.g. only the main process).
#pragma once

#include <string_view>

namespace accel::log {

enum class Level { Trace, Debug, Info, Warning, Error, Critical, Off };

// Whether a message at this level would be written (skip building expensive messages).
bool enabled(Level level);
void write(Level level, std::string_view message);
inline void debug(std::string_view message) { write(Level::Debug, message); }
inline void info(std::string_view message) { write(Level::Info, message); }
inline void warning(std::string_view message) { write(Level::Warning, message); }
inline void error(std::string_view message) { write(Level::Error, message); }

// Named loggers (accel::get_logger, accelerator/logging.h): the same sink and line shape, with the
// name where the library's lines say "accel". Each starts at ACCEL_LOG_LEVEL; set_level changes
// one. Created on first use; the name "accel" is the library's own logger.
void write(std::string_view name, Level level, std::string_view message);
bool enabled(std::string_view name, Level level);
void set_level(std::string_view name, Level level);

// The rank put in every line (of every logger) from now on (the communicator sets it once it knows).
void set_rank(int rank, int world_size);

// "warning" -> Level::Warning (also "warn", any case); throws std::invalid_argument naming the
// allowed values.
Level parse_level(std::string_view text);

}  // namespace accel::log
