// The Hugging Face layout of a model's full weights (see model_files.h).
#include "checkpoint/model_files.h"

#include "base/error.h"
#include "base/files.h"
#include "checkpoint/safetensors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <set>

namespace accel::checkpoint {

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

// model-00002-of-00005.safetensors
std::string shard_name(std::size_t k, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}
bool is_shard_name(const std::string& s) {
  unsigned a = 0, b = 0;
  char tail[32] = {};
  return s.size() == std::string("model-00001-of-00001.safetensors").size() &&
         std::sscanf(s.c_str(), "model-%5u-of-%5u.%31s", &a, &b, tail) == 3 && std::string(tail) == "safetensors";
}

}  // namespace

ModelFilesPlan plan_model_files(const std::vector<SafetensorsTensorSpec>& tensors, std::int64_t max_shard_size) {
  if (max_shard_size <= 0)
    throw accel::InvalidArgumentError(fmt::format("max_shard_size must be > 0, got {}", max_shard_size));
  ModelFilesPlan plan;
  std::vector<std::int64_t> file_bytes{0};
  std::vector<std::size_t> file_count{0};
  for (const auto& t : tensors) {
    std::int64_t bytes = static_cast<std::int64_t>(c10::elementSize(t.dtype));
    for (auto d : t.shape) bytes *= d;
    if (file_count.back() > 0 && file_bytes.back() + bytes > max_shard_size) {
      file_bytes.push_back(0);
      file_count.push_back(0);
    }
    plan.file_of.push_back(file_bytes.size() - 1);
    file_bytes.back() += bytes;
    ++file_count.back();
    plan.total_bytes += bytes;
  }
  const std::size_t n = file_bytes.size();
  for (std::size_t k = 0; k < n; ++k) plan.files.push_back(n == 1 ? kSingle : shard_name(k, n));
  return plan;
}

ModelFilesWriter::ModelFilesWriter(std::string who, std::string dir, const std::vector<SafetensorsTensorSpec>& tensors,
                                   std::int64_t max_shard_size, const std::map<std::string, std::string>& metadata)
    : who_(std::move(who)), dir_(std::move(dir)) {
  try {
    plan_ = plan_model_files(tensors, max_shard_size);
  } catch (const std::exception& e) {
    throw accel::InvalidArgumentError(fmt::format("{}({}): {}", who_, dir_, e.what()));
  }
  if (!dir_.empty() && !files::is_dir(dir_)) {
    try {
      files::make_dirs(dir_);
    } catch (const std::exception& e) {
      throw accel::RuntimeError(fmt::format("{}: {}", who_, e.what()));
    }
    if (!files::is_dir(dir_))
      throw accel::RuntimeError(fmt::format("{}: '{}' exists and is not a directory", who_, dir_));
  }
  std::vector<std::vector<SafetensorsTensorSpec>> specs(plan_.files.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    specs[plan_.file_of[i]].push_back(tensors[i]);
    names_.push_back(tensors[i].name);
    file_by_name_[tensors[i].name] = plan_.file_of[i];
  }
  for (std::size_t k = 0; k < plan_.files.size(); ++k)
    writers_.push_back(std::make_unique<SafetensorsWriter>(dir_ + "/" + plan_.files[k], std::move(specs[k]), metadata));
}

ModelFilesWriter::~ModelFilesWriter() = default;  // unfinished writers remove their temporaries

void ModelFilesWriter::write(const std::string& name, const at::Tensor& t) {
  auto it = file_by_name_.find(name);
  if (it == file_by_name_.end())
    throw accel::InvalidArgumentError(fmt::format("{}({}): tensor '{}' was not declared", who_, dir_, name));
  writers_[it->second]->write(name, t);
}

void ModelFilesWriter::finish() {
  for (auto& w : writers_) w->finish();
  const std::size_t nfiles = plan_.files.size();
  if (nfiles > 1) {
    nlohmann::json weight_map = nlohmann::json::object();
    for (const auto& n : names_) weight_map[n] = plan_.files[file_by_name_.at(n)];
    nlohmann::json index = {{"metadata", {{"total_size", plan_.total_bytes}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    files::write_file_atomic(dir_ + "/" + kIndex, text.data(), text.size());
  }
  // Files of an earlier save that this one does not list.
  std::set<std::string> keep(plan_.files.begin(), plan_.files.end());
  if (nfiles > 1) keep.insert(kIndex);
  if (DIR* d = ::opendir(dir_.c_str())) {
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if ((n == kSingle || n == kIndex || is_shard_name(n)) && !keep.count(n)) stale.push_back(n);
    }
    ::closedir(d);
    for (const auto& n : stale) ::unlink((dir_ + "/" + n).c_str());
  }
}

ModelFiles resolve_model_files(const std::string& path_or_dir) {
  ModelFiles out;
  if (files::is_file(path_or_dir)) {
    out.files.push_back(path_or_dir);
    return out;
  }
  if (!files::is_dir(path_or_dir))
    throw accel::RuntimeError(
        fmt::format("load_model: '{}' is neither a safetensors file nor a directory", path_or_dir));
  std::string dir = path_or_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (files::is_file(dir + "/" + kSingle)) {
    out.files.push_back(dir + "/" + kSingle);
    return out;
  }
  const std::string index_path = dir + "/" + kIndex;
  if (!files::is_file(index_path))
    throw accel::RuntimeError(fmt::format("load_model: directory '{}' holds neither {} nor {}", dir, kSingle, kIndex));
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(files::read_file(index_path));
  } catch (const nlohmann::json::exception& e) {
    throw accel::RuntimeError(fmt::format("load_model: index '{}' is not valid JSON: {}", index_path, e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw accel::RuntimeError(fmt::format("load_model: index '{}' has no \"weight_map\" object", index_path));
  std::set<std::string> files;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    const auto& v = it.value();
    if (!v.is_string())
      throw accel::RuntimeError(
          fmt::format("load_model: index '{}': weight_map entry '{}' is not a file name", index_path, it.key()));
    const std::string f = v.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      throw accel::RuntimeError(
          fmt::format("load_model: index '{}': tensor '{}' maps to '{}', which is not a file name inside the directory",
                      index_path, it.key(), f));
    const std::string path = dir + "/" + f;
    if (!files.count(path) && !files::is_file(path))
      throw accel::RuntimeError(fmt::format("load_model: index '{}' lists '{}' (for tensor '{}'), which does not exist",
                                            index_path, f, it.key()));
    files.insert(path);
    out.where[it.key()] = path;
  }
  out.files.assign(files.begin(), files.end());
  return out;
}

}  // namespace accel::checkpoint
