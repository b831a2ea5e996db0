// save_model / load_model: a prepared model's full weights as Hugging Face-style safetensors files
// (see model_export.h).
#include "checkpoint/model_export.h"

#include "base/error.h"
#include "base/memory.h"
#include "base/progress.h"
#include "checkpoint/safetensors.h"
#include "zero/engine.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <memory>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace accel::checkpoint {

namespace {

std::string export_shape(at::IntArrayRef s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

// Every rank says whether it failed; returns true if any did. Collective over the world.
bool any_failed(zero::Engine& engine, bool failed) {
  at::Tensor flag = at::full({1}, failed ? 1 : 0, at::kInt);
  engine.world().all_reduce(flag, {comm::ReduceOp::Max});
  return flag.item<int>() != 0;
}

// The model's tensors in state_dict order: parameters, then buffers.
std::vector<std::pair<std::string, at::Tensor>> model_tensors(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& kv : model.named_parameters()) out.emplace_back(kv.key(), kv.value());
  for (const auto& kv : model.named_buffers()) out.emplace_back(kv.key(), kv.value());
  return out;
}

// TensorImpl of a flat's parameter -> (flat index, parameter index).
std::unordered_map<const void*, std::pair<std::size_t, std::size_t>> flat_params(const zero::Engine& engine) {
  std::unordered_map<const void*, std::pair<std::size_t, std::size_t>> out;
  for (std::size_t fi = 0; fi < engine.flats().size(); ++fi) {
    const auto& ps = engine.flats()[fi].flat_param->params();
    for (std::size_t i = 0; i < ps.size(); ++i) out.emplace(ps[i].unsafeGetTensorImpl(), std::make_pair(fi, i));
  }
  return out;
}

// Saved from the master where it holds the weights in another dtype than the compute copy.
bool save_from_master(const zero::Engine::Flat& f) {
  return f.group >= 0 && f.master.defined() && f.master.scalar_type() != f.flat_param->options().dtype;
}

}  // namespace

// --- save ----------------------------------------------------------------------------------------

