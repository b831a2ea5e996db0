// What the built-in trackers share: their directory, their options, the config file (builtin.h).
#include "base/error.h"
#include "tracking/builtin.h"

#include "base/files.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace accel::tracking {

// (POSIX calls through base/files.h: std::filesystem is unsafe in processes linked with libtorch.)
void make_logging_dir(const std::string& dir, const std::string& tracker) {
  try {
    files::make_dirs(dir);
  } catch (const std::exception& e) {
    throw accel::RuntimeError("tracker '" + tracker + "': cannot create the logging directory " + dir + " (" +
                              e.what() +
                              "); choose a writable AcceleratorOptions::project_dir (project_dir in the config file)");
  }
  if (!files::is_dir(dir))
    throw accel::RuntimeError("tracker '" + tracker + "': cannot create the logging directory " + dir +
                              " (a file is in the way); choose a writable AcceleratorOptions::project_dir (project_dir "
                              "in the config file)");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw accel::RuntimeError("tracker '" + tracker + "': the logging directory " + dir +
                              " is not writable; choose a writable AcceleratorOptions::project_dir (project_dir in "
                              "the config file)");
}

void check_kwargs(const TrackerContext& ctx, const std::string& tracker, const std::vector<std::string>& allowed) {
  for (const auto& [k, v] : ctx.kwargs) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == k;
    if (ok) continue;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw accel::InvalidArgumentError("init_kwargs for tracker '" + tracker + "': unknown option '" + k + "'" +
                                      (list.empty() ? std::string(" (it takes none)") : "; its options: " + list));
  }
}

void write_config_json(const std::string& dir, const Values& config) {
  const std::string text = config_json(config);
  files::write_file_atomic(dir + "/config.json", text.data(), text.size());
}

std::string config_json(const Values& config) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : config) {
    switch (v.kind()) {
      case Value::Kind::Text: j[k] = v.text(); break;
      case Value::Kind::Bool: j[k] = v.number() != 0; break;
      case Value::Kind::Number:
        if (std::isfinite(v.number()))
          j[k] = v.number();
        else
          j[k] = nullptr;
        break;
    }
  }
  return j.dump(2) + "\n";
}

double wall_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace accel::tracking
