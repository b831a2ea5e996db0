// The one table of configuration keys, for both dialects: the Accelerate-style YAML
// (config_yaml.cpp) and the DeepSpeed JSON (config_deepspeed.cpp) read their known keys, aliases, types
// and ignored reasons from it; `accel config keys` prints it and docs/configuration.md is generated
// from it (a ctest compares the two).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace accel::config_keys {

enum class Dialect { Accelerate, DeepSpeed };

// The value a key takes. The DeepSpeed reader checks it for every key; the YAML reader checks each key
// it acts on as it reads it (Choice: one of `range`; List: a list, or one comma-separated string).
enum class Type { Bool, Int, Number, String, Choice, List, Object, Any };

struct Key {
  Dialect dialect;
  const char* section;  // the dotted block: "" (top level), "fsdp_config", "zero_optimization.offload_param"
  const char* name;     // the canonical name
  const char* aliases;  // other names the reader takes for it, comma-separated ("" when none)
  Type type;
  const char* default_value;  // what accel uses when the key is absent or null ("" when there is nothing to say)
  const char* range;          // the values allowed beyond the type ("" when any value of the type)
  const char* meaning;        // what accel does with it
  const char* ignored;        // nullptr: accel acts on it; else why it is accepted and ignored
};

// Every key, in the order the documentation lists them (dialect, then section, then the table's order).
const std::vector<Key>& all();
using Keys = std::vector<const Key*>;

// The keys of one block of one dialect, in the table's order.
Keys section(Dialect dialect, const std::string& section);
// The aliases of a key, split.
std::vector<std::string> aliases(const Key& key);
// The key of `keys` written as `written` (its name or one of its aliases), or nullptr.
const Key* find(const Keys& keys, const std::string& written);

const char* dialect_name(Dialect d);  // "accelerate" | "deepspeed"
const char* type_name(Type t);        // "bool", "int", "number", "string", "choice", "list", "object", "any"

// `accel config keys [--dialect D]`: one block per section, a line per key.
std::string text(std::optional<Dialect> only = std::nullopt);
// docs/configuration.md's key tables (the whole generated file).
std::string markdown();

}  // namespace accel::config_keys
