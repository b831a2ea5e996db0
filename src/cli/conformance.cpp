#include "cli/conformance.h"
#include "base/error.h"

#include "comm/communicator.h"
#include "sharding/unit.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/core.h>
#include <torch/data/datasets/base.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>

namespace accel::cli::conformance {

// The model the training checks use: two blocks marked as units (named BlockImpl, the class the
// shipped FSDP configs wrap) and a head in the root unit, in float64.
struct BlockImpl : torch::nn::Module {
  BlockImpl(std::int64_t in, std::int64_t out) : fc(register_module("fc", torch::nn::Linear(in, out))) {}
  at::Tensor forward(const at::Tensor& x) { return at::tanh(fc(x)); }
  torch::nn::Linear fc;
};

struct NetImpl : torch::nn::Module {
  NetImpl()
      : block0(accel::unit(register_module("block0", std::make_shared<BlockImpl>(8, 16)))),
        block1(accel::unit(register_module("block1", std::make_shared<BlockImpl>(16, 16)))),
        head(register_module("head", torch::nn::Linear(16, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return head(block1(block0(x))); }
  accel::Unit<BlockImpl> block0, block1;
  torch::nn::Linear head;
};

namespace {

constexpr double kParamTolerance = 1e-10;  // float64: only the order of the sums differs

// Samples whose data and target are their own index.
struct Ids : torch::data::datasets::Dataset<Ids> {
  explicit Ids(std::int64_t n) : n(n) {}
  torch::data::Example<> get(std::size_t i) override {
    return {at::full({1}, static_cast<double>(i), at::kDouble),
            at::scalar_tensor(static_cast<std::int64_t>(i), at::kLong)};
  }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(n); }
  std::int64_t n;
};

// Rows of (x, y) as a dataset.
struct Rows : torch::data::datasets::Dataset<Rows> {
  Rows(at::Tensor x, at::Tensor y) : x(std::move(x)), y(std::move(y)) {}
  torch::data::Example<> get(std::size_t i) override { return {x[i], y[i]}; }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(x.size(0)); }
  at::Tensor x, y;
};

Rows make_rows(std::int64_t n) {
  at::Generator gen = at::detail::createCPUGenerator(77);
  at::Tensor x = at::randn({n, 8}, gen, at::TensorOptions().dtype(at::kDouble));
  at::Tensor y = at::randn({n, 4}, gen, at::TensorOptions().dtype(at::kDouble));
  return Rows(x, y);
}

std::shared_ptr<NetImpl> make_net(std::uint64_t seed) {
  at::manual_seed(seed);
  auto m = std::make_shared<NetImpl>();
  m->to(at::kDouble);
  return m;
}

AcceleratorOptions quiet(const Options& o) {
  AcceleratorOptions a = o.accelerator;
  a.report_ignored_keys = false;
  return a;
}

bool injects(const Options& o, const Accelerator& acc, const char* check) {
  return o.inject_failure == check && acc.is_last_process();
}

std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous().reshape({-1});
  const std::int64_t* p = c.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(p, p + c.numel());
}

at::Tensor to_tensor(const std::vector<std::int64_t>& v, c10::Device device) {
  return at::tensor(v, at::kLong).to(device);
}

std::string join(const std::vector<std::string>& parts, const char* sep = "; ") {
  std::string s;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!s.empty()) s += sep;
    s += p;
  }
  return s;
}

// "missing 2 (first 4), duplicated 1 (first 5)" for ids that should be 0..n-1 once each; "" if so.
std::string coverage_problem(const std::vector<std::int64_t>& ids, std::int64_t n) {
  std::vector<int> count(static_cast<std::size_t>(n), 0);
  std::int64_t outside = 0;
  for (std::int64_t id : ids) {
    if (id < 0 || id >= n)
      ++outside;
    else
      ++count[static_cast<std::size_t>(id)];
  }
  std::int64_t missing = 0, dup = 0, first_missing = -1, first_dup = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    if (count[i] == 0 && missing++ == 0) first_missing = i;
    if (count[i] > 1 && dup++ == 0) first_dup = i;
  }
  std::vector<std::string> p;
  if (missing) p.push_back(fmt::format("{} id(s) missing (first {})", missing, first_missing));
  if (dup) p.push_back(fmt::format("{} id(s) seen more than once (first {})", dup, first_dup));
  if (outside) p.push_back(fmt::format("{} id(s) out of range", outside));
  return join(p, ", ");
}

