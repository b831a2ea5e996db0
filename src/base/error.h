// accel::Error — the base of every exception accel throws: `catch (const accel::Error& e)` catches
// all of them, and e.what() says what went wrong. Each concrete type also derives from the standard
// exception it names (std::invalid_argument, std::runtime_error, std::logic_error, std::out_of_range),
// so a handler written for those keeps working. The layers' own types derive from these:
//   InvalidArgumentError  bad input: a value, a file's contents, an unsupported combination
//                         (ConfigError, EstimateError, LaunchError, comm::InvalidArgument, ...)
//   RuntimeError          a fault while running: I/O, a peer, the OS, a numeric state
//                         (CheckpointError, comm::CommError and its TimeoutError, SafetensorsError, ...)
//   LogicError            calls in an order the API does not allow (and InternalError, a bug in accel)
//   OutOfRangeError       an index or a name that does not exist
#pragma once

#include <stdexcept>

namespace accel {

class Error {
 public:
  virtual ~Error() = default;
  virtual const char* what() const noexcept = 0;
};

class InvalidArgumentError : public std::invalid_argument, public Error {
 public:
  using std::invalid_argument::invalid_argument;
  const char* what() const noexcept override { return std::invalid_argument::what(); }
};

class RuntimeError : public std::runtime_error, public Error {
 public:
  using std::runtime_error::runtime_error;
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

class LogicError : public std::logic_error, public Error {
 public:
  using std::logic_error::logic_error;
  const char* what() const noexcept override { return std::logic_error::what(); }
};

class OutOfRangeError : public std::out_of_range, public Error {
 public:
  using std::out_of_range::out_of_range;
  const char* what() const noexcept override { return std::out_of_range::what(); }
};

}  // namespace accel
