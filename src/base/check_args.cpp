#include "base/check_args.h"

#include "base/env.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace accel::check_args {
namespace {
std::string file(const char* suffix) {
  return env::get("ACCEL_CHECK_ARGS") + "/" + std::to_string(static_cast<long long>(::getpid())) + suffix;
}
}  // namespace

bool active() { return !env::get("ACCEL_CHECK_ARGS").empty(); }

void started(int argc, char** argv) {
  if (!active()) return;
  std::remove(file(".ok").c_str());  // (an earlier process of this pid passed; this one has not yet)
  std::ofstream out(file(".start"));
  for (int i = 0; i < argc; ++i) out << argv[i] << '\n';
}

void passed() {
  if (!active()) return;
  std::ofstream(file(".ok")) << "ok\n";
}

void stop_here(const char* program) {
  if (!active()) return;
  passed();
  std::fprintf(stderr, "%s: arguments checked (ACCEL_CHECK_ARGS); stopping before any work\n", program);
  std::fflush(nullptr);
  std::exit(0);
}

}  // namespace accel::check_args