void append(std::vector<std::int64_t>& to, const at::Tensor& t) {
  auto v = to_vector(t);
  to.insert(to.end(), v.begin(), v.end());
}

std::string pattern(const std::vector<bool>& v) {
  std::string s;
  for (bool b : v) s += b ? 'T' : 'F';
  return s;
}

// The per-process batch a DeepSpeed config asks for (train_micro_batch_size_per_gpu, or derived from
// train_batch_size); `fallback` when it leaves it to the loader ("auto").
std::int64_t per_process_batch(const AcceleratorConfig& c, int world, std::int64_t fallback) {
  if (c.distributed_type != DistributedType::DeepSpeed) return fallback;
  if (c.batch.micro_batch_per_gpu) return *c.batch.micro_batch_per_gpu;
  if (c.batch.train_batch_size) {
    BatchConfig b = resolve_batch(c.batch, world, std::nullopt, c.gradient_accumulation_steps, c.source);
    if (b.micro_batch_per_gpu) return *b.micro_batch_per_gpu;
  }
  return fallback;
}

// The accumulation steps prepare() will use with a loader of `batch` per process, and whether the
// config fixes them (DeepSpeed's triad, or gradient_accumulation_steps > 1 anywhere).
std::pair<std::int64_t, bool> config_accumulation(const AcceleratorConfig& c, int world, std::int64_t batch) {
  if (c.distributed_type == DistributedType::DeepSpeed) {
    const bool fixed = c.batch.train_batch_size.has_value() || c.batch.gradient_accumulation_steps.has_value();
    BatchConfig b = resolve_batch(c.batch, world, batch, c.gradient_accumulation_steps, c.source);
    return {*b.gradient_accumulation_steps, fixed || *b.gradient_accumulation_steps > 1};
  }
  return {c.gradient_accumulation_steps, c.gradient_accumulation_steps > 1};
}

// AdamW steps taken so far (the largest step count in the optimizer's state): tells whether a
// micro-step's optimizer step really stepped, whatever the strategy shards.
std::int64_t adam_steps(torch::optim::Optimizer& opt) {
  std::int64_t steps = 0;
  for (const auto& kv : opt.state())
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(kv.second.get())) steps = std::max(steps, s->step());
  return steps;
}

// One training run through the Accelerator and the same run in plain libtorch on the global batch.
struct TrainOutcome {
  std::int64_t accumulation = 1, micro_batches = 0, batch = 0;
  std::vector<bool> syncs, stepped, expected_syncs;
  double max_param_diff = 0;  // on the main process, broadcast to all
  double max_norm_rel = 0;
  std::string problem;                      // missing parameters, step-count mismatch
  std::string precision;                    // "float64", or "<mixed_precision> compute"
  double tolerance = kParamTolerance;       // largest |dparam| against the float64 reference
  double norm_tolerance = kParamTolerance;  // largest relative difference of the clipped grad norms
};

