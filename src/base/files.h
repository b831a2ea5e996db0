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
// Atomically replaces `path`: writes path + ".tmp" synced, then renames it into place (the temporary
// is removed on failure, and the existing file is left as it was).
void write_file_atomic(const std::string& path, const void* data, std::size_t n);
// The whole file's bytes.
std::string read_file(const std::string& path);
// lstat succeeds (a dangling link exists too).
bool exists(const std::string& path);
// lstat says `path` is a symbolic link.
bool is_link(const std::string& path);
// stat succeeds and names a regular file / a directory.
bool is_file(const std::string& path);
bool is_dir(const std::string& path);
// The directory part of a path: "a/b" -> "a", "/b" -> "/", "b" -> ".".
std::string parent_dir(const std::string& path);
// A path without its file name's extension: "a/b.yaml" -> "a/b", "a.d/b" -> "a.d/b"; and the extension
// with its dot ("" when the file name has none). Where a sibling file of another kind, or a variant of
// the same file, is named after it.
std::string without_extension(const std::string& path);
std::string extension(const std::string& path);
// The working directory (getcwd), or "." when it cannot be read.
std::string working_dir();
// fsyncs a directory (makes a rename or a new file in it durable); errors are ignored.
void sync_dir(const std::string& dir);
// realpath(p), or p itself when it does not resolve.
std::string absolute_path(const std::string& p);
// The absolute path `p` names, existing or not, as the kernel would walk it: component by component,
// links resolved while the path exists (so ".." after a link goes to the parent of where it led), the
// rest taken lexically. So two spellings of one place compare equal before it is created ("ck/new/..",
// "link_into_ck/../x" and "ck", "ck/x").
std::string resolved_path(const std::string& p);
// Whether `inner` is `outer` or lies below it (both resolved_path'ed first).
bool is_within(const std::string& inner, const std::string& outer);
// The running executable (/proc/self/exe).
std::string self_exe_path();

}  // namespace accel::files
