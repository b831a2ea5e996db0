#include "checkpoint/sharded_state.h"

#include "base/files.h"
#include "checkpoint/slice_reader.h"
#include "zero/optimizers.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <set>

namespace accel::checkpoint {
namespace {

using nlohmann::json;

// The CUDA device the model trains on (its first parameter's), none on the CPU: that device's
// generator state is saved beside the CPU one.
std::optional<c10::Device> cuda_device_of(torch::nn::Module& model) {
  for (const auto& p : model.parameters())
    if (p.defined() && p.is_cuda()) return p.device();
  return std::nullopt;
}

// --- what this rank holds: segments of parameters --------------------------------------------------

// A piece [lo, hi) of a parameter (viewed flat) held by this rank: where its values live (a 1-D
// view into a master, a flat buffer or the parameter) and where its optimizer state is keyed.
struct Segment {
  std::string name;
  std::vector<std::int64_t> shape;  // the parameter's full shape
  std::int64_t lo = 0, hi = 0;
  at::Tensor values;
  at::Tensor key;               // the tensor the optimizer keys its state by; undefined: none
  std::int64_t key_offset = 0;  // where [lo, hi) starts inside key (flat)
  bool writer = false;          // this rank writes the segment (replicated state is written once)
};

std::vector<Segment> segments_of(const zero::Engine& e, int world_rank) {
  std::vector<Segment> out;
  const auto& repl = e.replicate_group();
  const bool first_replica = !repl || repl->rank() == 0;
  for (const auto& f : e.flats()) {
    const sharding::FlatParam& fp = *f.flat_param;
    const auto& layout = fp.layout();
    at::Tensor src;
    std::int64_t b = 0, end = layout.padded();
    bool writer = false;
    if (e.plan().passthrough) {
      for (std::size_t i = 0; i < fp.params().size(); ++i) {
        const at::Tensor& p = fp.params()[i];
        Segment s{fp.names()[i], p.sizes().vec(), 0, p.numel(), p.detach().view({-1}), {}, 0, world_rank == 0};
        if (p.requires_grad() && f.group >= 0) s.key = p;
        out.push_back(std::move(s));
      }
      continue;
    }
    if (f.master.defined()) {
      std::tie(b, end) = e.master_range(f);
      src = e.master_data(f);
      writer = e.plan().masters_are_shards ? first_replica : world_rank == 0;
    } else if (fp.options().sharded) {
      std::tie(b, end) = layout.shard_range(fp.options().rank);
      src = fp.shard();
      writer = first_replica;
    } else {
      src = fp.full();
      writer = world_rank == 0;
    }
    for (std::size_t i = 0; i < fp.params().size(); ++i) {
      const std::int64_t off = layout.offset(static_cast<int>(i)), n = fp.params()[i].numel();
      if (n == 0) {  // no element for any rank to hold: rank 0 lists it (an empty slice), as a passthrough does
        if (world_rank == 0)
          out.push_back({fp.names()[i], fp.params()[i].sizes().vec(), 0, 0, src.narrow(0, 0, 0), {}, 0, true});
        continue;
      }
      const std::int64_t lo = std::max(b, off), hi = std::min(end, off + n);
      if (lo >= hi) continue;
      Segment s{fp.names()[i], fp.params()[i].sizes().vec(), lo - off, hi - off, src.narrow(0, lo - b, hi - lo), {}, 0,
                writer};
      if (f.master.defined()) {
        s.key = f.master;
        s.key_offset = lo - b;
      }
      out.push_back(std::move(s));
    }
  }
  return out;
}

// --- optimizer state, through the optimizer table ------------------------------------------------

// The table's row for `o` (nullptr for no optimizer); throws for a type the table lacks.
const zero::OptimizerRow* optimizer_row(const torch::optim::Optimizer* o) {
  if (!o) return nullptr;
  if (const auto* row = zero::find_optimizer_row(*o)) return row;
  throw CheckpointError(fmt::format("checkpoints support {} state, not this optimizer", zero::optimizer_names("and")));
}

torch::optim::OptimizerParamState* find_state(torch::optim::Optimizer& o, const at::Tensor& key) {
  auto it = o.state().find(key.unsafeGetTensorImpl());
  return it == o.state().end() ? nullptr : it->second.get();
}

// --- slices on disk ----------------------------------------------------------------------------------

struct Writer {
  std::string dir, file;
  std::vector<char> bytes;  // the whole shard file, written at once (and synced)
  json slices = json::array();

