#include "cli/hostfile.h"

#include <fmt/format.h>

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
    throw HostfileError(fmt::format("hostfile {}, line {}: {}", source, number, what));
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
        if (!parse_positive(value, h.slots)) fail(fmt::format("slots must be a positive integer, got '{}'", word));
      } else if (key == "max_slots") {
        int ignored = 0;
        if (!parse_positive(value, ignored)) fail(fmt::format("max_slots must be a positive integer, got '{}'", word));
      } else {
        fail(fmt::format("unknown entry '{}' after host '{}' (expected slots=N)", word, host));
      }
    }
    if (h.slots == 0) fail(fmt::format("host '{}' has no slots=N (the number of ranks it may run)", host));
    if (!seen.insert(host).second) fail(fmt::format("host '{}' is listed twice", host));
    hosts.push_back(h);
  }
  if (hosts.empty())
    throw HostfileError(fmt::format("hostfile {} lists no hosts (expected lines like 'node1 slots=4')", source));
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw HostfileError(fmt::format("cannot read hostfile {}: {}", path, std::strerror(errno)));
  std::stringstream text;
  text << f.rdbuf();
  return parse_hostfile(text.str(), path);
}

}  // namespace accel::cli
