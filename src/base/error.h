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

// One of the standard exceptions that is also an accel::Error (what() answers for both).
template <class Std>
class StdError : public Std, public Error {
 public:
  using Std::Std;
  const char* what() const noexcept override { return Std::what(); }
};

using InvalidArgumentError = StdError<std::invalid_argument>;
using RuntimeError = StdError<std::runtime_error>;
using LogicError = StdError<std::logic_error>;
using OutOfRangeError = StdError<std::out_of_range>;

}  // namespace accel
