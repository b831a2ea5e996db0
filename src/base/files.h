// accel::files — the few filesystem operations the launcher and checkpoints share, with POSIX
// calls only (std::filesystem::remove_all crashes in processes linked with libtorch on this
// toolchain). Errors are std::runtime_error naming the path and the reason.
#pragma once

#include <cstddef>
#include <string>

namespace accel::files {

// rm -rf. A missing path is fine.
void remove_tree(const std::string& path);
// mkdir -p.
void make_dirs(const std::string& path);
// Writes the bytes, fsyncs and closes (truncating an existing file).
void write_file_synced(const std::string& path, const void* data, std::size_t n);
// realpath(p), or p itself when it does not resolve.
std::string absolute_path(const std::string& p);
// The running executable (/proc/self/exe).
std::string self_exe_path();

}  // namespace accel::files