SaveModelResult save_model(zero::Engine& engine, torch::nn::Module& model, const std::string& dir,
                           std::int64_t max_shard_size_bytes, const SaveModelOptions& options) {
  if (max_shard_size_bytes <= 0)
    throw accel::InvalidArgumentError(
        fmt::format("save_model({}): max_shard_size must be > 0, got {}", dir, max_shard_size_bytes));
  const bool writer_rank = engine.world().rank() == 0;
  const auto& flats = engine.flats();
  auto from_master = [&](const zero::Engine::Flat& f) { return save_from_master(f) && !options.compute_dtype; };
  const auto where = flat_params(engine);

  struct Item {
    std::string name;
    at::Tensor direct;  // defined: written from the model's tensor (buffers, parameters in no flat)
    std::size_t flat = 0, index = 0;
  };
  std::vector<Item> items;
  std::vector<SafetensorsTensorSpec> specs;                      // in state_dict order: the files' layout follows it
  std::vector<std::vector<std::size_t>> by_param(flats.size());  // per flat: items, by parameter order
  for (auto& [name, t] : model_tensors(model)) {
    Item it;
    it.name = name;
    c10::ScalarType dtype = t.scalar_type();
    if (auto w = where.find(t.unsafeGetTensorImpl()); w != where.end()) {
      it.flat = w->second.first;
      it.index = w->second.second;
      const auto& f = flats[it.flat];
      dtype = from_master(f) ? f.master.scalar_type() : f.flat_param->options().dtype;
    } else {
      it.direct = t.detach();
    }
    specs.push_back({name, dtype, t.sizes().vec()});
    items.push_back(std::move(it));
  }
  SaveModelResult result;
  const ModelFilesPlan plan = plan_model_files(specs, max_shard_size_bytes);  // the same on every rank
  result.files = plan.files;
  result.total_bytes = plan.total_bytes;
  for (std::size_t i = 0; i < items.size(); ++i)
    if (!items[i].direct.defined()) by_param[items[i].flat].push_back(i);
  for (const auto& u : engine.units()) {
    std::int64_t bytes = 0;
    for (auto fi : u.flats) {
      const auto& f = flats[fi];
      const auto dt = from_master(f) ? f.master.scalar_type() : f.flat_param->options().dtype;
      bytes += f.flat_param->layout().padded() * static_cast<std::int64_t>(c10::elementSize(dt));
    }
    result.largest_unit_bytes = std::max(result.largest_unit_bytes, bytes);
  }

  // Rank 0 opens every file (headers first). A failure is remembered, not thrown, so that rank 0
  // keeps taking part in the gathers; the ranks agree on it at the end.
  std::string error;
  std::unique_ptr<ModelFilesWriter> writer;
  auto guard = [&](auto&& fn) {
    if (!writer_rank || !error.empty()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
      writer.reset();  // abandons the temporaries
    }
  };
  guard([&] {
    writer = std::make_unique<ModelFilesWriter>("save_model", dir, specs, max_shard_size_bytes, options.metadata);
  });

  c10::NoGradGuard no_grad;
  ProgressBar bar(static_cast<std::int64_t>(flats.size()), "save_model", options.progress && writer_rank);
  for (std::size_t fi = 0; fi < flats.size(); ++fi) {
    const auto& f = flats[fi];
    const sharding::FlatParam& fp = *f.flat_param;
    at::Tensor buffer;
    {  // a sharded flat parameter is gathered into a temporary, one at a time
      memory::CategoryScope cat(memory::Category::Gathered);
      buffer = engine.whole_values(f, from_master(f) ? zero::Engine::Source::Master : zero::Engine::Source::Compute);
    }
    const bool temporary = !(f.master.defined() && buffer.is_alias_of(f.master)) &&
                           !(fp.gathered() && buffer.is_alias_of(fp.full())) &&
                           !(fp.node_shared() && buffer.is_alias_of(fp.node_buffer()));
    if (temporary) result.peak_gathered_bytes = std::max<std::int64_t>(result.peak_gathered_bytes, buffer.nbytes());
    guard([&] {
      for (auto i : by_param[fi]) {
        const Item& it = items[i];
        const at::Tensor& p = fp.params()[it.index];
        writer->write(it.name, buffer.narrow(0, fp.layout().offset(it.index), p.numel()).view(p.sizes()));
      }
    });
    buffer = at::Tensor();
    bar.update();
  }
  guard([&] {
    for (const auto& it : items)
      if (it.direct.defined()) writer->write(it.name, it.direct);
    writer->finish();
  });
  bar.close();
  if (any_failed(engine, !error.empty())) {
    if (!error.empty()) throw accel::RuntimeError(error);
    throw accel::RuntimeError(
        fmt::format("save_model({}): rank 0 could not write the checkpoint (its error says why)", dir));
  }
  return result;
}

// --- load ----------------------------------------------------------------------------------------