TrainOutcome train_and_compare(const Options& o, const char* check, std::optional<std::int64_t> accumulation,
                               std::int64_t optimizer_steps_or_zero) {
  AcceleratorOptions ao = quiet(o);
  TrainOutcome out;
  std::int64_t batch = 0, A = 1;
  {
    // What the config decides, before this run's Accelerator prepares anything.
    AcceleratorConfig cfg = resolve_config(
        ConfigOverrides{ao.config_file, ao.mixed_precision, ao.gradient_accumulation_steps, ao.cpu, {}, {}});
    const int world = comm::Communicator::world()->size();
    batch = per_process_batch(cfg, world, 4);
    auto [a, fixed] = config_accumulation(cfg, world, batch);
    A = a;
    if (accumulation && !fixed) {
      A = *accumulation;
      ao.gradient_accumulation_steps = A;
    }
  }
  Accelerator acc(ao);
  const int N = acc.num_processes();
  const bool inject = injects(o, acc, check);
  const std::int64_t micro = optimizer_steps_or_zero > 0 ? optimizer_steps_or_zero * A : 2 * A + 1;
  const std::int64_t G = batch * N, n = G * micro;
  Rows rows = make_rows(n);
  const DataLoaderOptions lo{.batch_size = batch, .shuffle = true, .seed = 11};
  DataLoader<Rows> loader(rows, lo);
  // Every rank initialises differently: prepare() must start them all from rank 0's weights.
  auto model = make_net(4321 + static_cast<std::uint64_t>(acc.process_index()));
  auto reference = make_net(4321);
  const auto adam = torch::optim::AdamWOptions(0.01).weight_decay(0.1);
  torch::optim::AdamW adamw(model->parameters(), adam);
  torch::optim::AdamW ref_opt(reference->parameters(), adam);
  auto opt = acc.prepare(model, adamw, loader);
  out.accumulation = acc.gradient_accumulation_steps();
  out.micro_batches = micro;
  out.batch = batch;
  const double clip = 0.5;

  std::vector<double> norms;
  // Mixed precision: the float64 model computes in the configured dtype (autocast casts fp32 inputs).
  const bool mixed = acc.mixed_precision() != MixedPrecision::No;
  out.precision = mixed ? std::string(to_string(acc.mixed_precision())) + " compute" : "float64";
  // What the precision's rounding allows: about 3x the largest measured over training_parity and
  // gradient_accumulation, `ACCEL_MIXED_PRECISION=P mpirun -np N accel test --worker --check
  // training_parity --check gradient_accumulation --config_file C` for C in configs/ddp,
  // deepspeed/zero2, deepspeed/zero3, fsdp/full_shard at N = 2, zero3 at 3, fsdp/hybrid_shard at 4
  // (ACCEL_RANKS_PER_NODE=2) and full_shard at 1 (both checks print the two figures):
  //   fp16  |dparam| 2.1e-4 (zero3, 3 ranks), grad norm rel 2.6e-4 (1 rank)      -> 6e-4, 8e-4
  //   bf16  |dparam| 2.0e-2 (accumulation, 2 and 4 ranks), norm rel 2.3e-3 (1 rank) -> 6e-2, 7e-3
  //   fp8   |dparam| 3.4e-2, norm rel 1.2e-2 (hybrid_shard, 4 ranks: weights gathered as e4m3) -> 1e-1, 3e-2
  // |dparam| is large against the norm because Adam is blind to a gradient's scale: a component near
  // zero whose sign the rounding flips moves by up to 2 x lr (0.01) per step. The norm against the
  // reference is what catches a mis-scaled reduction or a lost rank here.
  switch (acc.mixed_precision()) {
    case MixedPrecision::No: break;
    case MixedPrecision::Fp16: out.tolerance = 6e-4, out.norm_tolerance = 8e-4; break;
    case MixedPrecision::Bf16: out.tolerance = 6e-2, out.norm_tolerance = 7e-3; break;
    case MixedPrecision::Fp8: out.tolerance = 1e-1, out.norm_tolerance = 3e-2; break;
  }
  for (const Batch& b : loader) {
    auto scope = acc.accumulate(model);
    at::Tensor target = inject ? b.target + 1e-3 : b.target;  // the last rank's data is wrong
    at::Tensor prediction;
    {
      auto autocast = acc.autocast();
      prediction = model->forward(mixed ? b.data.to(at::kFloat) : b.data).to(at::kDouble);
    }
    acc.backward(at::mse_loss(prediction, target));
    if (acc.sync_gradients()) norms.push_back(acc.clip_grad_norm_(clip));
    const std::int64_t before = adam_steps(opt->inner());
    opt->step();
    opt->zero_grad();
    out.syncs.push_back(acc.sync_gradients());
    out.stepped.push_back(adam_steps(opt->inner()) > before);
  }

  // The reference: the same global batches (positions [gG, (g+1)G) of the epoch's order), the loss
  // averaged over each accumulation window, clipped as the prepared optimizer clips.
  const AcceleratorConfig& cfg = acc.config();
  const bool ds_clips =
      cfg.distributed_type == DistributedType::DeepSpeed && cfg.gradient_clipping && *cfg.gradient_clipping > 0;
  ShardPlan plan(n, {.batch_size = G, .shuffle = true, .seed = lo.seed}, 0, 1);
  auto global = plan.batches(0);
  std::vector<double> ref_norms;
  for (std::size_t i = 0; i < global.size(); ++i) {
    at::Tensor idx = at::tensor(global[i], at::kLong);
    at::Tensor loss = at::mse_loss(reference->forward(rows.x.index_select(0, idx)), rows.y.index_select(0, idx));
    (loss / static_cast<double>(out.accumulation)).backward();
    const bool sync = (static_cast<std::int64_t>(i) + 1) % out.accumulation == 0 || i + 1 == global.size();
    out.expected_syncs.push_back(sync);
    if (sync) {
      ref_norms.push_back(torch::nn::utils::clip_grad_norm_(reference->parameters(),
                                                            ds_clips ? std::numeric_limits<double>::infinity() : clip));
      if (cfg.gradient_clipping && *cfg.gradient_clipping > 0)
        torch::nn::utils::clip_grad_norm_(reference->parameters(), *cfg.gradient_clipping);
      ref_opt.step();
      ref_opt.zero_grad();
    }
  }
  if (norms.size() != ref_norms.size()) {
    out.problem = fmt::format("{} optimizer steps, the reference took {}", norms.size(), ref_norms.size());
  } else {
    for (std::size_t i = 0; i < norms.size(); ++i)
      out.max_norm_rel = std::max(out.max_norm_rel, std::abs(norms[i] - ref_norms[i]) / std::max(ref_norms[i], 1e-300));
  }

  // Full weights on the main process against the reference; the verdict travels to every rank.
  auto state = acc.get_state_dict();
  at::Tensor verdict = at::zeros({2}, at::kDouble);
  if (acc.is_main_process()) {
    std::map<std::string, at::Tensor> got(state.begin(), state.end());
    double missing = 0, diff = 0;
    for (const auto& kv : reference->named_parameters()) {
      auto it = got.find(kv.key());
      if (it == got.end() || !it->second.sizes().equals(kv.value().sizes())) {
        missing += 1;
        continue;
      }
      diff = std::max(diff, (it->second.to(at::kDouble) - kv.value().detach()).abs().max().item<double>());
    }
    verdict[0] = diff;
    verdict[1] = missing;
  }
  if (N > 1) acc.world()->broadcast(verdict);
  out.max_param_diff = verdict[0].item<double>();
  if (verdict[1].item<double>() > 0)
    out.problem = join({out.problem, fmt::format("{} parameter(s) missing from get_state_dict",
                                                 static_cast<std::int64_t>(verdict[1].item<double>()))});
  acc.end_training();
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// 1. loader coverage

CheckResult check_loader_coverage(const Options& o) {
  CheckResult r{"loader_coverage", true, ""};
  Accelerator acc(quiet(o));
  const std::int64_t n = 37, b = 4;
  const int N = acc.num_processes();
  const std::int64_t G = b * N;
  const bool inject = injects(o, acc, r.name.c_str());
  std::vector<std::string> problems;

  // even_batches (the default): every rank reads ceil(n / G) batches, the last global batch padded by
  // wrapping around to the start (a world of one yields a short last batch instead).
  const std::int64_t batches = N == 1 ? (n + b - 1) / b : (n + G - 1) / G;
  const std::int64_t slots = N == 1 ? n : batches * G;
  {
    DataLoader<Ids> loader(Ids(n), {.batch_size = b});
    acc.prepare_data_loader(loader);
    if (loader.size() != batches)
      problems.push_back(
          fmt::format("{} batches on rank {}, expected {}", loader.size(), acc.process_index(), batches));
    std::vector<std::int64_t> metrics, all;
    bool first = true;
    for (const Batch& batch : loader) {
      at::Tensor ids = batch.target;
      if (inject && first) {  // this rank reads a wrong sample: one id twice, one never
        ids = ids.clone();
        ids[0] = (ids[0].item<std::int64_t>() + 1) % n;
      }
      first = false;
      append(metrics, acc.gather_for_metrics(ids));
      append(all, acc.gather(ids));
    }
    if (auto p = coverage_problem(metrics, n); !p.empty()) problems.push_back("gather_for_metrics: " + p);
    bool wrap_ok = static_cast<std::int64_t>(all.size()) == slots;
    for (std::size_t k = 0; wrap_ok && k < all.size(); ++k) wrap_ok = all[k] == static_cast<std::int64_t>(k) % n;
    if (!wrap_ok)
      problems.push_back(
          fmt::format("gather: {} ids, not the order wrapped to {} slots (k -> k % {})", all.size(), slots, n));
  }
  // even_batches=false: the ranks' own ids (uneven counts) together are every id once.
  {
    DataLoader<Ids> loader(Ids(n), {.batch_size = b, .even_batches = false});
    acc.prepare_data_loader(loader);
    std::vector<std::int64_t> mine;
    for (const Batch& batch : loader) append(mine, batch.target);
    at::Tensor t = to_tensor(mine, acc.device());
    std::vector<std::int64_t> all, real;
    append(all, acc.gather(acc.pad_across_processes(t, 0, -1)));
    for (std::int64_t id : all)
      if (id >= 0) real.push_back(id);
    if (auto p = coverage_problem(real, n); !p.empty()) problems.push_back("even_batches=false: " + p);
  }
  // drop_last: the full global batches only, each id once, in order.
  const std::int64_t kept = (n / G) * G;
  {
    DataLoader<Ids> loader(Ids(n), {.batch_size = b, .drop_last = true});
    acc.prepare_data_loader(loader);
    std::vector<std::int64_t> all;
    for (const Batch& batch : loader) append(all, acc.gather(batch.target));
    std::vector<std::int64_t> want(static_cast<std::size_t>(kept));
    std::iota(want.begin(), want.end(), 0);
    if (all != want) problems.push_back(fmt::format("drop_last: {} ids, expected 0..{} once", all.size(), kept - 1));
  }
  acc.end_training();
  r.passed = problems.empty();
  r.detail = r.passed ? fmt::format(
                            "{} ids, batch {} x {} rank(s): each once ({} padding dropped); "
                            "even_batches=false, drop_last ({}) exact",
                            n, b, N, slots - n, kept)
                      : join(problems);
  return r;
}

// ---------------------------------------------------------------------------------------------------
// 2. RNG agreement

CheckResult check_rng_sync(const Options& o) {
  CheckResult r{"rng_sync", true, ""};
  Accelerator acc(quiet(o));
  const int N = acc.num_processes(), me = acc.process_index();
  const bool inject = injects(o, acc, r.name.c_str());
  std::vector<std::string> problems;

  // The ranks start from different states...
  at::manual_seed(1000 + static_cast<std::uint64_t>(me));
  at::Tensor apart = acc.gather(at::randn({4}, at::kDouble)).view({N, 4});
  std::int64_t differ = 0;
  for (int k = 1; k < N; ++k) differ += at::equal(apart[k], apart[0]) ? 0 : 1;
  // ...then seed from rank 0's seed.
  at::Tensor seed = at::full({1}, static_cast<std::int64_t>(std::random_device{}() & 0x7fffffff), at::kLong);
  if (N > 1) acc.world()->broadcast(seed);
  const auto s = static_cast<std::uint64_t>(seed.item<std::int64_t>());
  at::manual_seed(s);
  if (inject) at::randn({1});  // this rank consumes one more draw than the others
  at::Tensor draws =
      at::cat({at::randn({8}, at::kDouble), at::rand({8}, at::kDouble), at::randperm(8, at::kLong).to(at::kDouble)});
  const std::int64_t D = draws.numel();
  at::Tensor all = acc.gather(draws).view({N, D});
  for (int k = 1; k < N; ++k)
    if (!at::equal(all[k], all[0])) problems.push_back(fmt::format("CPU draws of rank {} differ from rank 0's", k));
  std::string device_note;
  if (acc.device().is_cuda()) {
    at::Tensor dev =
        acc.gather(at::randn({8}, at::TensorOptions().dtype(at::kDouble).device(acc.device()))).view({N, 8});
    for (int k = 1; k < N; ++k)
      if (!at::equal(dev[k], dev[0]))
        problems.push_back(fmt::format("{} draws of rank {} differ", acc.device().str(), k));
    device_note = " and on " + acc.device().str();
  }

  // The shuffling loader: one permutation on every rank; gather_for_metrics yields it in order.
  const std::int64_t n = 37;
  DataLoader<Ids> loader(Ids(n), {.batch_size = 4, .shuffle = true, .seed = s});
  acc.prepare_data_loader(loader);
  std::vector<std::int64_t> seen;
  for (const Batch& batch : loader) append(seen, acc.gather_for_metrics(batch.target));
  const std::vector<std::int64_t> order = loader.plan().order(0);
  at::Tensor orders = acc.gather(to_tensor(order, acc.device())).view({N, n});
  for (int k = 1; k < N; ++k)
    if (!at::equal(orders[k], orders[0]))
      problems.push_back(fmt::format("rank {} shuffles differently from rank 0", k));
  if (auto p = coverage_problem(seen, n); !p.empty()) problems.push_back("shuffled epoch: " + p);
  if (seen != order) problems.push_back("gather_for_metrics over the shuffled epoch is not the loader's order");
  std::vector<std::int64_t> identity(static_cast<std::size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  if (order == identity) problems.push_back("shuffle=true gave the identity order");
  if (loader.plan().order(1) == order) problems.push_back("epoch 1 repeats epoch 0's order");
  acc.end_training();

  r.passed = problems.empty();
  r.detail = r.passed ? fmt::format(
                            "seed {} from rank 0: {} CPU draws{} bitwise equal on {} rank(s) ({}/{} "
                            "differed before); one shuffle order on all",
                            s, D, device_note, N, differ, N - 1)
                      : join(problems);
  return r;
}

// ---------------------------------------------------------------------------------------------------
// 3. training matches single-process

CheckResult check_training_parity(const Options& o) {
  CheckResult r{"training_parity", true, ""};
  TrainOutcome t = train_and_compare(o, r.name.c_str(), std::nullopt, /*optimizer_steps=*/6);
  const bool ok = t.problem.empty() && t.max_param_diff <= t.tolerance && t.max_norm_rel <= t.norm_tolerance;
  r.passed = ok;
  r.detail = fmt::format(
      "max |dparam| {:.1e} {} {:.0e}, grad norm rel {:.1e} {} {:.0e} ({} AdamW steps, accum {}, "
      "batch {}/rank, {})",
      t.max_param_diff, t.max_param_diff <= t.tolerance ? "<=" : ">", t.tolerance, t.max_norm_rel,
      t.max_norm_rel <= t.norm_tolerance ? "<=" : ">", t.norm_tolerance,
      t.micro_batches / std::max<std::int64_t>(t.accumulation, 1), t.accumulation, t.batch, t.precision);
  if (!t.problem.empty()) r.detail = t.problem + "; " + r.detail;
  return r;
}

// ---------------------------------------------------------------------------------------------------
// 4. gather / reduce / pad_across_processes

CheckResult check_collectives(const Options& o) {
  CheckResult r{"collectives", true, ""};
  Accelerator acc(quiet(o));
  const int N = acc.num_processes(), me = acc.process_index();
  const bool inject = injects(o, acc, r.name.c_str());
  const auto dbl = at::TensorOptions().dtype(at::kDouble).device(acc.device());
  const auto lng = at::TensorOptions().dtype(at::kLong).device(acc.device());
  std::vector<std::string> problems;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what);
  };

  // gather: rank k's rows are k + [0, 1, 2], in rank order; 0-dim tensors count as [1].
  at::Tensor mine = at::full({2, 3}, static_cast<double>(me), dbl) + at::arange(3, dbl);
  at::Tensor g = acc.gather(mine).cpu();
  bool gather_ok = g.sizes().equals({2 * N, 3});
  for (int k = 0; gather_ok && k < N; ++k)
    gather_ok = at::equal(g.narrow(0, 2 * k, 2),
                          at::full({2, 3}, static_cast<double>(k), at::kDouble) + at::arange(3, at::kDouble));
  expect(gather_ok, "gather of [2,3] rows is not k + [0,1,2] in rank order");
  at::Tensor scalars = acc.gather(at::scalar_tensor(me + 1, lng)).cpu();
  expect(scalars.numel() == N && at::equal(scalars, at::arange(1, N + 1, at::kLong)),
         "gather of 0-dim tensors is not 1..N");
  expect(at::equal(acc.gather_for_metrics(mine).cpu(), g), "gather_for_metrics outside a loader differs from gather");

  // reduce: x_k = k + 1 (+1 on the last rank when a failure is injected).
  at::Tensor x = at::full({5}, static_cast<double>(me + 1 + (inject ? 1 : 0)), dbl);
  const double sum = N * (N + 1) / 2.0;
  auto all_eq = [](const at::Tensor& t, double v) { return at::all(t.cpu() == v).item<bool>(); };
  at::Tensor rs = acc.reduce(x, "sum");
  expect(all_eq(rs, sum), fmt::format("reduce sum {} != {}", rs[0].item<double>(), sum));
  at::Tensor rm = acc.reduce(x, "mean");
  expect(all_eq(rm, (N + 1) / 2.0), fmt::format("reduce mean {} != {}", rm[0].item<double>(), (N + 1) / 2.0));
  expect(all_eq(acc.reduce(x, "max"), N), "reduce max != N");
  expect(all_eq(acc.reduce(x, "min"), 1), "reduce min != 1");
  expect(all_eq(x, me + 1 + (inject ? 1 : 0)), "reduce modified its input");
  at::Tensor li = acc.reduce(at::full({3}, static_cast<std::int64_t>(me + 1), lng), "sum").cpu();
  expect(li.scalar_type() == at::kLong && at::all(li == static_cast<std::int64_t>(N) * (N + 1) / 2).item<bool>(),
         "int64 reduce sum != N(N+1)/2");

  // pad_across_processes: rank k holds k + 1 rows [100k + i, -(100k + i)], padded to N rows with -7.
  at::Tensor rows_k = at::stack({at::arange(me + 1, dbl) + 100.0 * me, -(at::arange(me + 1, dbl) + 100.0 * me)}, 1);
  at::Tensor end = acc.pad_across_processes(rows_k, 0, -7.0);
  at::Tensor start = acc.pad_across_processes(rows_k, 0, -7.0, /*pad_first=*/true);
  at::Tensor ge = acc.gather(end).cpu(), gs = acc.gather(start).cpu();
  bool pad_ok = ge.sizes().equals({static_cast<std::int64_t>(N) * N, 2}) && gs.sizes().equals(ge.sizes());
  for (int k = 0; pad_ok && k < N; ++k) {
    at::Tensor real =
        at::stack({at::arange(k + 1, at::kDouble) + 100.0 * k, -(at::arange(k + 1, at::kDouble) + 100.0 * k)}, 1);
    at::Tensor pad = at::full({N - k - 1, 2}, -7.0, at::kDouble);
    at::Tensor e = ge.narrow(0, static_cast<std::int64_t>(k) * N, N),
               s = gs.narrow(0, static_cast<std::int64_t>(k) * N, N);
    pad_ok = at::equal(e, at::cat({real, pad})) && at::equal(s, at::cat({pad, real}));
  }
  expect(pad_ok, "pad_across_processes (end or start) then gather is not the closed form");
  acc.end_training();

  r.passed = problems.empty();
  r.detail = r.passed ? fmt::format(
                            "gather, reduce sum/mean/max/min (f64, i64), pad_across_processes "
                            "(lengths 1..{}, end and start) exact",
                            N)
                      : join(problems);
  return r;
}

