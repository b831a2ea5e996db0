// What a call throws, for tests that check messages: E's what(); "" when it throws nothing; and
// "wrong exception type: <what>" when it throws another std::exception, so that no test can mistake
// one error for another.
#pragma once

#include <exception>
#include <string>

namespace accel::test {

template <class E = std::exception, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    if (dynamic_cast<const E*>(&e)) return e.what();
    return std::string("wrong exception type: ") + e.what();
  }
  return "";
}

}  // namespace accel::test
