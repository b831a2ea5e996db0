// Big-model inference (src/dispatch/): init_empty_weights, infer_auto_device_map against maps
// computed by hand, load_checkpoint_and_dispatch against the fully loaded model (bitwise), its errors,
// and Accelerator::prepare's refusal. One process.
#include "accelerator/accelerator.h"
#include "base/files.h"
#include "base/memory.h"
#include "dispatch/dispatch.h"
#include "dispatch/stack_model.h"
#include "models/gpt.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

namespace accel::test {
namespace {

constexpr int64_t kD = 16;
// Bytes of one Linear(d, d) in fp32, of one block (two of them), of the model's own part (in, out).
int64_t linear_bytes(int64_t d) { return (d * d + d) * 4; }
int64_t unit_bytes(int64_t d) { return 2 * linear_bytes(d); }

std::string place_of(const DeviceMap& map, const std::string& tensor) {
  std::string n = tensor;
  while (true) {
    if (auto it = map.find(n); it != map.end()) return it->second;
    if (n.empty()) return "";
    auto dot = n.rfind('.');
    n = dot == std::string::npos ? "" : n.substr(0, dot);
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// ---------------------------------------------------------------------------------------------------
// infer_auto_device_map

TEST(DeviceMap, ParsesSizesAndPlaces) {
  EXPECT_EQ(parse_size("2GB"), 2'000'000'000);
  EXPECT_EQ(parse_size("1.5GiB"), 1'610'612'736);
  EXPECT_EQ(parse_size("300 MB"), 300'000'000);
  EXPECT_EQ(parse_size("4096"), 4096);
  EXPECT_THROW(parse_size("2 parsecs"), std::invalid_argument);
  auto m = parse_max_memory("cpu=2GB, cuda:1=1KiB,0=5");
  EXPECT_EQ(m.at("cpu"), 2'000'000'000);
  EXPECT_EQ(m.at("cuda:1"), 1024);
  EXPECT_EQ(m.at("cuda:0"), 5);
  EXPECT_THROW(parse_max_memory("tpu=1GB"), std::invalid_argument);
}

TEST(DeviceMap, HandComputedSmallModel) {
  auto model = std::make_shared<StackImpl>(kD, 4);
  const int64_t u = unit_bytes(kD), root = 2 * linear_bytes(kD);
  // Everything fits: one entry.
  EXPECT_EQ(infer_auto_device_map(*model, {{"cpu", root + 4 * u}}), (DeviceMap{{"", "cpu"}}));
  // Room for the root and two units (plus a little): units spill to disk, so the cpu keeps room for
  // the largest one (paged in while it runs): one unit stays, three go to disk.
  DeviceMap expect{{"in", "cpu"}, {"l0", "cpu"}, {"l1", "disk"}, {"l2", "disk"}, {"l3", "disk"}, {"out", "cpu"}};
  EXPECT_EQ(infer_auto_device_map(*model, {{"cpu", root + 2 * u + 100}}), expect);
  EXPECT_EQ(infer_auto_device_map(*model, {{"cpu", root + 2 * u + 100}}, {}, "sequential"), expect);
  // Exactly the root: every unit on disk (the reserve cannot go below zero).
  EXPECT_EQ(infer_auto_device_map(*model, {{"cpu", root}}),
            (DeviceMap{{"in", "cpu"}, {"l0", "disk"}, {"l1", "disk"}, {"l2", "disk"}, {"l3", "disk"}, {"out", "cpu"}}));
  // GPUs first, in order, then the cpu; the model's own part on the first device (the main one).
  EXPECT_EQ(
      infer_auto_device_map(*model, {{"cuda:1", u}, {"cuda:0", root + 2 * u}, {"cpu", u}}, {}, "sequential"),
      (DeviceMap{
          {"in", "cuda:0"}, {"l0", "cuda:0"}, {"l1", "cuda:0"}, {"l2", "cuda:1"}, {"l3", "cpu"}, {"out", "cuda:0"}}));
  // Two GPUs, "balanced": the first holds at most ceil(5u / 2) + u = 3.5u in all (the root's u
  // included), so two units; "sequential" fills the first.
  const MaxMemory two_gpus{{"cuda:0", 100 * u}, {"cuda:1", 100 * u}, {"cpu", 100 * u}};
  EXPECT_EQ(infer_auto_device_map(*model, two_gpus, {}, "balanced"), (DeviceMap{{"in", "cuda:0"},
                                                                                {"l0", "cuda:0"},
                                                                                {"l1", "cuda:0"},
                                                                                {"l2", "cuda:1"},
                                                                                {"l3", "cuda:1"},
                                                                                {"out", "cuda:0"}}));
  EXPECT_EQ(infer_auto_device_map(*model, two_gpus, {}, "auto"),
            infer_auto_device_map(*model, two_gpus, {}, "balanced"));
  EXPECT_EQ(infer_auto_device_map(*model, two_gpus, {}, "sequential"), (DeviceMap{{"", "cuda:0"}}));
  // The model's own part fits nowhere: refused, saying why.
  EXPECT_NE(error_of([&] {
              infer_auto_device_map(*model, {{"cpu", root - 1}});
            }).find("outside its units"),
            std::string::npos);
  EXPECT_THROW(infer_auto_device_map(*model, {{"cpu", root}}, {}, "greedy"), std::invalid_argument);
  // A dtype halves every size: two units now fit where one did.
  auto half = infer_auto_device_map(*model, {{"cpu", (root + 2 * u + 100) / 2 + u / 2}}, {}, "auto", at::kBFloat16);
  EXPECT_EQ(half.at("l1"), "cpu");
  EXPECT_EQ(half.at("l2"), "disk");
}

TEST(DeviceMap, NeverSplitsANoSplitModule) {
  // Six units in three StackPair modules: with no_split, both units of a pair always share a place;
  // without, some budget separates them (so the check below can fail).
  auto model = std::make_shared<StackImpl>(kD, 6, /*pairs=*/true);
  const int64_t u = unit_bytes(kD), root = 2 * linear_bytes(kD);
  auto split_somewhere = [&](const std::vector<std::string>& no_split) {
    int splits = 0;
    for (int64_t budget = root; budget <= root + 7 * u; budget += 97) {
      DeviceMap m = infer_auto_device_map(*model, {{"cpu", budget}}, no_split);
      for (int p = 0; p < 3; ++p) {
        const std::string a = place_of(m, "p" + std::to_string(p) + ".first.a.weight");
        const std::string b = place_of(m, "p" + std::to_string(p) + ".second.b.bias");
        EXPECT_FALSE(a.empty());
        if (a != b) ++splits;
      }
    }
    return splits;
  };
  EXPECT_EQ(split_somewhere({"StackPair"}), 0);
  EXPECT_EQ(split_somewhere({"StackPairImpl"}), 0);
  EXPECT_GT(split_somewhere({}), 0);
  // A pair is placed as one group of two units' bytes.
  auto plan = plan_model(*model, {"StackPair"});
  ASSERT_EQ(plan.groups.size(), 3u);
  EXPECT_EQ(plan.groups[0].name, "p0");
  EXPECT_EQ(plan.groups[0].bytes, 2 * u);
  EXPECT_EQ(plan.rest_bytes, root);
}

// ---------------------------------------------------------------------------------------------------
// UnitHooks::input_device: the Unit moves tensor arguments to the device its hooks name (checked on
// the meta device, which every build has).

struct ProbeImpl : torch::nn::Module {
  at::Tensor forward(at::Tensor x, std::vector<at::Tensor> xs, int k) {
    seen = {x.device(), xs.at(0).device()};
    return x.narrow(0, 0, k);
  }
  std::vector<at::Device> seen;
};
struct MovingHooks : sharding::UnitHooks {
  explicit MovingHooks(std::optional<at::Device> d) : device(d) {}
  void pre_forward() override { ++pre; }
  void post_forward(std::vector<at::Tensor>&) override { ++post; }
  void post_forward_untracked() override { ++post; }
  std::optional<c10::Device> input_device() const override { return device; }
  std::optional<at::Device> device;
  int pre = 0, post = 0;
};

TEST(DispatchUnit, MovesTensorArgumentsToTheHooksDevice) {
  auto probe = accel::unit(std::make_shared<ProbeImpl>());
  auto hooks = std::make_shared<MovingHooks>(at::Device(at::kMeta));
  sharding::find_unit(probe.ptr().get())->hooks = hooks;
  at::Tensor y = probe(at::ones({3}), std::vector<at::Tensor>{at::zeros({1})}, 2);
  EXPECT_EQ(probe->seen, (std::vector<at::Device>{at::kMeta, at::kMeta}));
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.size(0), 2);
  EXPECT_EQ(hooks->pre, 1);
  EXPECT_EQ(hooks->post, 1);
  hooks->device.reset();  // no device: arguments as they are
  probe(at::ones({3}), std::vector<at::Tensor>{at::zeros({1})}, 1);
  EXPECT_EQ(probe->seen, (std::vector<at::Device>{at::kCPU, at::kCPU}));
}

// ---------------------------------------------------------------------------------------------------
// init_empty_weights

TEST(EmptyWeights, ParametersHoldNoMemory) {
  memory::install_counting_allocator();
  const int64_t d = 256, layers = 8;
  const int64_t u = unit_bytes(d), root = 2 * linear_bytes(d);
  memory::reset_peaks();
  const auto before = memory::snapshot().total;
  std::shared_ptr<StackImpl> model = make_empty<StackImpl>(d, layers);
  const auto after = memory::snapshot().total;
  // Construction held the model's own part and one unit at a time, never the whole model ...
  EXPECT_LE(after.peak - before.current, root + u + 64 * 1024) << "peak while building";
  // ... and the built model holds none of its parameters.
  EXPECT_LE(after.current - before.current, 64 * 1024);
  std::printf("model %.2f MiB: built under init_empty_weights with at most %.2f MiB allocated, %lld bytes held after\n",
              (root + layers * u) / 1048576.0, (after.peak - before.current) / 1048576.0,
              static_cast<long long>(after.current - before.current));
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(is_empty_weight(p.value())) << p.key();
    EXPECT_EQ(p.value().sizes(), (p.key().ends_with("bias") ? std::vector<int64_t>{d} : std::vector<int64_t>{d, d}));
  }
  const std::string e = error_of([&] { model->blocks[3]->a->weight.sum(); });
  EXPECT_NE(e.find("init_empty_weights"), std::string::npos) << e;
  EXPECT_NE(e.find("parameter a.weight"), std::string::npos) << e;  // named within its unit

  // The same model built normally holds all of it (what the bounds above are small against).
  memory::reset_peaks();
  const auto b2 = memory::snapshot().total;
  auto full = std::make_shared<StackImpl>(d, layers);
  EXPECT_GE(memory::snapshot().total.current - b2.current, root + layers * u);
}

TEST(EmptyWeights, ScopeFreesUnitsAsBuiltAndKeepsBuffers) {
  struct WithBuffer : torch::nn::Module {
    WithBuffer() {
      table = register_buffer("table", at::arange(6, at::kFloat));
      lin = register_module("lin", torch::nn::Linear(3, 3));
      blk = accel::unit(register_module("blk", std::make_shared<StackBlockImpl>(4)));
    }
    at::Tensor table;
    torch::nn::Linear lin{nullptr};
    accel::Unit<StackBlockImpl> blk;
  };
  std::shared_ptr<WithBuffer> m;
  {
    auto scope = init_empty_weights();
    m = std::make_shared<WithBuffer>();
    EXPECT_EQ(scope.units_released(), 1);
    EXPECT_TRUE(is_empty_weight(m->blk->a->weight));  // freed as the unit was marked
    EXPECT_FALSE(is_empty_weight(m->lin->weight));    // outside units: until release()
    scope.release(*m);
    EXPECT_TRUE(is_empty_weight(m->lin->weight));
  }
  EXPECT_TRUE(at::equal(m->table, at::arange(6, at::kFloat)));  // buffers keep their values
  // Outside the scope, building frees nothing.
  auto normal = std::make_shared<WithBuffer>();
  EXPECT_FALSE(is_empty_weight(normal->blk->a->weight));
}

// ---------------------------------------------------------------------------------------------------
// load_checkpoint_and_dispatch

struct Reference {
  std::shared_ptr<StackImpl> model;
  at::Tensor x, y;
};
Reference reference(int64_t d, int64_t layers, int seed = 7) {
  at::manual_seed(seed);
  Reference r;
  r.model = std::make_shared<StackImpl>(d, layers);
  r.x = at::randn({3, 5, d});
  c10::NoGradGuard ng;
  r.y = r.model->forward(r.x);
  return r;
}

TEST(Dispatch, DiskUnitsGiveTheFullModelsOutputsBitwise) {
  const int64_t d = 64, layers = 6, u = unit_bytes(d), root = 2 * linear_bytes(d);
  Reference ref = reference(d, layers);
  const std::string dir = fresh_dir("bitwise");
  checkpoint::write_safetensors(dir + "/model.safetensors", named_weights(*ref.model));

  std::shared_ptr<StackImpl> model = make_empty<StackImpl>(d, layers);
  DispatchOptions o;
  o.max_memory = {{"cpu", root + 3 * u}};  // two units in memory, one unit's room kept for paging
  o.offload_folder = dir + "/offload";
  DispatchResult r = load_checkpoint_and_dispatch(model, dir, o);
  EXPECT_EQ(r.device_map, (DeviceMap{{"in", "cpu"},
                                     {"l0", "cpu"},
                                     {"l1", "cpu"},
                                     {"l2", "disk"},
                                     {"l3", "disk"},
                                     {"l4", "disk"},
                                     {"l5", "disk"},
                                     {"out", "cpu"}}));
  EXPECT_EQ(r.disk_units, 4);
  EXPECT_EQ(r.disk_bytes_mapped_from_checkpoint, 4 * u);  // the checkpoint's own bytes, no copy
  EXPECT_EQ(r.disk_bytes_written_to_offload, 0);
  EXPECT_EQ(r.bytes_by_place.at("cpu"), root + 2 * u);
  EXPECT_EQ(r.tensors_loaded, 4 + 4 * layers);
  EXPECT_TRUE(is_dispatched(*model));
  // Dispatching it again is refused up front (its units carry hooks now).
  EXPECT_NE(error_of([&] { load_checkpoint_and_dispatch(model, dir, o); }).find("unit 'l2' already has hooks"),
            std::string::npos);

  c10::NoGradGuard ng;
  for (int pass = 0; pass < 2; ++pass) {  // the pages dropped after a pass come back in the next
    const auto before = paging_stats();
    at::Tensor y = model->forward(ref.x);
    EXPECT_TRUE(at::equal(y, ref.y)) << "pass " << pass << ", max abs diff " << (y - ref.y).abs().max().item<float>();
    EXPECT_EQ(paging_stats().page_ins - before.page_ins, 4);
    EXPECT_EQ(paging_stats().bytes_paged - before.bytes_paged, 4 * u);
  }
  // The disk parameters read as the checkpoint's values at any time.
  EXPECT_TRUE(at::equal(model->blocks[4]->a->weight, ref.model->blocks[4]->a->weight));
  files::remove_tree(dir);
}

// A group of two units on disk (no_split keeps each StackPair whole): each unit pages in its own
// parameters, not the whole group's, so a forward pages in each disk byte once.
TEST(Dispatch, EachUnitOfADiskGroupPagesItsOwnRanges) {
  const int64_t d = 64, layers = 6, u = unit_bytes(d), root = 2 * linear_bytes(d);
  at::manual_seed(11);
  auto ref = std::make_shared<StackImpl>(d, layers, /*pairs=*/true);
  const at::Tensor x = at::randn({3, 5, d});
  at::Tensor want;
  {
    c10::NoGradGuard ng;
    want = ref->forward(x);
  }
  const std::string dir = fresh_dir("pairs");
  checkpoint::write_safetensors(dir + "/model.safetensors", named_weights(*ref));
  std::shared_ptr<StackImpl> model = make_empty<StackImpl>(d, layers, true);
  DispatchOptions o;
  o.no_split = {"StackPair"};
  o.max_memory = {{"cpu", root + 4 * u}};  // one pair in memory, a pair's room kept for paging
  o.offload_folder = dir + "/offload";
  DispatchResult r = load_checkpoint_and_dispatch(model, dir, o);
  ASSERT_GE(r.disk_units, 1) << "no pair went to disk";
  ASSERT_GT(r.disk_bytes_mapped_from_checkpoint, 0);
  c10::NoGradGuard ng;
  const auto before = paging_stats();
  EXPECT_TRUE(at::equal(model->forward(x), want));
  EXPECT_EQ(paging_stats().page_ins - before.page_ins, 2 * r.disk_units) << "one page-in per unit";
  EXPECT_EQ(paging_stats().bytes_paged - before.bytes_paged, r.disk_bytes_mapped_from_checkpoint)
      << "a unit paged in more than its own parameters";
  files::remove_tree(dir);
}

TEST(Dispatch, ConvertsIntoTheOffloadFolderFromAShardedCheckpoint) {
  const int64_t d = 32, layers = 4, u = unit_bytes(d), root = 2 * linear_bytes(d);
  Reference ref = reference(d, layers, 11);
  const std::string dir = fresh_dir("converted");
  // fp64 in three shards with an index: the fp32 model needs a converted copy of its disk weights
  // (fp32 -> fp64 -> fp32 is exact, so the outputs stay bitwise).
  write_sharded_checkpoint(dir + "/ckpt", named_weights(*ref.model, at::kDouble), 3);
  std::shared_ptr<StackImpl> model = make_empty<StackImpl>(d, layers);
  DispatchOptions o;
  o.max_memory = {{"cpu", root + 2 * u}};
  o.offload_folder = dir + "/offload";
  DispatchResult r = load_checkpoint_and_dispatch(model, dir + "/ckpt", o);
  EXPECT_EQ(r.device_map.at("l0"), "cpu");
  EXPECT_EQ(r.device_map.at("l1"), "disk");
  EXPECT_EQ(r.disk_bytes_written_to_offload, 3 * u);
  EXPECT_EQ(r.disk_bytes_mapped_from_checkpoint, 0);
  EXPECT_TRUE(files::is_file(dir + "/offload/offload.safetensors"));
  EXPECT_EQ(model->blocks[2]->a->weight.scalar_type(), at::kFloat);
  c10::NoGradGuard ng;
  EXPECT_TRUE(at::equal(model->forward(ref.x), ref.y));
  files::remove_tree(dir);
}

TEST(Dispatch, ExplicitMapAndAModelBuiltNormally) {
  const int64_t d = 32, layers = 4;
  Reference ref = reference(d, layers, 5);
  const std::string dir = fresh_dir("explicit");
  checkpoint::write_safetensors(dir + "/weights.safetensors", named_weights(*ref.model));
  at::manual_seed(99);  // other weights: the checkpoint must replace them all
  auto model = std::make_shared<StackImpl>(d, layers);
  DispatchOptions o;
  o.device_map = DeviceMap{{"", "cpu"}, {"l1", "disk"}, {"l3", "disk"}};
  o.offload_folder = dir + "/offload";
  DispatchResult r = load_checkpoint_and_dispatch(model, dir + "/weights.safetensors", o);
  EXPECT_EQ(r.disk_units, 2);
  c10::NoGradGuard ng;
  EXPECT_TRUE(at::equal(model->forward(ref.x), ref.y));
  files::remove_tree(dir);
}

TEST(Dispatch, GptExampleWithItsOwnParametersOutsideUnits) {
  // The GPT example: a position table and a head tied to the embedding, both outside the units.
  examples::GPTConfig c{13, 16, 2, 4, 6};
  at::manual_seed(3);
  auto ref = std::make_shared<examples::GPTImpl>(c);
  at::Tensor tokens = at::randint(0, c.vocab, {2, c.seq});
  c10::NoGradGuard ng;
  at::Tensor y = ref->forward(tokens);
  const std::string dir = fresh_dir("gpt");
  std::vector<std::pair<std::string, at::Tensor>> ws;
  for (const auto& p : ref->named_parameters()) ws.emplace_back(p.key(), p.value());
  checkpoint::write_safetensors(dir + "/model.safetensors", ws);
  auto model = make_empty<examples::GPTImpl>(c);
  auto plan = plan_model(*model);
  DispatchOptions o;
  o.max_memory = {{"cpu", plan.rest_bytes + 2 * plan.largest_group_bytes}};
  o.offload_folder = dir + "/offload";
  DispatchResult r = load_checkpoint_and_dispatch(model, dir, o);
  EXPECT_EQ(r.disk_units, 3);
  EXPECT_TRUE(at::equal(model->forward(tokens), y));
  files::remove_tree(dir);
}

class DispatchErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    ref = reference(kD, 4, 2);
    dir = fresh_dir("errors");
    weights = named_weights(*ref.model);
    checkpoint::write_safetensors(dir + "/model.safetensors", weights);
  }
  void TearDown() override { files::remove_tree(dir); }
  // The error load_checkpoint_and_dispatch throws for this map (and checkpoint), and that the model
  // is left as it was: still empty.
  std::string error(DispatchOptions o, const std::string& ckpt = "") {
    auto model = make_empty<StackImpl>(kD, 4);
    std::string e = error_of([&] { load_checkpoint_and_dispatch(model, ckpt.empty() ? dir : ckpt, o); });
    for (const auto& p : model->named_parameters()) EXPECT_TRUE(is_empty_weight(p.value())) << p.key();
    EXPECT_FALSE(is_dispatched(*model));
    return e;
  }
  Reference ref;
  std::string dir;
  std::vector<std::pair<std::string, at::Tensor>> weights;
};

TEST_F(DispatchErrors, DiskWithoutOffloadFolder) {
  DispatchOptions o;
  o.max_memory = {{"cpu", 2 * linear_bytes(kD)}};
  const std::string e = error(o);
  EXPECT_NE(e.find("no offload_folder"), std::string::npos) << e;
  EXPECT_NE(e.find("4 units on disk (l0"), std::string::npos) << e;
}

TEST_F(DispatchErrors, MapNamingAnUnknownModule) {
  DispatchOptions o;
  o.device_map = DeviceMap{{"", "cpu"}, {"l9", "disk"}};
  const std::string e = error(o);
  EXPECT_NE(e.find("'l9', which is not a module or tensor of the model"), std::string::npos) << e;
}

TEST_F(DispatchErrors, MapNamingAnUnknownOrAbsentDevice) {
  DispatchOptions o;
  o.device_map = DeviceMap{{"", "cpu"}, {"l1", "tpu:0"}};
  std::string e = error(o);
  EXPECT_NE(e.find("'l1' on unknown device 'tpu:0'"), std::string::npos) << e;
  o.device_map = DeviceMap{{"", "cpu"}, {"l1", "cuda:63"}};
  e = error(o);
  EXPECT_NE(e.find("names cuda:63, but this process sees"), std::string::npos) << e;
}

TEST_F(DispatchErrors, MapSplittingAUnitOrPagingTheModelsOwnPart) {
  DispatchOptions o;
  o.offload_folder = dir + "/offload";
  o.device_map = DeviceMap{{"", "cpu"}, {"l1.a", "disk"}};
  std::string e = error(o);
  EXPECT_NE(e.find("splits 'l1' between"), std::string::npos) << e;
  o.device_map = DeviceMap{{"", "cpu"}, {"out", "disk"}};
  e = error(o);
  EXPECT_NE(e.find("'out.weight' is outside every unit"), std::string::npos) << e;
  o.device_map = DeviceMap{{"l0", "cpu"}};
  e = error(o);
  EXPECT_NE(e.find("does not cover 'in.weight'"), std::string::npos) << e;
}

TEST_F(DispatchErrors, CheckpointMissingATensor) {
  std::vector<std::pair<std::string, at::Tensor>> fewer;
  for (const auto& w : weights)
    if (w.first != "l2.b.bias") fewer.push_back(w);
  checkpoint::write_safetensors(dir + "/fewer.safetensors", fewer);
  const std::string e = error({}, dir + "/fewer.safetensors");
  EXPECT_NE(e.find("has no tensor 'l2.b.bias'"), std::string::npos) << e;
}

TEST_F(DispatchErrors, ShapeMismatchNamesBothShapes) {
  auto wrong = weights;
  for (auto& w : wrong)
    if (w.first == "l2.a.weight") w.second = at::zeros({kD, kD / 2});
  checkpoint::write_safetensors(dir + "/wrong.safetensors", wrong);
  const std::string e = error({}, dir + "/wrong.safetensors");
  EXPECT_NE(e.find("tensor 'l2.a.weight': the checkpoint has shape [16, 8], the model [16, 16]"), std::string::npos)
      << e;
}

TEST(DispatchAccelerator, PrepareRefusesADispatchedModel) {
  const std::string dir = fresh_dir("prepare");
  Reference ref = reference(kD, 2, 1);
  checkpoint::write_safetensors(dir + "/model.safetensors", named_weights(*ref.model));
  auto model = make_empty<StackImpl>(kD, 2);
  load_checkpoint_and_dispatch(model, dir);
  AcceleratorOptions ao;
  ao.report_ignored_keys = false;
  Accelerator acc(ao);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  const std::string e = error_of([&] { acc.prepare(model, sgd); });
  EXPECT_NE(e.find("dispatched by load_checkpoint_and_dispatch (device map {\"\": cpu})"), std::string::npos) << e;
  EXPECT_NE(e.find("inference only"), std::string::npos) << e;
  files::remove_tree(dir);
}

// ---------------------------------------------------------------------------------------------------
// CUDA placement (skips without a device): units on the GPU, the cpu and disk around a main device.

TEST(DispatchCUDA, UnitsAcrossCudaCpuAndDisk) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const int64_t d = 32, layers = 4;
  Reference ref = reference(d, layers, 21);
  const std::string dir = fresh_dir("cuda");
  checkpoint::write_safetensors(dir + "/model.safetensors", named_weights(*ref.model));
  for (const DeviceMap& map : {DeviceMap{{"", "cuda:0"}, {"l1", "cpu"}, {"l2", "disk"}},
                               DeviceMap{{"", "cpu"}, {"l0", "cuda:0"}, {"l3", "cuda:0"}, {"l2", "disk"}}}) {
    auto model = make_empty<StackImpl>(d, layers);
    DispatchOptions o;
    o.device_map = map;
    o.offload_folder = dir + "/offload";
    DispatchResult r = load_checkpoint_and_dispatch(model, dir, o);
    const c10::Device main(r.main_device);
    EXPECT_EQ(model->in->weight.device(), main);
    c10::NoGradGuard ng;
    at::Tensor y = model->forward(ref.x.to(main));
    EXPECT_EQ(y.device(), main);
    EXPECT_TRUE(at::allclose(y.cpu(), ref.y, 1e-5, 1e-5))
        << to_string(map) << ": max abs diff " << (y.cpu() - ref.y).abs().max().item<float>();
  }
  files::remove_tree(dir);
}

}  // namespace
}  // namespace accel::test
