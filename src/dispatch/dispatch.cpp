// load_checkpoint_and_dispatch (dispatch.h): resolve the map, check everything, load, install hooks.
#include "dispatch/dispatch.h"
#include "base/error.h"

#include "base/files.h"
#include "base/mapped_file.h"
#include "checkpoint/model_export.h"
#include "checkpoint/safetensors.h"
#include "sharding/unit.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace accel {
namespace {

using checkpoint::SafetensorsFile;

std::atomic<std::int64_t> g_page_ins{0}, g_bytes_paged{0};

struct Registered {
  std::weak_ptr<torch::nn::Module> model;
  DeviceMap map;
};
std::mutex g_mu;
std::unordered_map<const torch::nn::Module*, Registered>& registry() {
  static std::unordered_map<const torch::nn::Module*, Registered> r;
  return r;
}

std::string shape_str(at::IntArrayRef s) { return c10::str(s); }

[[noreturn]] void fail(const std::string& what) {
  throw accel::InvalidArgumentError("load_checkpoint_and_dispatch: " + what);
}

// Points parameter/buffer t at `value` in place (same TensorImpl: the module's members and
// named_parameters() see it). Tensor::set_data refuses a meta tensor (a model built on the meta
// device); for those the metadata is swapped directly, which is what set_data does after its check
// (a parameter of a fresh model has no gradient accumulator to reset).
void point_at(const at::Tensor& t, const at::Tensor& value) {
  if (t.is_meta())
    t.unsafeGetTensorImpl()->shallow_copy_from(value.getIntrusivePtr());
  else
    t.set_data(value);
}

// A range of a mapped file that a disk unit's parameter points at.
struct MappedRange {
  std::shared_ptr<files::MappedFile> file;
  std::uint64_t offset = 0, bytes = 0;
  at::Tensor param;   // the parameter
  at::Tensor mapped;  // a tensor over the range (what the parameter points at between forwards)
};

// The hooks of a unit placed off the main device or on disk.
class DispatchHooks : public sharding::UnitHooks {
 public:
  DispatchHooks(std::optional<c10::Device> exec, c10::Device main, std::vector<MappedRange> disk, bool drop_cache,
                bool copy)
      : exec_(exec), main_(main), disk_(std::move(disk)), drop_cache_(drop_cache), copy_(copy) {
    for (const auto& r : disk_) bytes_ += static_cast<std::int64_t>(r.bytes);
  }
  void pre_forward() override {
    for (const auto& r : disk_) r.file->will_need(r.offset, r.bytes);
    if (copy_)
      for (const auto& r : disk_) {
        // Into memory the allocator aligns, as a parameter loaded in memory is: BLAS kernels choose
        // their path (and so their rounding) by alignment, so this keeps results bitwise the same.
        at::Tensor buf = at::empty_like(r.mapped, at::MemoryFormat::Contiguous);
        buf.copy_(r.mapped);
        r.file->dont_need(r.offset, r.bytes);
        point_at(r.param, buf);
      }
    if (!disk_.empty()) {
      g_page_ins.fetch_add(1, std::memory_order_relaxed);
      g_bytes_paged.fetch_add(bytes_, std::memory_order_relaxed);
    }
  }
  void post_forward(std::vector<at::Tensor>& outputs) override {
    if (exec_)
      for (auto& t : outputs)
        if (t.defined()) t = t.to(main_);
    release();
  }
  void post_forward_untracked() override { release(); }
  std::optional<c10::Device> input_device() const override { return exec_; }

 private:
  void release() {
    for (const auto& r : disk_) {
      if (copy_) point_at(r.param, r.mapped);  // the copy is freed
      r.file->dont_need(r.offset, r.bytes);
      if (drop_cache_) r.file->drop_cache(r.offset, r.bytes);
    }
  }
  std::optional<c10::Device> exec_;  // set when the unit runs on another device than the main one
  c10::Device main_;
  std::vector<MappedRange> disk_;
  bool drop_cache_, copy_;
  std::int64_t bytes_ = 0;
};

// One tensor of the model (aliases under several names are one tensor).
struct ModelTensor {
  at::Tensor t;
  std::vector<std::string> names;
  bool parameter = false;
  int group = -1;     // index into the plan's groups, -1: the model's own code
  std::string place;  // "cpu", "cuda:N", "disk"
  const SafetensorsFile* file = nullptr;
  std::string source;  // its name in the checkpoint (empty: not there)
  c10::ScalarType target = c10::kFloat;
};

// The entry of the map that covers `name` (the longest prefix at a dot), or null.
const std::string* covering(const DeviceMap& map, const std::string& name) {
  std::string n = name;
  while (true) {
    if (auto it = map.find(n); it != map.end()) return &it->second;
    if (n.empty()) return nullptr;
    auto dot = n.rfind('.');
    n = dot == std::string::npos ? std::string() : n.substr(0, dot);
  }
}

void check_device_available(const std::string& place) {
  if (!place.starts_with("cuda:")) return;
  const int index = std::stoi(place.substr(5));
  const int count = at::detail::getCUDAHooks().deviceCount();
  if (index >= count)
    fail(fmt::format("the device map names {}, but this process sees {} CUDA device{}", place, count,
                     count == 1 ? "" : "s"));
}

// The outermost units inside m (m itself if it is one).
void outermost_units(torch::nn::Module& m, std::vector<std::shared_ptr<sharding::UnitSlot>>& out) {
  if (auto slot = sharding::find_unit(&m)) {
    out.push_back(slot);
    return;
  }
  for (const auto& c : m.children()) outermost_units(*c, out);
}

}  // namespace