// ---------------------------------------------------------------------------------------------------
// 5. trigger

CheckResult check_trigger(const Options& o) {
  CheckResult r{"trigger", true, ""};
  Accelerator acc(quiet(o));
  const int N = acc.num_processes();
  const bool inject = injects(o, acc, r.name.c_str());
  const bool before = acc.check_trigger();
  if (acc.is_last_process() && !inject) acc.set_trigger();
  const bool fired = acc.check_trigger();
  const bool after = acc.check_trigger();
  // Every rank's view, so that the table can say how many saw it.
  at::Tensor seen =
      acc.gather(at::tensor({before ? 1L : 0L, fired ? 1L : 0L, after ? 1L : 0L}, at::kLong)).view({N, 3});
  const std::int64_t saw = seen.select(1, 1).sum().item<std::int64_t>();
  const std::int64_t early = seen.select(1, 0).sum().item<std::int64_t>(),
                     stuck = seen.select(1, 2).sum().item<std::int64_t>();
  acc.end_training();
  r.passed = saw == N && early == 0 && stuck == 0;
  r.detail = fmt::format("set on rank {}: seen by {}/{} rank(s); before: {}, after reset: {} rank(s) true", N - 1, saw,
                         N, early, stuck);
  return r;
}

// ---------------------------------------------------------------------------------------------------
// 6. gradient accumulation

