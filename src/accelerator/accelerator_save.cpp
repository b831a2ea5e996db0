// Accelerator::save (accelerator.h): small objects written by the main process, atomically.
#include "accelerator/accelerator.h"

#include "base/files.h"
#include "checkpoint/safetensors.h"

#include <utility>
#include <vector>

namespace accel {

void Accelerator::save(const std::map<std::string, at::Tensor>& tensors, const std::string& path) const {
  if (!is_main_process()) return;
  std::vector<std::pair<std::string, at::Tensor>> list(tensors.begin(), tensors.end());
  checkpoint::write_safetensors(path, list, {{"format", "pt"}});
}

void Accelerator::save(const at::Tensor& tensor, const std::string& path) const {
  save(std::map<std::string, at::Tensor>{{"tensor", tensor}}, path);
}

void Accelerator::save(std::string_view text, const std::string& path) const {
  if (!is_main_process()) return;
  files::write_file_atomic(path, text.data(), text.size());
}

}  // namespace accel
