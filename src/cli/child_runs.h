// Child processes that `accel bench` and `accel tune` run one after another (each an `accel launch`):
// output captured, stderr into a log, and the signals a sweep receives passed on to the running child.
#pragma once

#include <csignal>
#include <string>
#include <utility>
#include <vector>

namespace accel::cli {

// An executable regular file.
bool runnable(const std::string& path);

// Installs the handler for SIGINT, SIGTERM and SIGHUP. As in `accel launch`: a Ctrl-C from the
// terminal reaches the whole foreground process group (the running child included, which stops its
// ranks), so it is not passed on again; a signal sent to this process alone (kill, a scheduler) is
// passed on to the running child. Either way interrupted() says so, and the sweep stops after that run.
void pass_signals_to_children();
// The signal that interrupted the sweep, or 0.
int interrupted();

// Runs argv (with `env` added to the environment) with stdout captured into `out` and stderr written
// to `log` (then stdout appended to it); returns the exit code (128 + signal when killed by one).
// Throws accel::RuntimeError when the process cannot be started.
int run_captured(const std::vector<std::string>& argv, const std::string& log, std::string& out,
                 const std::vector<std::pair<std::string, std::string>>& env = {});

// The last n lines of a log, indented, without Open MPI's notices (the blocks between lines of dashes
// that mpirun prints when a rank fails), which would push the rank's own message out of view; when no
// rank said anything (only the launcher's lines are left), the last notice is kept.
std::string tail_lines(const std::string& path, std::size_t n);

}  // namespace accel::cli