CheckResult check_gradient_accumulation(const Options& o) {
  CheckResult r{"gradient_accumulation", true, ""};
  TrainOutcome t = train_and_compare(o, r.name.c_str(), /*accumulation=*/3, /*optimizer_steps=*/0);
  std::vector<std::string> problems;
  if (!t.problem.empty()) problems.push_back(t.problem);
  if (t.syncs != t.expected_syncs)
    problems.push_back(fmt::format("sync pattern {} != expected {}", pattern(t.syncs), pattern(t.expected_syncs)));
  if (t.stepped != t.syncs)
    problems.push_back(fmt::format("optimizer stepped {} != sync {}", pattern(t.stepped), pattern(t.syncs)));
  if (t.max_param_diff > t.tolerance || t.max_norm_rel > t.norm_tolerance)
    problems.push_back(
        fmt::format("max |dparam| {:.1e} (tolerance {:.0e}), grad norm rel {:.1e} (tolerance {:.0e}), {}",
                    t.max_param_diff, t.tolerance, t.max_norm_rel, t.norm_tolerance, t.precision));
  r.passed = problems.empty();
  r.detail = r.passed
                 ? fmt::format(
                       "accum {} over {} micro-steps: sync {} = steps taken; max |dparam| {:.1e}, "
                       "grad norm rel {:.1e} ({})",
                       t.accumulation, t.micro_batches, pattern(t.syncs), t.max_param_diff, t.max_norm_rel, t.precision)
                 : join(problems);
  return r;
}

