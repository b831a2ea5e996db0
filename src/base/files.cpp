#include "base/files.h"
#include "base/error.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::files {

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") remove_tree(path + "/" + n);
      }
      ::closedir(d);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

void make_dirs(const std::string& path) {
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string p = path.substr(0, pos);
    if (p.empty()) continue;
    if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST)
      throw accel::RuntimeError("cannot create directory " + p + ": " + std::strerror(errno));
  }
}

void write_file_synced(const std::string& path, const void* data, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw accel::RuntimeError("cannot create " + path + ": " + std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, p + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw accel::RuntimeError("cannot write " + path + ": " + why);
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw accel::RuntimeError("cannot sync " + path + ": " + std::strerror(errno));
}

void write_file_atomic(const std::string& path, const void* data, std::size_t n) {
  const std::string tmp = path + ".tmp";
  try {
    write_file_synced(tmp, data, n);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw accel::RuntimeError("cannot write " + path + ": " + why);
  }
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw accel::RuntimeError("cannot read " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw accel::RuntimeError("cannot read " + path + ": " + why);
    }
    if (r == 0) break;
    out.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fd);
  return out;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

namespace {
std::size_t extension_dot(const std::string& path) {
  const std::size_t dot = path.rfind('.');
  return dot != std::string::npos && path.find('/', dot) == std::string::npos ? dot : path.size();
}
}  // namespace

std::string without_extension(const std::string& path) { return path.substr(0, extension_dot(path)); }
std::string extension(const std::string& path) { return path.substr(extension_dot(path)); }

std::string working_dir() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string(".");
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string absolute_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

bool is_link(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();  // ("link/" would name what it points to)
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

std::string resolved_path(const std::string& p) {
  // Component by component: while the path so far exists it is resolved through realpath (links),
  // and ".." then goes to the parent of where a link led; past the first missing component, the rest
  // is taken lexically.
  std::string cur = p.empty() || p[0] != '/' ? absolute_path(working_dir()) : "/";
  bool exists = true;
  std::size_t pos = 0;
  while (pos <= p.size()) {
    const std::size_t next = std::min(p.find('/', pos), p.size());
    const std::string c = p.substr(pos, next - pos);
    pos = next + 1;
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      cur = cur == "/" ? cur : parent_dir(cur);
      exists = is_dir(cur);
      continue;
    }
    cur += (cur.back() == '/' ? "" : "/") + c;
    if (!exists) continue;
    char buf[PATH_MAX];
    if (::realpath(cur.c_str(), buf))
      cur = buf;
    else
      exists = false;
  }
  return cur;
}

bool is_within(const std::string& inner, const std::string& outer) {
  const std::string i = resolved_path(inner), o = resolved_path(outer);
  return i == o || (i.size() > o.size() && i.compare(0, o.size(), o) == 0 && (o.back() == '/' || i[o.size()] == '/'));
}

std::string self_exe_path() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw accel::RuntimeError(std::string("cannot read /proc/self/exe: ") + std::strerror(errno));
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace accel::files
