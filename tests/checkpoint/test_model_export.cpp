// save_model / load_model (src/checkpoint/model_export.h) on every rank of an mpirun: full weights of
// a prepared model under DDP, ZeRO-1/2/3 and FULL_SHARD equal the model's own (unsharded) state
// and load in Python's safetensors; sharded files + index; the gathered memory stays within one
// unit; Python-written files load into sharded models (masters included); bad checkpoints are errors
// naming the tensor and the file on every rank, not hangs.
#include "checkpoint/merge_weights.h"
#include "checkpoint/model_export.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_state.h"
#include "checkpoint/slice_format.h"

#include "base/files.h"
#include "base/memory.h"
#include "support/harness.h"
#include "support/python.h"
#include "support/scoped_env.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#ifndef ACCEL_PYTHON
#define ACCEL_PYTHON ""
#endif

namespace accel::checkpoint {
namespace {

using test::ModelKind;
using zero::ShardingSpec;

void rm_tree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      std::string p = path + "/" + n;
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        rm_tree(p);
      else
        ::unlink(p.c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

// One directory shared by every rank (rank 0 creates it, broadcasts its name, removes it at the end).
class SharedDir {
 public:
  SharedDir() {
    at::Tensor name = at::zeros({128}, at::kByte);
    if (test::world()->rank() == 0) {
      char tmpl[] = "/tmp/accel_model_export_XXXXXX";
      std::string p = ::mkdtemp(tmpl);
      std::memcpy(name.data_ptr(), p.data(), p.size());
    }
    test::world()->broadcast(name, {0});
    path_ = reinterpret_cast<const char*>(name.data_ptr());
  }
  ~SharedDir() {
    test::world()->barrier();
    if (test::world()->rank() == 0 && !std::getenv("ACCEL_KEEP_TEST_FILES")) rm_tree(path_);
  }
  std::string operator/(const std::string& n) const { return path_ + "/" + n; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

const std::string kInterop = std::string(ACCEL_SOURCE_DIR) + "/tests/checkpoint/safetensors_interop.py";
using accel::test::run_python;
bool have_python() { return accel::test::python_available(ACCEL_PYTHON); }

struct Case {
  const char* name;
  ShardingSpec spec;
};
std::vector<Case> strategies() {
  return {{"DDP", ShardingSpec::ddp()},
          {"ZeRO-1", ShardingSpec::zero(1)},
          {"ZeRO-2", ShardingSpec::zero(2)},
          {"ZeRO-3", ShardingSpec::zero(3)},
          {"FULL_SHARD", ShardingSpec::fsdp("FULL_SHARD")},
          {"HYBRID_SHARD", ShardingSpec::fsdp("HYBRID_SHARD")}};
}

struct Prepped {
  test::Model model;
  std::unique_ptr<torch::optim::Optimizer> user_opt;
  zero::EngineAndOptimizer p;
};

// A prepared model; `frozen_first`: the MLP's first layer does not train (a flat with no master).
// `extras`: a float buffer, a parameter of no elements and (GPT) a second name for the root's `pos`.
Prepped build(ModelKind kind, const ShardingSpec& spec, bool frozen_first = false, bool extras = false) {
  Prepped s;
  s.model = test::make_model(kind, at::kFloat);
  if (frozen_first)
    for (auto& kv : s.model.module->named_parameters())
      if (kv.key().rfind("fc0.", 0) == 0) kv.value().requires_grad_(false);
  if (extras) {
    torch::nn::Module& m = *s.model.module;
    m.register_buffer("stat", at::arange(3, at::kFloat) / 7);
    m.register_parameter("empty", at::zeros({0}));
    if (kind == ModelKind::GPT) m.register_parameter("pos_alias", m.named_parameters(/*recurse=*/false)["pos"]);
  }
  s.user_opt = test::make_optimizer(test::OptKind::AdamW, *s.model.module);
  s.p = zero::prepare(s.model.module, *s.user_opt, spec, test::world());
  return s;
}

void train(Prepped& s, ModelKind kind, int steps, c10::ScalarType dtype = at::kFloat) {
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = test::make_batch(kind, dtype, step, 0);
    s.p.engine->backward(s.model.loss(x, y));
    s.p.optimizer->step();
    s.p.optimizer->zero_grad();
  }
}

// The model's own state once the engine lets go of it (unshard: collective), as a name map.
std::vector<std::pair<std::string, at::Tensor>> unsharded_state(Prepped& s) {
  s.p.engine->unshard();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& kv : s.model.module->named_parameters()) out.emplace_back(kv.key(), kv.value().detach().clone());
  for (const auto& kv : s.model.module->named_buffers()) out.emplace_back(kv.key(), kv.value().detach().clone());
  return out;
}

::testing::AssertionResult same(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << c10::toString(a.scalar_type()) << a.sizes() << " vs "
                                         << c10::toString(b.scalar_type()) << b.sizes();
  if (!at::equal(a.contiguous(), b.contiguous()))
    return ::testing::AssertionFailure() << "max diff " << (a - b).abs().max().item<double>();
  return ::testing::AssertionSuccess();
}

// Every tensor of `state` is in the checkpoint at `path` with the same bytes, and nothing else.
void expect_checkpoint_equals(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& state) {
  ModelFiles mf = resolve_model_files(path);
  std::map<std::string, at::Tensor> got;
  for (const auto& f : mf.files) {
    auto file = SafetensorsFile::open(f);
    for (const auto& n : file.names()) got[n] = file.read(n);
  }
  EXPECT_EQ(got.size(), state.size());
  for (const auto& [n, t] : state) {
    auto it = got.find(n);
    if (it == got.end()) {
      ADD_FAILURE() << n << " missing from " << path;
      continue;
    }
    EXPECT_TRUE(same(it->second, t)) << n;
  }
}

// Every master element equals the file's value at that flat position (the optimizer restarts from it).
void expect_masters_match(const zero::Engine& e, const std::map<std::string, at::Tensor>& want) {
  for (const auto& f : e.flats()) {
    if (f.group < 0 || !f.master.defined()) continue;
    at::Tensor full = test::flatten_like(*f.flat_param, want, f.master.scalar_type());
    auto [b, end] = e.master_range(f);
    // Padding is not a parameter: compare the parameters' elements only.
    for (std::size_t i = 0; i < f.flat_param->params().size(); ++i) {
      const std::int64_t off = f.flat_param->layout().offset(i), n = f.flat_param->params()[i].numel();
      const std::int64_t lo = std::max(b, off), hi = std::min(end, off + n);
      if (lo < hi)
        EXPECT_TRUE(same(f.master.narrow(0, lo - b, hi - lo), full.narrow(0, lo, hi - lo))) << f.flat_param->names()[i];
    }
  }
}

// --- save_model ---------------------------------------------------------------------------------

TEST(SaveModel, FullWeightsEqualTheUnshardedModelAndLoadInPython) {
  SharedDir dir;
  const int rank = test::world()->rank();
  for (const auto& c : strategies()) {
    SCOPED_TRACE(c.name);
    Prepped s = build(ModelKind::GPT, c.spec);
    train(s, ModelKind::GPT, 2);
    const std::string out = dir / (std::string("gpt_") + c.name);
    SaveModelResult r = save_model(*s.p.engine, *s.model.module, out);
    EXPECT_EQ(r.files, std::vector<std::string>{"model.safetensors"});
    auto ref = unsharded_state(s);
    if (rank == 0) {
      expect_checkpoint_equals(out, ref);
      write_safetensors(dir / (std::string("ref_") + c.name + ".safetensors"), ref);
      EXPECT_EQ(list_dir(out), std::vector<std::string>{"model.safetensors"});
      auto f = SafetensorsFile::open(out + "/model.safetensors");
      EXPECT_EQ(f.metadata().at("format"), "pt");
      if (have_python()) {
        auto [rc, msg] =
            run_python(ACCEL_PYTHON, kInterop,
                       "compare '" + out + "' '" + dir / (std::string("ref_") + c.name + ".safetensors") + "'");
        EXPECT_EQ(rc, 0) << msg;
        std::printf("[%s np%d] python: %s", c.name, test::world()->size(), msg.c_str());
      }
    }
    test::world()->barrier();
  }
}

TEST(SaveModel, ShardedFilesWithIndexThenBackToOneFile) {
  SharedDir dir;
  const int rank = test::world()->rank();
  Prepped s = build(ModelKind::GPT, ShardingSpec::zero(3));
  train(s, ModelKind::GPT, 1);
  const std::string out = dir / "sharded";
  // Small enough to force several files.
  SaveModelResult r = save_model(*s.p.engine, *s.model.module, out, 2000);
  ASSERT_GT(r.files.size(), 2u);
  for (std::size_t k = 0; k < r.files.size(); ++k) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", k + 1, r.files.size());
    EXPECT_EQ(r.files[k], want);
  }
  if (rank == 0) {
    auto names = list_dir(out);
    EXPECT_EQ(names.size(), r.files.size() + 1);
    EXPECT_TRUE(std::count(names.begin(), names.end(), "model.safetensors.index.json"));
    std::ifstream in(out + "/model.safetensors.index.json");
    std::stringstream ss;
    ss << in.rdbuf();
    auto idx = nlohmann::json::parse(ss.str());
    EXPECT_EQ(idx["metadata"]["total_size"].get<std::int64_t>(), r.total_bytes);
    std::int64_t sum = 0;
    for (const auto& f : r.files) {
      auto file = SafetensorsFile::open(out + "/" + f);
      sum += static_cast<std::int64_t>(file.header().data_size);
      for (const auto& n : file.names()) EXPECT_EQ(idx["weight_map"][n].get<std::string>(), f) << n;
      // No file exceeds the limit unless it holds a single tensor larger than the limit.
      if (file.names().size() > 1) EXPECT_LE(file.header().data_size, 2000u) << f;
    }
    EXPECT_EQ(sum, r.total_bytes);
  }
  // Saving again with room for everything: one file, the shards and the index are gone.
  SaveModelResult r2 = save_model(*s.p.engine, *s.model.module, out);
  EXPECT_EQ(r2.files, std::vector<std::string>{"model.safetensors"});
  auto ref = unsharded_state(s);
  if (rank == 0) {
    EXPECT_EQ(list_dir(out), std::vector<std::string>{"model.safetensors"});
    expect_checkpoint_equals(out, ref);
  }
  test::world()->barrier();
}

TEST(SaveModel, ShardedFilesLoadInPython) {
  if (!have_python()) GTEST_SKIP() << "ACCEL_PYTHON not configured";
  SharedDir dir;
  Prepped s = build(ModelKind::GPT, ShardingSpec::fsdp("FULL_SHARD"));
  train(s, ModelKind::GPT, 1);
  SaveModelResult r = save_model(*s.p.engine, *s.model.module, dir / "sharded", 6000);
  auto ref = unsharded_state(s);
  if (test::world()->rank() == 0) {
    write_safetensors(dir / "ref.safetensors", ref);
    auto [rc, msg] =
        run_python(ACCEL_PYTHON, kInterop, "compare '" + dir / "sharded" + "' '" + dir / "ref.safetensors" + "'");
    EXPECT_EQ(rc, 0) << msg;
    EXPECT_NE(msg.find("index checked"), std::string::npos) << msg;
    std::printf("[FULL_SHARD np%d, %zu files] python: %s", test::world()->size(), r.files.size(), msg.c_str());
  }
}

// Rank 0 never holds more than one unit beyond its shard: the counting allocator's peak of gathered
// bytes during save_model, above what was gathered before (ZeRO-3's root unit), stays within the
// largest unit, which is a fraction of the model.
TEST(SaveModel, GatheredMemoryStaysWithinOneUnit) {
  // Private shards, all-gathered around each use: what this test counts (node-shared parameters,
  // the default on one node, gather nothing).
  accel::test::ScopedEnv private_shards("ACCEL_NODE_SHARED_PARAMS", "0");
  SharedDir dir;
  Prepped s = build(ModelKind::GPT, ShardingSpec::zero(3));
  train(s, ModelKind::GPT, 1);
  ASSERT_TRUE(memory::counting_installed());
  const std::int64_t before = memory::snapshot()[memory::Category::Gathered].current;
  memory::reset_peaks();
  SaveModelResult r = save_model(*s.p.engine, *s.model.module, dir / "mem");
  const std::int64_t peak = memory::snapshot()[memory::Category::Gathered].peak - before;
  std::printf(
      "[rank %d np%d] gathered during save_model: peak %lld bytes (own count %lld), largest unit %lld, "
      "model %lld\n",
      test::world()->rank(), test::world()->size(), static_cast<long long>(peak),
      static_cast<long long>(r.peak_gathered_bytes), static_cast<long long>(r.largest_unit_bytes),
      static_cast<long long>(r.total_bytes));
  EXPECT_LE(peak, r.largest_unit_bytes);
  EXPECT_LE(r.peak_gathered_bytes, r.largest_unit_bytes);
  EXPECT_LT(r.largest_unit_bytes * 2, r.total_bytes);  // the bound means something: units are small
  if (test::world()->size() > 1) EXPECT_GT(peak, 0);   // units were gathered, and counted
}

// bf16 compute over fp32 masters: the file holds the fp32 masters (the compute copy is their
// rounding), and loading it restores both.
TEST(SaveModel, MastersInAnotherDtypeAreWhatIsSaved) {
  SharedDir dir;
  for (const auto& c : strategies()) {
    SCOPED_TRACE(c.name);
    ShardingSpec spec = c.spec;
    spec.param_dtype = at::kBFloat16;
    Prepped s = build(ModelKind::MLP, spec);
    train(s, ModelKind::MLP, 2, at::kBFloat16);  // (no autocast yet: the batch is bf16 too)
    const std::string out = dir / (std::string("bf16_") + c.name);
    save_model(*s.p.engine, *s.model.module, out, 300);  // several files
    std::map<std::string, at::Tensor> saved;
    for (const auto& f : resolve_model_files(out).files) {
      auto file = SafetensorsFile::open(f);
      for (const auto& n : file.names()) saved[n] = file.read(n);
    }
    for (const auto& [n, t] : saved) EXPECT_EQ(t.scalar_type(), at::kFloat) << n;
    expect_masters_match(*s.p.engine, saved);  // what the optimizer steps, bit for bit
    auto compute = unsharded_state(s);
    for (const auto& [n, t] : compute) EXPECT_TRUE(same(t, saved.at(n).to(at::kBFloat16))) << n;
    // Loading restores the fp32 masters exactly and the bf16 compute copies as their rounding.
    Prepped s2 = build(ModelKind::MLP, spec);
    load_model(*s2.p.engine, *s2.model.module, out);
    expect_masters_match(*s2.p.engine, saved);
    for (const auto& [n, t] : unsharded_state(s2)) EXPECT_TRUE(same(t, saved.at(n).to(at::kBFloat16))) << n;
    // compute_dtype (DeepSpeed's gather_16bit_weights_on_model_save): the bf16 compute copies instead.
    SaveModelOptions o16;
    o16.compute_dtype = true;
    save_model(*s.p.engine, *s.model.module, out + "_16bit", 300, o16);
    std::map<std::string, at::Tensor> saved16;
    for (const auto& f : resolve_model_files(out + "_16bit").files) {
      auto file = SafetensorsFile::open(f);
      for (const auto& n : file.names()) saved16[n] = file.read(n);
    }
    ASSERT_EQ(saved16.size(), saved.size());
    for (const auto& [n, t] : compute) {
      EXPECT_EQ(saved16.at(n).scalar_type(), at::kBFloat16) << n;
      EXPECT_TRUE(same(t, saved16.at(n))) << n;
    }
  }
}

// --- load_model ---------------------------------------------------------------------------------

TEST(LoadModel, PythonWrittenFileIntoShardedModels) {
  if (!have_python()) GTEST_SKIP() << "ACCEL_PYTHON not configured";
  SharedDir dir;
  const int rank = test::world()->rank();
  for (ModelKind kind : {ModelKind::GPT, ModelKind::MLP}) {
    const bool frozen = kind == ModelKind::MLP;  // the MLP's first layer is frozen: no master
    // The source: this model's weights after a step, transformed and written by Python.
    {
      Prepped s = build(kind, ShardingSpec::ddp(), frozen);
      train(s, kind, 1);
      auto st = unsharded_state(s);
      if (rank == 0) {
        write_safetensors(dir / "src.safetensors", st);
        auto [rc, msg] = run_python(ACCEL_PYTHON, kInterop,
                                    "perturb '" + dir / "src.safetensors" + "' '" + dir / "py.safetensors" + "'");
        ASSERT_EQ(rc, 0) << msg;
      }
      test::world()->barrier();
    }
    std::map<std::string, at::Tensor> want;
    {
      auto f = SafetensorsFile::open(dir / "py.safetensors");
      for (const auto& n : f.names()) want[n] = f.read(n);
    }
    for (const auto& c : strategies()) {
      SCOPED_TRACE(std::string(test::name(kind)) + " " + c.name);
      Prepped s = build(kind, c.spec, frozen);
      LoadModelResult r = load_model(*s.p.engine, *s.model.module, dir / "py.safetensors");
      EXPECT_EQ(r.tensors, static_cast<std::int64_t>(want.size()));
      expect_masters_match(*s.p.engine, want);
      // Sharded strategies read about 1/world of the parameters (plus buffers and the root unit).
      if (c.spec.shards_optimizer() && test::world()->size() > 1) {
        std::uint64_t total = 0;
        for (auto& [n, t] : want) total += t.nbytes();
        EXPECT_LT(r.bytes_read, total) << "read everything on a sharded model";
      }
      // Training works from the loaded state (the compute copies agree with the masters) ...
      train(s, kind, 1);
      // ... and before training, the state equals the file: check on a fresh load.
      Prepped s2 = build(kind, c.spec, frozen);
      load_model(*s2.p.engine, *s2.model.module, dir / "py.safetensors");
      for (const auto& [n, t] : unsharded_state(s2)) EXPECT_TRUE(same(t, want.at(n))) << n;
    }
  }
}

TEST(LoadModel, SaveUnderOneStrategyLoadUnderAnother) {
  SharedDir dir;
  Prepped a = build(ModelKind::GPT, ShardingSpec::zero(3));
  train(a, ModelKind::GPT, 3);
  save_model(*a.p.engine, *a.model.module, dir / "z3", 2000);  // several files + index
  auto ref = unsharded_state(a);
  for (const auto& c : strategies()) {
    SCOPED_TRACE(c.name);
    Prepped b = build(ModelKind::GPT, c.spec);
    load_model(*b.p.engine, *b.model.module, dir / "z3");
    for (const auto& [n, t] : unsharded_state(b)) {
      auto it = std::find_if(ref.begin(), ref.end(), [&](auto& kv) { return kv.first == n; });
      ASSERT_NE(it, ref.end()) << n;
      EXPECT_TRUE(same(t, it->second)) << n;
    }
  }
}

// Bad checkpoints: an error on every rank naming the tensor and the file; the model is untouched.
TEST(LoadModel, BadCheckpointsAreNamedOnEveryRank) {
  SharedDir dir;
  const int rank = test::world()->rank();
  Prepped s = build(ModelKind::MLP, ShardingSpec::zero(3));
  std::vector<std::pair<std::string, at::Tensor>> good;
  for (const auto& kv : s.model.module->named_parameters()) good.emplace_back(kv.key(), at::randn(kv.value().sizes()));
  auto variant = [&](const std::string& file, auto edit) {
    auto t = good;
    edit(t);
    if (rank == 0) write_safetensors(dir / file, t);
  };
  variant("missing.safetensors", [](auto& t) { t.erase(t.begin() + 1); });
  variant("extra.safetensors", [](auto& t) { t.emplace_back("ghost.weight", at::zeros({2})); });
  std::size_t m = 0;  // a matrix
  while (good[m].second.dim() < 2) ++m;
  variant("shape.safetensors", [m](auto& t) { t[m].second = at::zeros({t[m].second.numel()}); });
  variant("dtype.safetensors", [](auto& t) { t[0].second = t[0].second.to(at::kLong); });
  if (rank == 0) {
    ::mkdir((dir / "badindex").c_str(), 0755);
    std::ofstream(dir / "badindex/model.safetensors.index.json")
        << R"({"metadata": {"total_size": 4}, "weight_map": {"fc0.weight": "model-00001-of-00002.safetensors"}})";
    ::mkdir((dir / "empty").c_str(), 0755);
    std::ofstream(dir / "corrupt.safetensors") << "\x10\0\0\0\0\0\0\0{\"a\":";
  }
  test::world()->barrier();
  const std::string name1 = good[1].first, name0 = good[0].first, namem = good[m].first;
  struct Bad {
    std::string path;
    std::vector<std::string> parts;
  };
  const std::vector<Bad> bad = {
      {dir / "missing.safetensors", {"no tensor '" + name1 + "'", dir / "missing.safetensors"}},
      {dir / "extra.safetensors", {"'ghost.weight'", "not a parameter or buffer", dir / "extra.safetensors"}},
      {dir / "shape.safetensors", {"'" + namem + "'", "shape", dir / "shape.safetensors"}},
      {dir / "dtype.safetensors", {"'" + name0 + "'", "I64", dir / "dtype.safetensors"}},
      {dir / "badindex", {"model-00001-of-00002.safetensors", "does not exist"}},
      {dir / "empty", {dir / "empty", "neither"}},
      {dir / "nothere", {dir / "nothere"}},
      {dir / "corrupt.safetensors", {dir / "corrupt.safetensors"}},
  };
  auto before = unsharded_state(s);  // the engine is detached afterwards: build a new one for loads
  for (const auto& b : bad) {
    SCOPED_TRACE(b.path);
    Prepped t = build(ModelKind::MLP, ShardingSpec::zero(3));
    try {
      load_model(*t.p.engine, *t.model.module, b.path);
      ADD_FAILURE() << "loaded a bad checkpoint";
    } catch (const std::exception& e) {
      for (const auto& p : b.parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
    // Untouched: still the initial weights (same seed as `before`).
    for (const auto& [n, v] : unsharded_state(t)) {
      auto it = std::find_if(before.begin(), before.end(), [&](auto& kv) { return kv.first == n; });
      EXPECT_TRUE(same(v, it->second)) << n;
    }
  }
}

TEST(SaveModel, BadArgumentsAndUnwritableDirectory) {
  Prepped s = build(ModelKind::MLP, ShardingSpec::zero(2));
  EXPECT_THROW(save_model(*s.p.engine, *s.model.module, "/tmp/x", 0), std::invalid_argument);
  // A path under a regular file cannot be created: an error on every rank, no hang.
  SharedDir dir;
  if (test::world()->rank() == 0) std::ofstream(dir / "file") << "x";
  test::world()->barrier();
  try {
    save_model(*s.p.engine, *s.model.module, dir / "file/sub");
    ADD_FAILURE() << "saved under a file";
  } catch (const std::runtime_error& e) {
    if (test::world()->rank() == 0) EXPECT_NE(std::string(e.what()).find(dir / "file"), std::string::npos) << e.what();
  }
}

// --- merge_weights ------------------------------------------------------------------------------

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The directories hold the same files with the same bytes.
::testing::AssertionResult same_files(const std::string& a, const std::string& b) {
  const auto la = list_dir(a), lb = list_dir(b);
  if (la != lb || la.empty())
    return ::testing::AssertionFailure() << a << " holds " << la.size() << " files, " << b << " " << lb.size();
  for (const auto& n : la)
    if (file_bytes(a + "/" + n) != file_bytes(b + "/" + n)) return ::testing::AssertionFailure() << n << " differs";
  return ::testing::AssertionSuccess();
}

// A save_state checkpoint of any strategy, merged offline on one rank, gives the files save_model
// writes at the same point, byte for byte: sharded or full, in one file or several, the masters (fp32
// over a bf16 model) or with dtype bf16 the compute copies (the buffer kept in fp32); a frozen
// parameter (a flat without master), a parameter of no elements and (GPT) a tied second name too.
TEST(MergeWeights, GivesTheFilesSaveModelWritesUnderEveryStrategy) {
  SharedDir dir;
  const int rank = test::world()->rank();
  for (bool bf16 : {false, true})
    for (const auto& c : strategies()) {
      const std::string tag = std::string(bf16 ? "bf16_" : "fp32_") + c.name;
      SCOPED_TRACE(tag);
      ShardingSpec spec = c.spec;
      if (bf16) spec.param_dtype = at::kBFloat16;
      const ModelKind kind = bf16 ? ModelKind::MLP : ModelKind::GPT;
      Prepped s = build(kind, spec, /*frozen_first=*/bf16, /*extras=*/true);
      train(s, kind, 2, bf16 ? at::kBFloat16 : at::kFloat);
      const std::string ck = dir / ("ck_" + tag), full = dir / ("full_" + tag);
      if (rank == 0) {
        files::make_dirs(ck);
        files::make_dirs(full);
      }
      test::world()->barrier();
      TrainingState training;
      training.step = 2;
      write_state(ck, *s.p.engine, *s.model.module, s.p.optimizer.get(), training, *test::world());
      write_state(full, *s.p.engine, *s.model.module, s.p.optimizer.get(), training, *test::world(), /*full=*/true);
      save_model(*s.p.engine, *s.model.module, dir / ("model_" + tag));
      const SaveModelResult several = save_model(*s.p.engine, *s.model.module, dir / ("model300_" + tag), 300);
      SaveModelOptions o16;
      o16.compute_dtype = true;
      if (bf16) save_model(*s.p.engine, *s.model.module, dir / ("model16_" + tag), 300, o16);
      if (rank == 0) {
        const MergeResult r = merge_weights(ck, dir / ("m_" + tag));
        EXPECT_TRUE(same_files(dir / ("m_" + tag), dir / ("model_" + tag)));
        EXPECT_EQ(r.world_size, test::world()->size());
        EXPECT_EQ(r.step, 2);
        EXPECT_GT(r.bytes_read, 0u);
        merge_weights(full, dir / ("mf_" + tag));
        EXPECT_TRUE(same_files(dir / ("mf_" + tag), dir / ("model_" + tag)));
        MergeOptions small;
        small.max_shard_size = 300;
        const MergeResult r300 = merge_weights(ck, dir / ("m300_" + tag), small);
        EXPECT_GT(several.files.size(), 2u);
        EXPECT_EQ(r300.files, several.files);
        EXPECT_TRUE(same_files(dir / ("m300_" + tag), dir / ("model300_" + tag)));  // the index too
        if (bf16) {
          small.dtype = at::kBFloat16;
          merge_weights(ck, dir / ("m16_" + tag), small);
          EXPECT_TRUE(same_files(dir / ("m16_" + tag), dir / ("model16_" + tag)));
        }
      }
      test::world()->barrier();
    }
}

// Bad input is an error naming what is wrong, and a failed merge leaves the output as it was.
TEST(MergeWeights, BadCheckpointsAreErrorsNamingTheFile) {
  SharedDir dir;
  Prepped s = build(ModelKind::MLP, ShardingSpec::zero(3));
  train(s, ModelKind::MLP, 1);
  const std::string ck = dir / "project/checkpoints/checkpoint_3";
  if (test::world()->rank() == 0) files::make_dirs(ck);
  test::world()->barrier();
  write_state(ck, *s.p.engine, *s.model.module, s.p.optimizer.get(), TrainingState{}, *test::world());
  if (test::world()->rank() != 0) return;
  auto expect_error = [&](const std::string& from, const std::string& to, const std::vector<std::string>& parts,
                          const MergeOptions& o = {}) {
    try {
      merge_weights(from, to, o);
      ADD_FAILURE() << "merged " << from;
    } catch (const std::exception& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  // Not a checkpoint: a project directory names its newest checkpoint, and so does its checkpoints/.
  expect_error(dir / "project", dir / "out", {"no index.json", ck});
  expect_error(dir / "project/checkpoints", dir / "out", {"no index.json", ck});
  expect_error(dir / "nothere", dir / "out", {dir / "nothere"});
  files::make_dirs(ck + "/sub");
  ASSERT_EQ(::symlink((ck + "/sub").c_str(), (dir / "into_ck").c_str()), 0);  // "into_ck/.." is ck
  for (const std::string& inside :
       {ck, ck + "/hf", ck + "/new/..", dir / "project/checkpoints/./checkpoint_3/x", dir / "into_ck/../hf"})
    expect_error(ck, inside, {"inside the checkpoint"});
  EXPECT_FALSE(files::exists(ck + "/hf"));
  MergeOptions to_int;
  to_int.dtype = at::kLong;
  expect_error(ck, dir / "out", {"floating-point"}, to_int);
  MergeOptions zero;
  zero.max_shard_size = 0;
  expect_error(ck, dir / "out", {"max_shard_size"}, zero);
  EXPECT_FALSE(files::exists(dir / "out"));

  // An earlier merge in the output directory stays as it was when a later one fails.
  merge_weights(ck, dir / "out");
  const std::string good = file_bytes(dir / "out/model.safetensors");

  // A checkpoint from before index.json recorded the state_dict order: the same tensors, by name (in one
  // file, laid out by size and name, the same bytes).
  const std::string old_ck = dir / "old";
  files::make_dirs(old_ck);
  nlohmann::json index = parse_index(ck);
  ASSERT_TRUE(index.contains("state_dict"));
  index.erase("state_dict");
  for (const auto& n : list_dir(ck))
    if (n != "index.json") std::ofstream(old_ck + "/" + n, std::ios::binary) << file_bytes(ck + "/" + n);
  std::ofstream(old_ck + "/index.json") << index.dump();
  merge_weights(old_ck, dir / "out_old");
  EXPECT_EQ(file_bytes(dir / "out_old/model.safetensors"), good);

  // A slice listed twice: malformed, not merged.
  nlohmann::json twice = parse_index(ck);
  for (auto& [key, e] : twice["tensors"].items())
    if (key.rfind("param/", 0) == 0 && e["slices"].size() >= 1) {
      e["slices"].push_back(e["slices"][0]);
      break;
    }
  std::ofstream(old_ck + "/index.json", std::ios::trunc) << twice.dump();
  expect_error(old_ck, dir / "deep/a/b", {"more than one slice"});
  EXPECT_FALSE(files::exists(dir / "deep"));  // every directory the failed merge created is gone
  // A byte of a parameter's slice in shard_0.bin (the optimizer's slices are not read).
  const std::string shard = ck + "/shard_0.bin";
  std::uint64_t at_byte = 0;
  bool found = false;
  for (const auto& [key, e] : entries_of(parse_index(ck), ck))
    for (const Slice& sl : e.slices)
      if (!found && key.rfind("param/", 0) == 0 && sl.file == "shard_0.bin" && sl.bytes > 0) {
        at_byte = sl.offset + sl.bytes / 2;
        found = true;
      }
  ASSERT_TRUE(found);
  std::string bytes = file_bytes(shard);
  bytes[at_byte] ^= 0x10;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  expect_error(ck, dir / "out", {shard, "CRC32"});
  expect_error(ck, dir / "out_new", {shard, "CRC32"});
  EXPECT_FALSE(files::exists(dir / "out_new"));  // created by the failed merge, and removed
  EXPECT_EQ(file_bytes(dir / "out/model.safetensors"), good);
  EXPECT_EQ(list_dir(dir / "out"), std::vector<std::string>{"model.safetensors"});
  ASSERT_EQ(::truncate(shard.c_str(), static_cast<off_t>(at_byte)), 0);
  expect_error(ck, dir / "out", {shard, "truncated"});
  EXPECT_EQ(file_bytes(dir / "out/model.safetensors"), good);
}

}  // namespace
}  // namespace accel::checkpoint
