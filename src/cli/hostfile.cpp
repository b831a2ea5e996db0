#include "cli/hostfile.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace accel::cli {
namespace {

bool parse_positive(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  out = std::stoi(s);
  return out > 0;
}

}  // namespace

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  auto fail = [&](const std::string& what) {
    throw HostfileError("hostfile " + source + ", line " + std::to_string(number) + ": " + what);
  };
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;  // blank or comment
    HostSlots h{host, 0};
    while (words >> word) {
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : word.substr(eq + 1);
      if (key == "slots") {
        if (!parse_positive(value, h.slots)) fail("slots must be a positive integer, got '" + word + "'");
      } else if (key == "max_slots") {
        int ignored = 0;
        if (!parse_positive(value, ignored)) fail("max_slots must be a positive integer, got '" + word + "'");
      } else {
        fail("unknown entry '" + word + "' after host '" + host + "' (expected slots=N)");
      }
    }
    if (h.slots == 0) fail("host '" + host + "' has no slots=N (the number of ranks it may run)");
    if (!seen.insert(host).second) fail("host '" + host + "' is listed twice");
    hosts.push_back(h);
  }
  if (hosts.empty()) throw HostfileError("hostfile " + source + " lists no hosts (expected lines like 'node1 slots=4')");
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw HostfileError("cannot read hostfile " + path + ": " + std::strerror(errno));
  std::stringstream text;
  text << f.rdbuf();
  return parse_hostfile(text.str(), path);
}

}  // namespace accel::cli
