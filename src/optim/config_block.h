// accel::optim::ConfigBlock — a DeepSpeed config's "optimizer" or "scheduler" block as the file wrote
// it: {"type": NAME, "params": {KEY: VALUE, ...}}. Torch- and JSON-free: AcceleratorConfig carries it,
// and from_config.h checks it when the file is read and builds it when the program asks.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace accel::optim {

// A value of "params": "auto", a boolean, a number, a list of numbers, or another string.
struct ConfigValue {
  enum class Kind { Auto, Bool, Number, Numbers, String };
  Kind kind = Kind::Number;
  bool flag = false;
  double number = 0;
  std::vector<double> numbers;
  std::string text;  // as written, for messages (every kind)
};

struct ConfigBlock {
  std::string name;                                         // "optimizer" | "scheduler": the block's key, for messages
  std::string type;                                         // as written ("AdamW", "WarmupLR", ...)
  std::vector<std::pair<std::string, ConfigValue>> params;  // in file order
};

}  // namespace accel::optim
