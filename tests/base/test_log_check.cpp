// accel::log (the level names ACCEL_LOG_LEVEL takes, the default in force) and ACCEL_CHECK (what a
// failed invariant says).
#include "base/check.h"
#include "base/log.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

using accel::log::Level;

TEST(Log, LevelNamesParseInAnyCase) {
  EXPECT_EQ(accel::log::parse_level("trace"), Level::Trace);
  EXPECT_EQ(accel::log::parse_level("DEBUG"), Level::Debug);
  EXPECT_EQ(accel::log::parse_level("Info"), Level::Info);
  EXPECT_EQ(accel::log::parse_level("warning"), Level::Warning);
  EXPECT_EQ(accel::log::parse_level("warn"), Level::Warning);
  EXPECT_EQ(accel::log::parse_level("error"), Level::Error);
  EXPECT_EQ(accel::log::parse_level("critical"), Level::Critical);
  EXPECT_EQ(accel::log::parse_level("off"), Level::Off);
  try {
    accel::log::parse_level("loud");
    FAIL() << "no error for an unknown level";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "ACCEL_LOG_LEVEL='loud' is not one of trace, debug, info, warning, error, critical, off");
  }
}

TEST(Log, DefaultLevelIsWarning) {
  if (std::getenv("ACCEL_LOG_LEVEL")) GTEST_SKIP() << "ACCEL_LOG_LEVEL is set";
  EXPECT_TRUE(accel::log::enabled(Level::Error));
  EXPECT_TRUE(accel::log::enabled(Level::Warning));
  EXPECT_FALSE(accel::log::enabled(Level::Info));
  EXPECT_FALSE(accel::log::enabled(Level::Debug));
}

TEST(Check, PassingChecksDoNothing) {
  EXPECT_NO_THROW(ACCEL_CHECK(1 + 1 == 2, "arithmetic"));
  EXPECT_NO_THROW(ACCEL_CHECK_EQ(4, 2 * 2, "arithmetic"));
}

TEST(Check, AFailedCheckNamesFileLineConditionAndValues) {
  const int line = __LINE__ + 2;
  try {
    ACCEL_CHECK_EQ(3, 1 + 1, "flat {}", "blocks.0");
    FAIL() << "no throw";
  } catch (const accel::InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test_log_check.cpp:" + std::to_string(line)), std::string::npos) << what;
    EXPECT_NE(what.find("flat blocks.0"), std::string::npos) << what;
    EXPECT_NE(what.find("(3 == 1 + 1: 3 vs 2)"), std::string::npos) << what;
  }
  try {
    ACCEL_CHECK(false, "plain {}", 7);
    FAIL() << "no throw";
  } catch (const std::logic_error& e) {  // InternalError is a logic_error
    EXPECT_NE(std::string(e.what()).find("plain 7 (false)"), std::string::npos) << e.what();
  }
}

}  // namespace