  void add(const std::string& key, const std::vector<std::int64_t>& shape, std::int64_t begin, const at::Tensor& t) {
    at::Tensor c = t.detach().to(c10::kCPU).contiguous();
    const std::size_t n = c.numel() * c.element_size();
    const std::size_t offset = bytes.size();
    bytes.insert(bytes.end(), static_cast<const char*>(c.data_ptr()), static_cast<const char*>(c.data_ptr()) + n);
    slices.push_back(slice_record(key, shape, c.scalar_type(),
                                  {file, offset, n, begin, begin + c.numel(), slice_crc32(bytes.data() + offset, n)}));
  }
};

// The model's tensors in state_dict order (parameters, then buffers), each with the key that holds it:
// "param/<name>" under the name its flat parameter knows it by (a tied parameter's second name maps
// to the first), "buffer/<name>". merge_weights writes the model's files in this order, as save_model.
json state_dict_keys(const zero::Engine& engine, torch::nn::Module& model) {
  std::map<const void*, std::string> flat_name;
  for (const auto& f : engine.flats())
    for (std::size_t i = 0; i < f.flat_param->params().size(); ++i)
      flat_name.emplace(f.flat_param->params()[i].unsafeGetTensorImpl(), f.flat_param->names()[i]);
  json out = json::array();
  for (const auto& p : model.named_parameters())
    if (auto it = flat_name.find(p.value().unsafeGetTensorImpl()); it != flat_name.end())
      out.push_back({p.key(), "param/" + it->second});
  for (const auto& b : model.named_buffers())
    if (b.value().defined()) out.push_back({b.key(), "buffer/" + b.key()});
  return out;
}

// Every rank learns whether any rank failed; the failing ranks' own messages stay theirs.
void agree(comm::Communicator& world, const std::string& error, const std::string& what) {
  at::Tensor flag = at::full({1}, error.empty() ? 0 : world.rank() + 1, at::kInt);
  if (world.size() > 1) world.all_reduce(flag, {comm::ReduceOp::Max});
  const int failed = flag.item<int>();
  if (!error.empty()) throw CheckpointError(error);
  if (failed) throw CheckpointError(fmt::format("{} failed on rank {} (its message says why)", what, failed - 1));
}

// Each rank writes the slices its masters hold (replicated state once).
void write_sharded(Writer& w, const zero::Engine& engine, torch::optim::Optimizer* opt, int rank, json& scalars) {
  for (const Segment& s : segments_of(engine, rank)) {
    if (!s.writer) continue;
    w.add("param/" + s.name, s.shape, s.lo, s.values);
    if (!opt || !s.key.defined()) continue;
    auto* st = find_state(*opt, s.key);
    if (!st) continue;
    const zero::OptimizerState state = optimizer_row(opt)->export_state(*st);
    for (const auto& [sname, t] : state.tensors)
      w.add("optim/" + sname + "/" + s.name, s.shape, s.lo, t.reshape({-1}).narrow(0, s.key_offset, s.hi - s.lo));
    if (state.step) scalars["step/" + s.name] = *state.step;
  }
}

// Rank 0 writes every tensor whole. One flat parameter at a time is all-gathered over its shard group
// (values and optimizer state), so rank 0 holds at most one unit beyond its shards.
void write_full(Writer& w, const zero::Engine& engine, torch::optim::Optimizer* opt, int rank, json& scalars) {
  if (engine.plan().passthrough) return write_sharded(w, engine, opt, rank, scalars);  // one rank holds it all
  for (const auto& f : engine.flats()) {
    const sharding::FlatParam& fp = *f.flat_param;
    const auto& layout = fp.layout();
    const at::Tensor values = engine.whole_values(f, zero::Engine::Source::Master);
    std::vector<std::pair<std::string, at::Tensor>> states;
    std::optional<std::int64_t> step;
    if (opt && f.master.defined())
      if (auto* st = find_state(*opt, f.master)) {
        const zero::OptimizerState state = optimizer_row(opt)->export_state(*st);
        for (const auto& [sname, t] : state.tensors) states.emplace_back(sname, engine.whole(f, t));
        step = state.step;
      }
    if (rank != 0) continue;
    for (std::size_t i = 0; i < fp.params().size(); ++i) {
      const std::string& name = fp.names()[i];
      const std::vector<std::int64_t> shape = fp.params()[i].sizes().vec();
      const std::int64_t off = layout.offset(static_cast<int>(i)), n = fp.params()[i].numel();
      w.add("param/" + name, shape, 0, values.narrow(0, off, n));
      for (const auto& [sname, t] : states) w.add("optim/" + sname + "/" + name, shape, 0, t.narrow(0, off, n));
      if (step) scalars["step/" + name] = *step;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void write_state(const std::string& dir, const zero::Engine& engine, torch::nn::Module& model,
                 torch::optim::Optimizer* opt, const TrainingState& training, comm::Communicator& world, bool full) {
  const int rank = world.rank();
  std::string error;
  const zero::OptimizerRow* row = optimizer_row(opt);
  json scalars = json::object();
  try {
    c10::NoGradGuard ng;
    Writer w{dir, rank_file("shard", rank, ".bin"), {}, json::array()};
    if (full) {
      write_full(w, engine, opt, rank, scalars);
    } else {
      write_sharded(w, engine, opt, rank, scalars);
    }
    if (rank == 0)
      for (const auto& b : model.named_buffers())
        if (b.value().defined()) w.add("buffer/" + b.key(), b.value().sizes().vec(), 0, b.value().reshape({-1}));
    files::write_file_synced(dir + "/" + w.file, w.bytes.data(), w.bytes.size());

    const std::string part = json{{"slices", w.slices}, {"scalars", scalars}}.dump();
    files::write_file_synced(dir + "/" + rank_file("slices", rank, ".json"), part.data(), part.size());
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      at::Tensor rng = gen.get_state();
      files::write_file_synced(dir + "/" + rank_file("rng", rank, ".bin"), rng.data_ptr(), rng.numel());
    }
    if (const auto cuda = cuda_device_of(model)) {  // dropout on the device draws from its generator
      auto gen = at::globalContext().defaultGenerator(*cuda);
      std::lock_guard<std::mutex> lock(gen.mutex());
      at::Tensor rng = gen.get_state().contiguous();
      files::write_file_synced(dir + "/" + rank_file("rng_cuda", rank, ".bin"), rng.data_ptr(), rng.nbytes());
    }
  } catch (const std::exception& e) {
    error = fmt::format("rank {} could not write its part of {}: {}", rank, dir, e.what());
  }
  agree(world, error, fmt::format("writing the checkpoint {}", dir));

  if (rank == 0) {
    try {
      json tensors = json::object();
      json all_scalars = json::object();
      for (int r = 0; r < world.size(); ++r) {
        const std::string path = dir + "/" + rank_file("slices", r, ".json");
        const json part = json::parse(files::read_file(path));
        add_slice_records(tensors, part.at("slices"));
        for (const auto& [k, v] : part.at("scalars").items()) all_scalars[k] = v;
        ::unlink(path.c_str());
      }
      json objects = json::array();
      for (const auto& [name, bytes] : training.objects) {
        files::write_file_synced(dir + "/object_" + name + ".bin", bytes.data(), bytes.size());
        objects.push_back(name);
      }
      json loaders = json::array();
      for (const auto& l : training.loaders)
        loaders.push_back(
            {{"epoch", l.epoch}, {"batches_consumed", l.batches_consumed}, {"global_batch", l.global_batch}});
      json index = {{"format", kCheckpointFormat},
                    {"version", kCheckpointVersion},
                    {"world_size", world.size()},
                    {"strategy", zero::to_string(engine.spec().strategy)},
                    {"optimizer", {{"type", row ? row->name : ""}, {"scalars", all_scalars}}},
                    {"training",
                     {{"step", training.step},
                      {"micro_step", training.micro_step},
                      {"accumulation_steps", training.accumulation_steps},
                      {"scheduler_steps", training.scheduler_steps ? json(*training.scheduler_steps) : json(nullptr)},
                      {"lrs", training.lrs},
                      {"loaders", loaders},
                      {"loss_scaler", training.loss_scaler},
                      {"objects", objects}}},
                    {"state_dict", state_dict_keys(engine, model)},
                    {"tensors", tensors}};
      const std::string text = index.dump(1);
      files::write_file_synced(dir + "/index.json", text.data(), text.size());
    } catch (const std::exception& e) {
      error = fmt::format("rank 0 could not write {}/index.json: {}", dir, e.what());
    }
  }
  agree(world, error, fmt::format("writing the checkpoint index {}/index.json", dir));
}

SavedInfo read_info(const std::string& dir) {
  const json j = parse_index(dir);
  SavedInfo i;
  i.world_size = j.value("world_size", 0);
  i.strategy = j.value("strategy", "");
  if (j.contains("optimizer")) i.optimizer = j["optimizer"].value("type", "");
  return i;
}

TrainingState read_state(const std::string& dir, zero::Engine& engine, torch::nn::Module& model,
                         torch::optim::Optimizer* opt, comm::Communicator& world) {
  const int rank = world.rank();
  std::string error;
  json index;
  // Everything is read and checked first; nothing is applied until every rank has succeeded.
  struct Copy {
    at::Tensor dst, src;
  };
  std::vector<Copy> copies;
  struct NewState {
    at::Tensor key;
    std::map<std::string, at::Tensor> tensors;
    std::int64_t step = 0;
  };
  std::map<const void*, NewState> states;
  at::Tensor rng, rng_cuda;  // this rank's generator states, CPU and (training on a GPU) its device's
  TrainingState training;
  try {
    index = parse_index(dir);
    const auto entries = entries_of(index, dir);
    const std::string idx = dir + "/index.json";
    const std::string saved_type = index.at("optimizer").value("type", "");
    const json& scalars = index.at("optimizer").at("scalars");
    const zero::OptimizerRow* row = optimizer_row(opt);
    const std::string type = row ? row->name : "";
    bool has_state = false;
    for (const auto& [k, e] : entries) has_state = has_state || k.rfind("optim/", 0) == 0;
    if (opt && has_state && saved_type != type)
      throw CheckpointError(
          fmt::format("{}: the checkpoint holds {} state but the optimizer is {}", idx, saved_type, type));
    SliceReader reader(dir);
    std::set<std::string> model_names;  // every parameter the engine holds, on any rank
    for (const auto& f : engine.flats())
      for (const auto& n : f.flat_param->names()) model_names.insert(n);
    for (const Segment& s : segments_of(engine, rank)) {
      if (s.lo == s.hi) continue;  // an empty parameter: nothing to read (older checkpoints do not list it)
      auto it = entries.find("param/" + s.name);
      if (it == entries.end())
        throw CheckpointError(fmt::format("{}: parameter '{}' of the model is not in the checkpoint", idx, s.name));
      if (it->second.shape != s.shape)
        throw CheckpointError(fmt::format("{}: parameter '{}' is {} in the checkpoint but {} in the model", idx, s.name,
                                          c10::str(at::IntArrayRef(it->second.shape)),
                                          c10::str(at::IntArrayRef(s.shape))));
      copies.push_back({s.values, reader.range(it->first, it->second, s.lo, s.hi)});
      if (!opt || !s.key.defined()) continue;
      NewState& ns = states[s.key.unsafeGetTensorImpl()];
      ns.key = s.key;
      if (auto st = scalars.find("step/" + s.name); st != scalars.end()) ns.step = st->get<std::int64_t>();
      for (const auto& [k, e] : entries) {
        const std::string prefix = "optim/", suffix = "/" + s.name;
        if (k.rfind(prefix, 0) != 0 || k.size() <= suffix.size() ||
            k.compare(k.size() - suffix.size(), suffix.size(), suffix) != 0)
          continue;
        const std::string sname = k.substr(prefix.size(), k.size() - prefix.size() - suffix.size());
        if (sname.find('/') != std::string::npos) continue;  // a parameter whose name ends like this one
        at::Tensor& full = ns.tensors[sname];
        // (On the values' device: an offloaded optimizer's key is a meta tensor, its state staged on the CPU.)
        if (!full.defined()) full = at::zeros({s.key.numel()}, s.key.options().device(s.values.device()));
        copies.push_back({full.narrow(0, s.key_offset, s.hi - s.lo), reader.range(k, e, s.lo, s.hi)});
      }
    }
    // Strict, like load_state_dict: parameters the checkpoint has and the model lacks are an error too.
    for (const auto& [k, e] : entries)
      if (k.rfind("param/", 0) == 0 && !model_names.count(k.substr(6)))
        throw CheckpointError(
            fmt::format("{}: the checkpoint has parameter '{}', which the model does not", idx, k.substr(6)));
    for (const auto& b : model.named_buffers()) {
      if (!b.value().defined()) continue;
      auto it = entries.find("buffer/" + b.key());
      if (it == entries.end())
        throw CheckpointError(fmt::format("{}: buffer '{}' of the model is not in the checkpoint", idx, b.key()));
      if (it->second.shape != b.value().sizes().vec())
        throw CheckpointError(fmt::format("{}: buffer '{}' is {} in the checkpoint but {} in the model", idx, b.key(),
                                          c10::str(at::IntArrayRef(it->second.shape)), c10::str(b.value().sizes())));
      copies.push_back({b.value().view({-1}), reader.range(it->first, it->second, 0, b.value().numel())});
    }
    auto read_rng = [&](const char* kind) {
      const std::string path = dir + "/" + rank_file(kind, rank, ".bin");
      if (!files::is_file(path)) return at::Tensor();
      const std::string bytes = files::read_file(path);
      at::Tensor t = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
      std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
      return t;
    };
    rng = read_rng("rng");
    if (cuda_device_of(model)) rng_cuda = read_rng("rng_cuda");
    const json& t = index.at("training");
    training.step = t.at("step").get<std::int64_t>();
    training.micro_step = t.value("micro_step", std::int64_t{0});  // (older checkpoints: 0)
    training.accumulation_steps = t.value("accumulation_steps", std::int64_t{1});
    if (!t.at("scheduler_steps").is_null()) training.scheduler_steps = t.at("scheduler_steps").get<std::int64_t>();
    training.lrs = t.at("lrs").get<std::vector<double>>();
    for (const auto& l : t.at("loaders"))
      training.loaders.push_back({l.at("epoch").get<std::int64_t>(), l.at("batches_consumed").get<std::int64_t>(),
                                  l.value("global_batch", std::int64_t{0})});
    training.loss_scaler = t.at("loss_scaler").get<std::string>();
    for (const auto& name : t.at("objects")) {
      const std::string n = name.get<std::string>();
      training.objects[n] = files::read_file(dir + "/object_" + n + ".bin");
    }
  } catch (const json::exception& e) {
    error = fmt::format("{}/index.json: malformed: {}", dir, e.what());
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(world, error, fmt::format("loading the checkpoint {}", dir));

  c10::NoGradGuard ng;
  engine.wait_host_copies();  // host masters: no copy to the device still reads them
  engine.before_param_writes();
  for (auto& c : copies) c.dst.copy_(c.src);
  if (opt) {
    const zero::OptimizerRow* row = optimizer_row(opt);
    for (auto& [impl, ns] : states) {
      if (ns.tensors.empty() && !ns.step) {  // no state saved for it: as before its first step
        opt->state().erase(ns.key.unsafeGetTensorImpl());
        continue;
      }
      for (auto& [n, t] : ns.tensors) t = t.view(ns.key.sizes());
      opt->state()[ns.key.unsafeGetTensorImpl()] = row->import_state(ns.tensors, ns.step);
    }
  }
  if (rng.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(rng);
    } catch (const std::exception&) {
      // A state from another libtorch build: keep this rank's generator (the weights are loaded).
    }
  }
  if (rng_cuda.defined()) {  // saved on a device, loaded on one (a CPU run has no use for it)
    auto gen = at::globalContext().defaultGenerator(*cuda_device_of(model));
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(rng_cuda);
    } catch (const std::exception&) {
      // Another build's or another kind of device's generator: keep this one's.
    }
  }
  engine.params_from_masters();
  return training;
}

}  // namespace accel::checkpoint
