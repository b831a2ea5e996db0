// accel::Error is the base of what the library throws: failures from several layers' public calls,
// caught as accel::Error (with their message), and as the standard exception each also is.
#include "accelerator/config.h"
#include "base/check.h"
#include "base/env.h"
#include "base/error.h"
#include "checkpoint/safetensors.h"
#include "sharding/shard_layout.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace accel {
namespace {

// What `f` throws, caught as accel::Error: its message; "" when it throws nothing or something else.
std::string accel_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string("accel::Error: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("not an accel::Error: ") + e.what();
  }
  return "nothing thrown";
}

TEST(Errors, EveryLayerThrowsAnAccelError) {
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"a bad config (ConfigError)", [] { parse_accelerate_yaml("distributed_type: NOPE\n", "bad.yaml"); }},
      {"a missing config file", [] { load_config_file("/nonexistent/accel.yaml"); }},
      {"a missing safetensors file (SafetensorsError)", [] { checkpoint::SafetensorsFile::open("/nonexistent.st"); }},
      {"an env value that does not parse",
       [] {
         setenv("ACCEL_COMM_TIMEOUT_S", "soon", 1);
         try {
           env::get_int("ACCEL_COMM_TIMEOUT_S");
         } catch (...) {
           unsetenv("ACCEL_COMM_TIMEOUT_S");
           throw;
         }
         unsetenv("ACCEL_COMM_TIMEOUT_S");
       }},
      {"a shard layout over no ranks", [] { sharding::ShardLayout({4}, 0, 1); }},
      {"a failed internal check (InternalError)", [] { ACCEL_CHECK(1 + 1 == 3, "arithmetic"); }},
  };
  for (const auto& [what, call] : calls) {
    const std::string got = accel_error_of(call);
    EXPECT_EQ(got.rfind("accel::Error: ", 0), 0u) << what << ": " << got;
    EXPECT_GT(got.size(), std::string("accel::Error: ").size() + 10) << what << ": the message says what went wrong";
  }
}

TEST(Errors, EachIsAlsoTheStandardExceptionItNames) {
  EXPECT_THROW(parse_accelerate_yaml("distributed_type: NOPE\n", "bad.yaml"), std::invalid_argument);
  EXPECT_THROW(parse_accelerate_yaml("distributed_type: NOPE\n", "bad.yaml"), ConfigError);
  EXPECT_THROW(ACCEL_CHECK(false, "x"), std::logic_error);
  try {
    throw RuntimeError("disk full");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk full");
    EXPECT_NE(dynamic_cast<const Error*>(&e), nullptr);
  }
}

}  // namespace
}  // namespace accel
