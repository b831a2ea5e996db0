// ACCEL_CHECK — the one way the library states an invariant. A failed check is a bug in accel (not a
// fault the caller can handle): it throws accel::InternalError, whose message names the file:line,
// the condition and, for the comparing forms, both values.
//
//   ACCEL_CHECK(grad_full_.defined(), "FlatParam {}: no gradient buffer", name_);
//   ACCEL_CHECK_EQ(a.numel(), b.numel(), "flat {}", name);   // "... (a.numel() == b.numel(): 12 vs 16)"
//
// Faults a caller can handle (bad config, timeout, a lost peer, misuse of an API) throw their own
// exception types instead.
#pragma once

#include "base/error.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace accel {

class InternalError : public accel::LogicError {
 public:
  using accel::LogicError::LogicError;
};

namespace detail {
[[noreturn]] inline void check_failed(const char* file, int line, const std::string& what, const std::string& message) {
  throw InternalError(fmt::format("accel internal error at {}:{}: {}{}{} (please report this)", file, line, message,
                                  message.empty() ? "" : " ", what));
}
}  // namespace detail

}  // namespace accel

#define ACCEL_CHECK(cond, ...)                                                                                 \
  do {                                                                                                         \
    if (!(cond)) ::accel::detail::check_failed(__FILE__, __LINE__, "(" #cond ")", ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define ACCEL_CHECK_OP_(a, b, op, ...)                                                                            \
  do {                                                                                                            \
    const auto& accel_check_a_ = (a);                                                                             \
    const auto& accel_check_b_ = (b);                                                                             \
    if (!(accel_check_a_ op accel_check_b_))                                                                      \
      ::accel::detail::check_failed(                                                                              \
          __FILE__, __LINE__, ::fmt::format("(" #a " " #op " " #b ": {} vs {})", accel_check_a_, accel_check_b_), \
          ::fmt::format(__VA_ARGS__));                                                                            \
  } while (0)
#define ACCEL_CHECK_EQ(a, b, ...) ACCEL_CHECK_OP_(a, b, ==, __VA_ARGS__)
