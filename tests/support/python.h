// Running a Python script from a test (the venv's interpreter, ACCEL_PYTHON, is passed in).
#pragma once

#include <string>
#include <utility>

namespace accel::test {

// Runs `'python' 'script' args 2>&1` through the shell (args as written: quote paths in them) and
// returns the exit status (-1 when the script did not exit normally) and everything it printed.
std::pair<int, std::string> run_python(const std::string& python, const std::string& script, const std::string& args);

// `python` names an executable (an unconfigured ACCEL_PYTHON is empty).
bool python_available(const std::string& python);

}  // namespace accel::test
