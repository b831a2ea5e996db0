#include "checkpoint/checkpoint_dir.h"

#include "base/env.h"
#include "base/files.h"
#include "checkpoint/sharded_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace accel::checkpoint {
namespace {

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// Every rank learns whether rank 0's filesystem step worked.
void agree_on_root(comm::Communicator& world, const std::string& error) {
  at::Tensor flag = at::full({1}, error.empty() ? 0 : 1, at::kInt);
  if (world.size() > 1) world.broadcast(flag, {0});
  if (!error.empty()) throw CheckpointError(error);
  if (flag.item<int>())
    throw CheckpointError("rank 0 could not prepare the checkpoint directory (its message says why)");
}

}  // namespace

void save_atomically(const std::string& final_in, comm::Communicator& world,
                     const std::function<void(const std::string&)>& write) {
  const std::string final_dir = strip_slashes(final_in);
  const std::string partial = final_dir + ".partial";
  std::string error;
  if (world.rank() == 0) {
    try {
      files::make_dirs(files::parent_dir(final_dir));
      files::remove_tree(partial);  // what a crashed save left behind
      if (::mkdir(partial.c_str(), 0755) != 0)
        throw CheckpointError(fmt::format("cannot create {}: {}", partial, std::strerror(errno)));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on_root(world, error);
  write(partial);  // collective; throws on every rank when any rank failed
  // A test hook: a pause between "everything written" and "published" (kill-during-save tests).
  if (const long long ms = env::get_int("ACCEL_CHECKPOINT_PAUSE_MS"); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (world.rank() == 0) {
    try {
      files::sync_dir(partial);
      if (files::exists(final_dir)) {
        // Swap in one step where the filesystem can; otherwise move the old one aside first.
        if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
          files::remove_tree(partial);  // now the previous checkpoint
        } else {
          const std::string old = final_dir + ".old";
          files::remove_tree(old);
          if (::rename(final_dir.c_str(), old.c_str()) != 0 || ::rename(partial.c_str(), final_dir.c_str()) != 0)
            throw CheckpointError(fmt::format("cannot move {} to {}: {}", partial, final_dir, std::strerror(errno)));
          files::remove_tree(old);
        }
      } else if (::rename(partial.c_str(), final_dir.c_str()) != 0) {
        throw CheckpointError(fmt::format("cannot move {} to {}: {}", partial, final_dir, std::strerror(errno)));
      }
      files::sync_dir(files::parent_dir(final_dir));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on_root(world, error);
}

std::vector<std::pair<int, std::string>> automatic_checkpoints(const std::string& project_dir) {
  std::vector<std::pair<int, std::string>> out;
  const std::string root = strip_slashes(project_dir) + "/checkpoints";
  DIR* d = ::opendir(root.c_str());
  if (!d) return out;
  const std::string prefix = "checkpoint_";
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind(prefix, 0) != 0 || n.size() == prefix.size()) continue;
    const std::string digits = n.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    out.emplace_back(std::stoi(digits), root + "/" + n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string next_automatic_dir(const std::string& project_dir) {
  const auto existing = automatic_checkpoints(project_dir);
  const int next = existing.empty() ? 0 : existing.back().first + 1;
  return fmt::format("{}/checkpoints/checkpoint_{}", strip_slashes(project_dir), next);
}

void apply_total_limit(const std::string& project_dir, int total_limit) {
  if (total_limit < 1) return;
  auto existing = automatic_checkpoints(project_dir);
  while (static_cast<int>(existing.size()) > total_limit) {
    files::remove_tree(existing.front().second);
    existing.erase(existing.begin());
  }
}

}  // namespace accel::checkpoint