DispatchResult load_checkpoint_and_dispatch(const std::shared_ptr<torch::nn::Module>& model_ptr,
                                            const std::string& checkpoint, const DispatchOptions& options) {
  if (!model_ptr) fail("null model");
  torch::nn::Module& model = *model_ptr;
  c10::NoGradGuard no_grad;
  DispatchResult result;

  // A prepared model's units carry the engine's hooks (and its parameters are flat views); a
  // dispatched one carries ours.
  for (const auto& m : model.named_modules())
    if (auto slot = sharding::find_unit(m.value().get()); slot && slot->hooks)
      fail(
          fmt::format("unit '{}' already has hooks: the model was prepared by an Accelerator or dispatched before "
                      "(build a fresh model to dispatch)",
                      m.key()));

  // --- the model's tensors and groups -------------------------------------------------------------
  const ModelPlan plan = plan_model(model, options.no_split, options.dtype);
  result.largest_group_bytes = plan.largest_group_bytes;
  std::vector<ModelTensor> tensors;
  std::unordered_map<const void*, std::size_t> index;
  auto add = [&](const std::string& name, const at::Tensor& t, bool parameter) {
    if (!t.defined()) return;
    auto [it, fresh] = index.emplace(t.unsafeGetTensorImpl(), tensors.size());
    if (fresh) {
      ModelTensor mt;
      mt.t = t;
      mt.parameter = parameter;
      tensors.push_back(std::move(mt));
    }
    tensors[it->second].names.push_back(name);
  };
  for (const auto& p : model.named_parameters()) add(p.key(), p.value(), true);
  for (const auto& b : model.named_buffers()) add(b.key(), b.value(), false);
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    for (const auto& p : plan.groups[g].module->parameters())
      if (auto it = index.find(p.unsafeGetTensorImpl()); it != index.end() && tensors[it->second].group < 0)
        tensors[it->second].group = static_cast<int>(g);
    for (const auto& b : plan.groups[g].module->buffers())
      if (auto it = index.find(b.unsafeGetTensorImpl()); it != index.end() && tensors[it->second].group < 0)
        tensors[it->second].group = static_cast<int>(g);
  }

  // --- the device map -----------------------------------------------------------------------------
  DeviceMap map;
  if (const auto* strategy = std::get_if<std::string>(&options.device_map)) {
    map = infer_auto_device_map(model, options.max_memory, options.no_split, *strategy, options.dtype);
  } else {
    std::set<std::string> known{""};
    for (const auto& m : model.named_modules()) known.insert(m.key());
    for (const auto& t : tensors) known.insert(t.names.begin(), t.names.end());
    for (const auto& [key, place] : std::get<DeviceMap>(options.device_map)) {
      if (!known.count(key))
        fail(fmt::format("the device map names '{}', which is not a module or tensor of the model", key));
      try {
        map[key] = canonical_place(place);
      } catch (const std::invalid_argument& e) {
        fail(fmt::format("the device map puts '{}' on {}", key, e.what()));
      }
    }
  }
  for (const auto& [key, place] : map) check_device_available(place);
  std::vector<std::string> group_place(plan.groups.size());
  std::string rest_place;
  std::string rest_name;
  for (auto& t : tensors) {
    const std::string* place = covering(map, t.names[0]);
    if (!place) fail(fmt::format("the device map does not cover '{}'", t.names[0]));
    t.place = *place;
    if (t.group >= 0) {
      auto& gp = group_place[t.group];
      if (gp.empty()) gp = t.place;
      if (gp != t.place)
        fail(fmt::format("the device map splits '{}' between {} and {} ('{}'); a unit is placed whole",
                         plan.groups[t.group].name, gp, t.place, t.names[0]));
    } else {
      if (t.place == "disk")
        fail(
            fmt::format("the device map puts '{}' on disk, but only accel units can be paged from disk "
                        "('{}' is outside every unit)",
                        t.names[0], t.names[0]));
      if (rest_place.empty()) rest_place = t.place, rest_name = t.names[0];
      if (rest_place != t.place)
        fail(
            fmt::format("the device map puts '{}' on {} and '{}' on {}: everything outside the units runs in the "
                        "model's own code, on one device",
                        rest_name, rest_place, t.names[0], t.place));
    }
  }
  if (rest_place.empty()) {  // everything is in groups: the first memory place of a group, else the cpu
    rest_place = "cpu";
    for (const auto& gp : group_place)
      if (!gp.empty() && gp != "disk") {
        rest_place = gp;
        break;
      }
  }
  const c10::Device main_device(rest_place);
  std::vector<std::string> disk_groups;
  for (std::size_t g = 0; g < plan.groups.size(); ++g)
    if (group_place[g] == "disk") disk_groups.push_back(plan.groups[g].name);
  if (!disk_groups.empty() && options.offload_folder.empty())
    fail(fmt::format("the device map puts {} unit{} on disk ({}{}) but no offload_folder was given", disk_groups.size(),
                     disk_groups.size() == 1 ? "" : "s", disk_groups.front(), disk_groups.size() > 1 ? ", ..." : ""));

  // --- the checkpoint, checked against the model ---------------------------------------------------
  const checkpoint::ModelFiles files = checkpoint::resolve_model_files(checkpoint);
  std::map<std::string, SafetensorsFile> open;
  std::map<std::string, const SafetensorsFile*> src;
  for (const auto& f : files.files) open.emplace(f, SafetensorsFile::open(f));
  if (files.where.empty()) {
    for (const auto& n : open.begin()->second.names()) src[n] = &open.begin()->second;
  } else {
    for (const auto& [name, path] : files.where) {
      const SafetensorsFile& f = open.at(path);
      if (!f.contains(name))
        fail(fmt::format("the index of '{}' puts tensor '{}' in '{}', which has no such tensor", checkpoint, name,
                         path));
      src[name] = &f;
    }
  }
  std::set<std::string> used;
  for (auto& t : tensors) {
    for (const auto& n : t.names)
      if (auto it = src.find(n); it != src.end()) {
        t.source = n;
        t.file = it->second;
        break;
      }
    t.target = t.t.scalar_type();
    if (t.parameter && options.dtype && at::isFloatingType(t.target)) t.target = *options.dtype;
    if (!t.file) {
      if (t.parameter) fail(fmt::format("the checkpoint '{}' has no tensor '{}'", checkpoint, t.names[0]));
      if (is_empty_weight(t.t))
        fail(
            fmt::format("buffer '{}' holds no values and the checkpoint '{}' has none for it", t.names[0], checkpoint));
      continue;
    }
    for (const auto& n : t.names) used.insert(n);
    const auto shape = t.file->shape(t.source);
    if (at::IntArrayRef(shape) != t.t.sizes())
      fail(fmt::format("tensor '{}': the checkpoint has shape {}, the model {}", t.source, shape_str(shape),
                       shape_str(t.t.sizes())));
    const auto stored = t.file->dtype(t.source);
    if (stored != t.target && !(at::isFloatingType(stored) && at::isFloatingType(t.target)))
      fail(fmt::format("tensor '{}': the checkpoint has dtype {}, the model {}", t.source, c10::toString(stored),
                       c10::toString(t.target)));
  }
  for (const auto& [n, f] : src)
    if (!used.count(n)) ++result.unexpected_tensors;

  // --- disk: map the checkpoint's own bytes where they fit, else write a converted copy --------------
  std::map<std::string, std::shared_ptr<files::MappedFile>> mapped;
  auto map_file = [&](const std::string& path) {
    auto& m = mapped[path];
    if (!m) m = files::MappedFile::open(path);
    return m;
  };
  std::unordered_map<const void*, MappedRange> disk_range;
  std::vector<const ModelTensor*> to_write;
  for (const auto& t : tensors) {
    if (t.group < 0 || group_place[t.group] != "disk" || !t.parameter) continue;
    const auto& e = t.file->entry(t.source);
    const std::uint64_t offset = t.file->header().data_start + e.begin;
    if (t.file->dtype(t.source) == t.target && offset % c10::elementSize(t.target) == 0) {
      disk_range[t.t.unsafeGetTensorImpl()] = MappedRange{map_file(t.file->path()), offset, e.end - e.begin, {}, {}};
      result.disk_bytes_mapped_from_checkpoint += static_cast<std::int64_t>(e.end - e.begin);
    } else {
      to_write.push_back(&t);
    }
  }
  if (!to_write.empty()) {
    files::make_dirs(options.offload_folder);
    const std::string path = options.offload_folder + "/offload.safetensors";
    std::vector<checkpoint::SafetensorsTensorSpec> specs;
    for (const auto* t : to_write) specs.push_back({t->names[0], t->target, t->t.sizes().vec()});
    checkpoint::SafetensorsWriter w(path, specs, {{"format", "pt"}, {"written_by", "accel dispatch"}});
    for (const auto* t : to_write) w.write(t->names[0], t->file->read(t->source).to(t->target));  // one at a time
    w.finish();
    SafetensorsFile written = SafetensorsFile::open(path);
    for (const auto* t : to_write) {
      const auto& e = written.entry(t->names[0]);
      disk_range[t->t.unsafeGetTensorImpl()] =
          MappedRange{map_file(path), written.header().data_start + e.begin, e.end - e.begin, {}, {}};
      result.disk_bytes_written_to_offload += static_cast<std::int64_t>(e.end - e.begin);
    }
  }

  // --- load: one tensor at a time, straight to its place ---------------------------------------------
  for (auto& t : tensors) {
    const bool on_disk = t.group >= 0 && group_place[t.group] == "disk";
    const std::string place = t.group >= 0 ? (on_disk ? std::string("cpu") : group_place[t.group]) : rest_place;
    const c10::Device device(place);
    if (on_disk && t.parameter) {
      MappedRange& r = disk_range.at(t.t.unsafeGetTensorImpl());
      auto keep = r.file;
      r.mapped = at::from_blob(
          r.file->data() + r.offset, t.t.sizes(), [keep](void*) {}, at::TensorOptions().dtype(t.target));
      r.param = t.t;
      point_at(t.t, r.mapped);
      result.bytes_by_place["disk"] += static_cast<std::int64_t>(r.bytes);
      ++result.tensors_loaded;
      continue;
    }
    at::Tensor value;
    if (t.file) {
      value = t.file->read(t.source);
      ++result.tensors_loaded;
    } else {
      value = t.t;  // a buffer the checkpoint does not hold: its own values, moved
    }
    value = value.to(device, t.target);
    if (!value.is_same(t.t)) point_at(t.t, value);
    result.bytes_by_place[place] += value.numel() * static_cast<std::int64_t>(value.element_size());
  }

  // --- hooks on the units that run elsewhere or page from disk ---------------------------------------
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    const bool on_disk = group_place[g] == "disk";
    const std::string exec_place = on_disk ? "cpu" : group_place[g];
    if (exec_place.empty()) continue;  // a group without tensors
    const c10::Device exec(exec_place);
    if (!on_disk && exec == main_device) continue;
    std::vector<std::shared_ptr<sharding::UnitSlot>> slots;
    outermost_units(*plan.groups[g].module, slots);
    // On disk, each unit pages in its own parameters' ranges; a range of the group no unit holds (a
    // parameter of the group module itself) is paged by every unit of the group.
    auto ranges_of = [&](torch::nn::Module& m, std::set<const void*>& seen) {
      std::vector<MappedRange> out;
      for (const auto& p : m.parameters())
        if (seen.insert(p.unsafeGetTensorImpl()).second)
          if (auto it = disk_range.find(p.unsafeGetTensorImpl()); it != disk_range.end()) out.push_back(it->second);
      return out;
    };
    std::vector<std::vector<MappedRange>> own(slots.size());
    std::vector<MappedRange> shared;
    if (on_disk) {
      ++result.disk_units;
      std::set<const void*> in_units;
      for (std::size_t k = 0; k < slots.size(); ++k) own[k] = ranges_of(*slots[k]->module, in_units);
      shared = ranges_of(*plan.groups[g].module, in_units);  // (what no unit took)
    }
    for (std::size_t k = 0; k < slots.size(); ++k) {
      std::vector<MappedRange> ranges = own[k];
      ranges.insert(ranges.end(), shared.begin(), shared.end());
      slots[k]->hooks = std::make_shared<DispatchHooks>(
          exec == main_device ? std::nullopt : std::optional<c10::Device>(exec), main_device, std::move(ranges),
          options.drop_page_cache, options.copy_disk_weights);
    }
  }
  // Disk pages touched while loading (none: from_blob reads nothing) are dropped as a unit would.
  for (const auto& [impl, r] : disk_range) r.file->dont_need(r.offset, r.bytes);

  result.device_map = map;
  result.main_device = rest_place;
  std::lock_guard<std::mutex> lk(g_mu);
  registry()[&model] = Registered{model_ptr, map};
  return result;
}

bool is_dispatched(const torch::nn::Module& model) { return dispatched_device_map(model).has_value(); }

std::optional<DeviceMap> dispatched_device_map(const torch::nn::Module& model) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = registry().find(&model);
  if (it == registry().end()) return std::nullopt;
  auto alive = it->second.model.lock();
  if (!alive || alive.get() != &model) return std::nullopt;
  return it->second.map;
}

PagingStats paging_stats() { return {g_page_ins.load(), g_bytes_paged.load()}; }

}  // namespace accel