LoadModelResult load_model(zero::Engine& engine, torch::nn::Module& model, const std::string& path_or_dir,
                           const LoadModelOptions& options) {
  LoadModelResult result;
  std::string error;
  std::map<std::string, SafetensorsFile> open;
  std::map<std::string, const SafetensorsFile*> src;  // checkpoint tensor -> its file
  const auto tensors = model_tensors(model);

  // Phase 1: every check, nothing written.
  try {
    ModelFiles mf = resolve_model_files(path_or_dir);
    result.files = mf.files;
    for (const auto& f : mf.files) open.emplace(f, SafetensorsFile::open(f));
    if (mf.where.empty()) {
      const SafetensorsFile& f = open.begin()->second;
      for (const auto& n : f.names()) src[n] = &f;
    } else {
      for (const auto& [name, path] : mf.where) {
        const SafetensorsFile& f = open.at(path);
        if (!f.contains(name))
          throw accel::RuntimeError(
              fmt::format("load_model: the index of '{}' puts tensor '{}' in '{}', but that file has no such tensor",
                          path_or_dir, name, path));
        src[name] = &f;
      }
    }
    std::set<std::string> in_model;
    for (const auto& [name, t] : tensors) {
      in_model.insert(name);
      auto it = src.find(name);
      if (it == src.end())
        throw accel::RuntimeError(
            fmt::format("load_model: the checkpoint '{}' has no tensor '{}' (a {} tensor of the "
                        "model)",
                        path_or_dir, name, export_shape(t.sizes())));
      const SafetensorsEntry& e = it->second->entry(name);
      if (e.shape != t.sizes().vec())
        throw accel::RuntimeError(fmt::format("load_model: tensor '{}' in '{}' has shape {}, but the model's is {}",
                                              name, it->second->path(), export_shape(e.shape),
                                              export_shape(t.sizes())));
      const c10::ScalarType dt = it->second->dtype(name);
      if (dt != t.scalar_type() && !(at::isFloatingType(dt) && at::isFloatingType(t.scalar_type())))
        throw accel::RuntimeError(
            fmt::format("load_model: tensor '{}' in '{}' is {}, but the model's is {} (only "
                        "floating-point tensors are converted)",
                        name, it->second->path(), e.dtype, c10::toString(t.scalar_type())));
    }
    for (const auto& [name, f] : src)
      if (!in_model.count(name))
        throw accel::RuntimeError(
            fmt::format("load_model: tensor '{}' in '{}' is not a parameter or buffer of the model", name, f->path()));
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (any_failed(engine, !error.empty()))
    throw accel::RuntimeError(
        !error.empty() ? error : fmt::format("load_model({}): another rank rejected the checkpoint", path_or_dir));

  // Phase 2: each rank reads what it keeps (node-shared parameters: once no peer reads them; a
  // collective, so outside the try, whose failures end in any_failed on every rank).
  engine.before_param_writes();
  try {
    c10::NoGradGuard no_grad;
    const auto& flats = engine.flats();
    const auto where = flat_params(engine);
    std::vector<std::vector<std::string>> flat_names(flats.size());
    for (std::size_t fi = 0; fi < flats.size(); ++fi) flat_names[fi].resize(flats[fi].flat_param->params().size());
    for (const auto& [name, t] : tensors) {
      auto w = engine.plan().passthrough ? where.end() : where.find(t.unsafeGetTensorImpl());
      if (w != where.end()) {
        auto& slot = flat_names[w->second.first][w->second.second];
        if (slot.empty()) slot = name;  // a tied parameter is read once, under its first name
      } else {
        t.detach().copy_(src.at(name)->read(name));  // buffers; every parameter in passthrough
      }
      ++result.tensors;
    }
    engine.wait_host_copies();  // host masters: no copy to the device still reads them
    ProgressBar bar(static_cast<std::int64_t>(flats.size()), "load_model",
                    options.progress && engine.world().rank() == 0);
    for (std::size_t fi = 0; fi < flats.size() && !engine.plan().passthrough; ++fi) {
      const auto& f = flats[fi];
      const sharding::FlatParam& fp = *f.flat_param;
      // Copies the part of parameter i inside flat elements [b, e) into dst (which holds [b, e)).
      auto fill = [&](std::int64_t b, std::int64_t e, const at::Tensor& dst) {
        for (std::size_t i = 0; i < fp.params().size(); ++i) {
          const std::string& name = flat_names[fi][i];
          if (name.empty()) continue;
          const std::int64_t off = fp.layout().offset(i), n = fp.params()[i].numel();
          const std::int64_t lo = std::max(b, off), hi = std::min(e, off + n);
          if (lo >= hi) continue;
          dst.narrow(0, lo - b, hi - lo).copy_(src.at(name)->read_range(name, lo - off, hi - off));
        }
      };
      if (f.group >= 0) {
        auto [b, e] = engine.master_range(f);
        fill(b, e, engine.master_data(f));
      } else if (fp.gathered() && !fp.node_shared()) {  // frozen, whole on this rank
        fill(0, fp.layout().padded(), fp.full());
        if (fp.options().sharded) {
          auto [b, e] = fp.layout().shard_range(fp.options().rank);
          fp.shard().copy_(fp.full().narrow(0, b, e - b));
        }
      } else {  // frozen, sharded at rest
        auto [b, e] = fp.layout().shard_range(fp.options().rank);
        fill(b, e, fp.shard());
      }
      bar.update();
    }
    bar.close();
    for (const auto& [path, f] : open) result.bytes_read += f.bytes_read();
  } catch (const std::exception& e) {
    error = fmt::format("{} (the model is partly loaded)", e.what());
  }
  if (any_failed(engine, !error.empty()))
    throw accel::RuntimeError(
        !error.empty() ? error
                       : fmt::format("load_model({}): another rank failed to read the checkpoint", path_or_dir));
  engine.params_from_masters();
  return result;
}

}  // namespace accel::checkpoint
