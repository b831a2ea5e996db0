// Private text helpers of the config readers (not installed): case and whitespace, "did you mean",
// enum matching, numbers and booleans from text, and the one shape of every config error message:
// "WHERE: KEY is 'VALUE', expected WHAT" (or "WHERE: KEY: ..."), where WHERE is the file (or
// "ACCEL_X (environment)" / "argument") and KEY the dotted path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace accel::config_detail {

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");
std::string lower(std::string s);
std::string upper(std::string s);
std::string trim(const std::string& s);

// Throws ConfigError("WHERE: MESSAGE").
[[noreturn]] void fail(const std::string& where, const std::string& message);
// "WHERE: KEY is 'VALUE', expected EXPECTED"
[[noreturn]] void fail_value(const std::string& where, const std::string& key, const std::string& value,
                             const std::string& expected);
// "WHERE: unknown key 'PATH'; did you mean 'X'? (valid keys: ...)"
[[noreturn]] void fail_unknown_key(const std::string& where, const std::string& path,
                                   const std::vector<std::string>& valid);
// Case-insensitive match of `value` against `allowed`; returns the allowed spelling, or throws
// "WHERE: KEY is 'VALUE'; did you mean 'X'? allowed values: ...".
std::string match_enum(const std::string& where, const std::string& key, const std::string& value,
                       const std::vector<std::string>& allowed);

// Text to value. Integers accept "12", "5e8", "1e8", "12.0" (any finite number with no fraction);
// nullopt for "1.5", "two", "". Booleans: true/false/yes/no/on/off (any case), plus 1/0 when
// `digits` (environment values).
std::optional<std::int64_t> parse_integer(const std::string& text);
std::optional<double> parse_number(const std::string& text);
std::optional<bool> parse_bool(const std::string& text, bool digits = false);

}  // namespace accel::config_detail
