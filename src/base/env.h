// accel::env — the one table of ACCEL_* environment variables: each declared once, with its default
// and meaning. `accel env` prints the table with the values in force.
#pragma once

#include <string>
#include <vector>

namespace accel::env {

struct Variable {
  const char* name;
  const char* default_value;  // "" = unset
  const char* meaning;
};

// Every ACCEL_* variable accel reads.
const std::vector<Variable>& table();

// The value in force: the environment's, else the table's default. Throws std::invalid_argument for
// a name not in the table (a bug), or naming the variable when an integer/number does not parse.
std::string get(const char* name);
long long get_int(const char* name);
double get_double(const char* name);
bool is_set(const char* name);

}  // namespace accel::env
