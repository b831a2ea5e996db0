// Checkpoint directories: atomic saves, automatic naming, the total limit. POSIX calls only
// (std::filesystem::remove_all crashes in processes linked with libtorch on this toolchain).
//
// Atomic: a save writes into "<dir>.partial" and rank 0 renames it into place once every rank has
// written its part and index.json is on disk (an existing <dir> is swapped out atomically with
// renameat2(RENAME_EXCHANGE), then removed). A crash at any point leaves the previous checkpoint
// complete and loadable; a stale .partial is removed by the next save to the same place.
#pragma once

#include "comm/communicator.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace accel::checkpoint {

// Collective. Runs write(partial_dir) on every rank, then publishes the directory as `final_dir`.
// Throws (on every rank) if any rank's write failed; the previous `final_dir`, if any, is untouched.
void save_atomically(const std::string& final_dir, comm::Communicator& world,
                     const std::function<void(const std::string& partial_dir)>& write);

// <project_dir>/checkpoints/checkpoint_<i>: the existing ones in increasing i (complete or not).
std::vector<std::pair<int, std::string>> automatic_checkpoints(const std::string& project_dir);
// The next automatic name: i one past the highest existing (0 for the first).
std::string next_automatic_dir(const std::string& project_dir);
// Rank 0 only: removes the oldest automatic checkpoints until at most `total_limit` remain.
void apply_total_limit(const std::string& project_dir, int total_limit);

}  // namespace accel::checkpoint
