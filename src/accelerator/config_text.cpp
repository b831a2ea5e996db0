// The config readers' text helpers (config_text.h) and closest_key (config.h).
#include "accelerator/config_text.h"

#include "accelerator/config.h"
#include "base/edit_distance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace accel {

namespace config_detail {

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

void fail(const std::string& where, const std::string& message) {
  throw ConfigError(fmt::format("{}: {}", where, message));
}

void fail_value(const std::string& where, const std::string& key, const std::string& value,
                const std::string& expected) {
  fail(where, fmt::format("{} is '{}', expected {}", key, value, expected));
}

void fail_unknown_key(const std::string& where, const std::string& path, const std::vector<std::string>& valid) {
  const auto dot = path.rfind('.');
  const std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
  std::string msg = fmt::format("unknown key '{}'", path);
  const std::string near = closest_key(leaf, valid);
  if (!near.empty()) msg += fmt::format("; did you mean '{}'?", near);
  msg += fmt::format(" (valid keys: {})", join(valid));
  fail(where, msg);
}

std::string match_enum(const std::string& where, const std::string& key, const std::string& value,
                       const std::vector<std::string>& allowed) {
  const std::string v = upper(trim(value));
  for (const auto& a : allowed)
    if (upper(a) == v) return a;
  const std::string near = closest_key(value, allowed);
  fail(where, fmt::format("{} is '{}'{} allowed values: {}", key, value,
                          near.empty() ? std::string(";") : fmt::format("; did you mean '{}'?", near), join(allowed)));
}

std::optional<std::int64_t> parse_integer(const std::string& text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (end && *end == '\0' && errno == 0) return static_cast<std::int64_t>(i);
  // 5e8, 1e8, 12.0: a number with no fraction that fits.
  const auto d = parse_number(s);
  if (!d || std::floor(*d) != *d || std::fabs(*d) > 9.2e18) return std::nullopt;
  return static_cast<std::int64_t>(*d);
}

std::optional<double> parse_number(const std::string& text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  // strtod also reads "inf", "nan" and hex; a config number is none of those.
  for (char c : s)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (!end || *end != '\0' || errno != 0 || !std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<bool> parse_bool(const std::string& text, bool digits) {
  const std::string s = lower(trim(text));
  if (s == "true" || s == "yes" || s == "on" || (digits && s == "1")) return true;
  if (s == "false" || s == "no" || s == "off" || (digits && s == "0")) return false;
  return std::nullopt;
}

}  // namespace config_detail

std::string closest_key(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string k = config_detail::lower(key);
  std::string best;
  std::size_t best_score = std::string::npos;
  for (const auto& c : candidates) {
    const std::string l = config_detail::lower(c);
    const std::size_t d = edit_distance(k, l);
    const std::size_t limit = std::max<std::size_t>(2, std::max(k.size(), l.size()) / 3);
    // One name inside the other ("stage" / "zero_stage") is close too, if it is not tiny.
    const bool inside =
        std::min(k.size(), l.size()) >= 4 && (l.find(k) != std::string::npos || k.find(l) != std::string::npos);
    if ((d <= limit || inside) && d < best_score) {
      best = c;
      best_score = d;
    }
  }
  return best;
}

}  // namespace accel
