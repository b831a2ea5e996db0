#include "support/python.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

namespace accel::test {

std::pair<int, std::string> run_python(const std::string& python, const std::string& script, const std::string& args) {
  const std::string cmd = "'" + python + "' '" + script + "' " + args + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

bool python_available(const std::string& python) { return !python.empty() && ::access(python.c_str(), X_OK) == 0; }

}  // namespace accel::test