// ---------------------------------------------------------------------------------------------------
// The table

const std::vector<Check>& checks() {
  static const std::vector<Check> all = {
      {"loader_coverage", check_loader_coverage},
      {"rng_sync", check_rng_sync},
      {"training_parity", check_training_parity},
      {"collectives", check_collectives},
      {"trigger", check_trigger},
      {"gradient_accumulation", check_gradient_accumulation},
  };
  return all;
}

std::vector<std::string> check_names() {
  std::vector<std::string> names;
  for (const auto& c : checks()) names.emplace_back(c.name);
  return names;
}

bool Report::all_passed() const {
  return std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.passed; });
}

Report run_all(const Options& o, const std::vector<std::string>& names) {
  std::vector<const Check*> todo;
  for (const auto& c : checks())
    if (names.empty() || std::find(names.begin(), names.end(), c.name) != names.end()) todo.push_back(&c);
  for (const auto& n : names)
    if (std::none_of(checks().begin(), checks().end(), [&](const Check& c) { return n == c.name; }))
      throw accel::InvalidArgumentError("accel test: no check named '" + n + "'");

  std::vector<CheckResult> mine;
  for (const Check* c : todo) {
    CheckResult res;
    try {
      res = c->run(o);
    } catch (const std::exception& e) {
      res = CheckResult{c->name, false, std::string("error: ") + e.what()};
    }
    res.name = c->name;
    mine.push_back(std::move(res));
  }

  // Agree: every rank's verdict and detail (fixed-size records) to every rank.
  auto world = comm::Communicator::world();
  const int N = world->size();
  constexpr std::int64_t kRecord = 512;
  const auto K = static_cast<std::int64_t>(mine.size());
  at::Tensor local = at::zeros({K * kRecord}, at::kByte);
  auto* p = local.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < K; ++i) {
    p[i * kRecord] = mine[i].passed ? 1 : 0;
    const std::string& d = mine[i].detail;
    std::copy_n(d.begin(), std::min<std::size_t>(d.size(), kRecord - 2), p + i * kRecord + 1);
  }
  at::Tensor all = local;
  if (N > 1) {
    all = at::empty({N * K * kRecord}, at::kByte);
    world->all_gather(local, all);
  }
  const auto* a = all.data_ptr<std::uint8_t>();
  Report rep;
  rep.world = N;
  for (std::int64_t i = 0; i < K; ++i) {
    Row row{mine[i].name, true, "", {}};
    for (int k = 0; k < N; ++k) {
      const std::uint8_t* rec = a + (static_cast<std::int64_t>(k) * K + i) * kRecord;
      std::string detail(reinterpret_cast<const char*>(rec + 1));
      if (k == 0) row.detail = detail;
      if (!rec[0]) {
        if (row.passed) row.detail = (N > 1 ? fmt::format("rank {}: ", k) : std::string()) + detail;  // the first
        row.passed = false;
        row.failed_ranks.push_back(k);
      }
    }
    rep.rows.push_back(std::move(row));
  }
  return rep;
}

std::string format_report(const Report& r) {
  std::size_t w = 5;
  for (const auto& row : r.rows) w = std::max(w, row.name.size());
  std::string s = fmt::format("{:<{}}  {:<6}  {}\n", "check", w, "result", "detail");
  std::size_t failed = 0;
  for (const auto& row : r.rows) {
    std::string detail = row.detail;
    if (!row.passed && r.world > 1) {
      std::string ranks;
      for (int k : row.failed_ranks) {
        if (!ranks.empty()) ranks += ',';
        ranks += std::to_string(k);
      }
      detail += " [failed on rank(s) " + ranks + "]";
    }
    s += fmt::format("{:<{}}  {:<6}  {}\n", row.name, w, row.passed ? "PASS" : "FAIL", detail);
    failed += row.passed ? 0 : 1;
  }
  s += fmt::format("{} check(s) on {} process(es): {} passed, {} failed: {}\n", r.rows.size(), r.world,
                   r.rows.size() - failed, failed, failed ? "FAILED" : "OK");
  return s;
}

}  // namespace accel::cli::conformance
