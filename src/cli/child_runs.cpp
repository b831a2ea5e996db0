#include "cli/child_runs.h"
#include "base/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <stdexcept>

namespace accel::cli {

bool runnable(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

namespace {
volatile pid_t g_child = 0;
volatile sig_atomic_t g_interrupted = 0;

void on_signal(int sig, siginfo_t* info, void*) {
  g_interrupted = sig;
  if (g_child > 0 && info && info->si_code <= 0) kill(g_child, sig);
}
}  // namespace

void pass_signals_to_children() {
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

int interrupted() { return g_interrupted; }

int run_captured(const std::vector<std::string>& argv, const std::string& log, std::string& out,
                 const std::vector<std::pair<std::string, std::string>>& env) {
  int pipefd[2];
  if (pipe(pipefd) != 0) throw accel::RuntimeError(std::string("pipe failed: ") + std::strerror(errno));
  const pid_t child = fork();
  if (child < 0) throw accel::RuntimeError(std::string("fork failed: ") + std::strerror(errno));
  if (child == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, STDERR_FILENO);
    dup2(pipefd[1], STDOUT_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    std::fprintf(stderr, "accel: cannot run %s: %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  g_child = child;
  close(pipefd[1]);
  char buf[4096];
  for (;;) {
    const ssize_t k = read(pipefd[0], buf, sizeof buf);
    if (k > 0) {
      out.append(buf, static_cast<std::size_t>(k));
    } else if (k == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  // The log keeps stdout too, after the launcher's and the ranks' stderr.
  std::ofstream(log, std::ios::app) << out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The last n lines of a log, without Open MPI's notices (the blocks between lines of dashes that
// mpirun prints when a rank fails), which would push the rank's own message out of view. When no rank
// said anything (only the launcher's own lines are left), the last notice is the explanation (mpirun
// refusing root, a bad host, too few slots): it is kept then.
std::string tail_lines(const std::string& path, std::size_t n) {
  std::ifstream in(path);
  std::deque<std::string> last;
  std::vector<std::string> notice, last_notice;
  bool in_notice = false;
  for (std::string line; std::getline(in, line);) {
    if (line.size() >= 20 && line.find_first_not_of('-') == std::string::npos) {
      in_notice = !in_notice;
      if (in_notice)
        notice.clear();
      else
        last_notice = notice;
      continue;
    }
    if (in_notice) {
      notice.push_back(line);
      continue;
    }
    last.push_back(line);
    if (last.size() > n) last.pop_front();
  }
  const bool only_launcher = std::all_of(
      last.begin(), last.end(), [](const std::string& l) { return l.empty() || l.rfind("accel launch:", 0) == 0; });
  std::string out;
  if (only_launcher)
    for (std::size_t i = 0; i < last_notice.size() && i < n; ++i) out += "    " + last_notice[i] + "\n";
  for (const auto& l : last) out += "    " + l + "\n";
  return out;
}

}  // namespace accel::cli
