// Helpers shared by the config tests (test_config_yaml.cpp, test_config_deepspeed.cpp,
// test_config.cpp): parse shortcuts, error capture, per-process temp files, the launcher environment.
#pragma once

#include "accelerator/config.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::config_test {

#define EXPECT_HAS(msg, part)                                                                \
  do {                                                                                       \
    const std::string m_ = (msg);                                                            \
    EXPECT_NE(m_.find(part), std::string::npos) << "expected '" << (part) << "' in: " << m_; \
  } while (0)

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError thrown>";
}

inline AcceleratorConfig yaml(const std::string& text, const std::string& base = ".") {
  return parse_accelerate_yaml(text, "t.yaml", base);
}
inline std::string yaml_error(const std::string& text, const std::string& base = ".") {
  return error_of([&] { yaml(text, base); });
}
inline AcceleratorConfig ds(const std::string& text) { return parse_deepspeed_json(text, "ds.json"); }
inline std::string ds_error(const std::string& text) {
  return error_of([&] { ds(text); });
}
inline bool ignored(const AcceleratorConfig& c, const std::string& key) {
  int n = 0;
  for (const auto& e : c.ignored) n += e.rfind(key + ":", 0) == 0;
  EXPECT_LE(n, 1) << key << " listed more than once";
  return n == 1;
}
inline std::string ignored_entry(const AcceleratorConfig& c, const std::string& key) {
  for (const auto& e : c.ignored)
    if (e.rfind(key + ":", 0) == 0) return e;
  return "";
}

// A directory of its own for this process (several ranks may run these tests at once). POSIX calls,
// not std::filesystem: libtorch.so exports its own copy of those, and its remove_all crashes.
class TempDir {
 public:
  TempDir() {
    std::string templ = "/tmp/accel_config_test_XXXXXX";
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    for (const auto& f : files_) ::unlink(f.c_str());
    ::rmdir(path_.c_str());
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    files_.push_back(p);
    return p;
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

inline std::string file_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Clears the launcher variables for the test and restores them afterwards.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* n : {"ACCEL_CONFIG_FILE", "ACCEL_MIXED_PRECISION", "ACCEL_GRADIENT_ACCUMULATION_STEPS",
                          "ACCEL_USE_CPU", "ACCEL_ZERO_STAGE", "ACCEL_FSDP_SHARDING_STRATEGY"}) {
      const char* v = std::getenv(n);
      saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(n);
    }
  }
  ~EnvGuard() {
    for (const auto& [n, v] : saved_) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  void unset(const char* name) { ::unsetenv(name); }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

inline std::string source_path(const std::string& rel) { return std::string(ACCEL_SOURCE_DIR) + "/" + rel; }

}  // namespace accel::config_test
