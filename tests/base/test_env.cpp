// accel::env: the table of ACCEL_* variables (each declared once, with a meaning), and get /
// get_int / get_double / is_set: the environment's value, else the table's default; a clear error
// for a name not in the table or a value that does not parse.
#include "base/env.h"
#include "support/errors.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

using accel::test::message_of;

namespace {

// Sets (or, with nullopt, unsets) a variable for the scope, restoring what was there before.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_)
      ::setenv(name_, saved_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

TEST(EnvTable, EveryEntryIsAnAccelVariableDeclaredOnceWithAMeaning) {
  const auto& t = accel::env::table();
  ASSERT_FALSE(t.empty());
  std::set<std::string> names;
  for (const auto& v : t) {
    ASSERT_NE(v.name, nullptr);
    ASSERT_NE(v.default_value, nullptr) << v.name;
    ASSERT_NE(v.meaning, nullptr) << v.name;
    EXPECT_TRUE(std::string_view(v.name).starts_with("ACCEL_")) << v.name;
    EXPECT_GT(std::string_view(v.meaning).size(), 10u) << v.name << " has no meaning written";
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " is declared twice";
  }
  // Variables the README and the launcher document.
  for (const char* documented :
       {"ACCEL_COMM_TIMEOUT_S", "ACCEL_CONFIG_FILE", "ACCEL_MIXED_PRECISION", "ACCEL_RANKS_PER_NODE", "ACCEL_USE_CPU"})
    EXPECT_TRUE(names.count(documented)) << documented << " is not in the table";
}

TEST(EnvGet, TheDefaultWhenUnsetOrEmpty) {
  {
    ScopedEnv unset("ACCEL_COMM_TIMEOUT_S", std::nullopt);
    EXPECT_EQ(accel::env::get("ACCEL_COMM_TIMEOUT_S"), "300");
    EXPECT_EQ(accel::env::get_int("ACCEL_COMM_TIMEOUT_S"), 300);
    EXPECT_DOUBLE_EQ(accel::env::get_double("ACCEL_COMM_TIMEOUT_S"), 300.0);
    EXPECT_FALSE(accel::env::is_set("ACCEL_COMM_TIMEOUT_S"));
  }
  {
    ScopedEnv empty("ACCEL_COMM_TIMEOUT_S", "");  // empty counts as unset
    EXPECT_EQ(accel::env::get("ACCEL_COMM_TIMEOUT_S"), "300");
    EXPECT_FALSE(accel::env::is_set("ACCEL_COMM_TIMEOUT_S"));
  }
  {
    ScopedEnv unset("ACCEL_CONFIG_FILE", std::nullopt);  // no default: ""
    EXPECT_EQ(accel::env::get("ACCEL_CONFIG_FILE"), "");
  }
}

TEST(EnvGet, TheEnvironmentsValueWins) {
  ScopedEnv s("ACCEL_COMM_TIMEOUT_S", "42");
  EXPECT_TRUE(accel::env::is_set("ACCEL_COMM_TIMEOUT_S"));
  EXPECT_EQ(accel::env::get("ACCEL_COMM_TIMEOUT_S"), "42");
  EXPECT_EQ(accel::env::get_int("ACCEL_COMM_TIMEOUT_S"), 42);
  ScopedEnv d("ACCEL_COMM_TIMEOUT_S", "2.5");
  EXPECT_DOUBLE_EQ(accel::env::get_double("ACCEL_COMM_TIMEOUT_S"), 2.5);
  ScopedEnv n("ACCEL_COMM_TIMEOUT_S", "-7");
  EXPECT_EQ(accel::env::get_int("ACCEL_COMM_TIMEOUT_S"), -7);
  ScopedEnv e("ACCEL_COMM_TIMEOUT_S", "1e3");
  EXPECT_DOUBLE_EQ(accel::env::get_double("ACCEL_COMM_TIMEOUT_S"), 1000.0);
}

TEST(EnvGet, ANameNotInTheTableIsABug) {
  const char* name = "ACCEL_NO_SUCH_VARIABLE";
  ScopedEnv s(name, "1");  // even when set
  for (auto msg : {message_of<std::invalid_argument>([&] { accel::env::get(name); }),
                   message_of<std::invalid_argument>([&] { accel::env::get_int(name); }),
                   message_of<std::invalid_argument>([&] { accel::env::get_double(name); }),
                   message_of<std::invalid_argument>([&] { accel::env::is_set(name); })})
    EXPECT_NE(msg.find("ACCEL_NO_SUCH_VARIABLE"), std::string::npos) << "'" << msg << "'";
}

TEST(EnvGet, AValueThatDoesNotParseNamesTheVariableAndTheValue) {
  for (const char* bad : {"abc", "12x", "3.5", " ", "99999999999999999999999"}) {
    ScopedEnv s("ACCEL_COMM_TIMEOUT_S", bad);
    const std::string msg = message_of<std::invalid_argument>([] { accel::env::get_int("ACCEL_COMM_TIMEOUT_S"); });
    EXPECT_NE(msg.find("ACCEL_COMM_TIMEOUT_S"), std::string::npos) << bad << ": '" << msg << "'";
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << bad << ": '" << msg << "'";
  }
  for (const char* bad : {"abc", "1.5s", "--1"}) {
    ScopedEnv s("ACCEL_COMM_TIMEOUT_S", bad);
    const std::string msg = message_of<std::invalid_argument>([] { accel::env::get_double("ACCEL_COMM_TIMEOUT_S"); });
    EXPECT_NE(msg.find("ACCEL_COMM_TIMEOUT_S"), std::string::npos) << bad << ": '" << msg << "'";
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << bad << ": '" << msg << "'";
  }
}

}  // namespace
