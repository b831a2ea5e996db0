// The engine counted, not guessed: collectives per micro-step, bytes moved per step against 2Ψ/3Ψ,
// per-rank bytes by category against the ZeRO formulas; and the edges: frozen and unused parameters,
// a parameter shared across units, unsupported optimizers, clipping, wrap policies.
#include "base/log.h"
#include "base/memory.h"
#include "optim/fused_step.h"
#include "support/emulated_device.h"
#include "support/harness.h"
#include "support/scoped_env.h"

#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/lbfgs.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace accel::test {
namespace {

using comm::Collective;
using zero::ShardingSpec;

std::vector<std::pair<std::string, ShardingSpec>> all_specs() {
  std::vector<std::pair<std::string, ShardingSpec>> out = {
      {"DDP", ShardingSpec::ddp()},
      {"ZeRO1", ShardingSpec::zero(1)},
      {"ZeRO2", ShardingSpec::zero(2)},
      {"ZeRO3", ShardingSpec::zero(3)},
      {"HYBRID", ShardingSpec::fsdp("HYBRID_SHARD")},
  };
  for (auto& [n, s] : out) s.bucket_bytes = 0;  // one collective per flat parameter: countable
  return out;
}

struct Delta {
  std::uint64_t ag = 0, rs = 0, ar = 0, rep_ar = 0;
};
Delta diff(const comm::Counters& a, const comm::Counters& b, const comm::Counters& ra, const comm::Counters& rb) {
  return {b[Collective::AllGather].calls - a[Collective::AllGather].calls,
          b[Collective::ReduceScatter].calls - a[Collective::ReduceScatter].calls,
          b[Collective::AllReduce].calls - a[Collective::AllReduce].calls,
          rb[Collective::AllReduce].calls - ra[Collective::AllReduce].calls};
}

TEST(EngineCounts, CollectivesPerMicroStep) {
  // Private shards, all-gathered around each use: what this test counts (node-shared parameters,
  // the default on one node, gather nothing).
  test::ScopedEnv private_shards("ACCEL_NODE_SHARED_PARAMS", "0");
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (auto [name, spec] : all_specs())
    for (bool reshard : {true, false}) {
      if (!spec.shards_parameters() && !reshard) continue;
      spec.reshard_after_forward = reshard;
      SCOPED_TRACE(name + (reshard ? "" : " (no reshard after forward)"));
      Model mdl = make_model(ModelKind::MLP, at::kDouble);  // root: scale; 3 Linear units (weight, bias)
      auto user_opt = make_optimizer(OptKind::AdamW, *mdl.module);
      auto p = zero::prepare(mdl.module, *user_opt, spec, world);
      auto& e = *p.engine;
      ASSERT_EQ(e.flats().size(), 7u);
      ASSERT_EQ(e.num_buckets(), e.plan().passthrough ? 0u : 7u);  // a world of one reduces nothing
      const std::uint64_t F = 7, unit_flats = 6, root_flats = 1;
      auto& shard = *e.shard_group();
      auto& gather = *e.gather_group();
      auto rep = e.replicate_group();
      const bool has_rep = rep && rep->size() > 1;
      // Shard-group counts (the gather group's added when it is a group of its own), replicate group.
      auto counters = [&] {
        comm::Counters c = shard.counters();
        if (&gather != &shard) {
          comm::Counters g = gather.counters();
          for (int k = 0; k < comm::kNumCollectives; ++k) c.by_kind[k].calls += g.by_kind[k].calls;
        }
        return std::make_pair(c, rep ? rep->counters() : comm::Counters{});
      };
      const int64_t local = 12 / N;
      for (int step = 0; step < 2; ++step) {
        for (int m = 0; m < 3; ++m) {
          auto [x, y] = make_batch(ModelKind::MLP, at::kDouble, step, m);
          auto before = counters();
          {
            std::optional<zero::Engine::NoSync> ns;
            if (m < 2) ns.emplace(e);
            e.backward(mdl.loss(x.narrow(0, r * local, local), y.narrow(0, r * local, local)));
          }
          auto after = counters();
          Delta d = diff(before.first, after.first, before.second, after.second);
          const bool final_micro = m == 2 && (shard.size() > 1 || has_rep);  // a group of one reduces nothing
          std::uint64_t want_ag = spec.shards_parameters() && shard.size() > 1 ? unit_flats * (reshard ? 2 : 1) : 0;
          std::uint64_t want_rs = final_micro && spec.shards_optimizer() ? F : 0;
          std::uint64_t want_ar = final_micro && !spec.shards_optimizer() ? F : 0;
          std::uint64_t want_rep = final_micro && has_rep ? F : 0;
          EXPECT_EQ(d.ag, want_ag) << "micro-step " << m;
          EXPECT_EQ(d.rs, want_rs) << "micro-step " << m;
          EXPECT_EQ(d.ar, want_ar) << "micro-step " << m;
          EXPECT_EQ(d.rep_ar, want_rep) << "micro-step " << m;
        }
        auto before = counters();
        p.optimizer->step();
        p.optimizer->zero_grad();
        auto after = counters();
        Delta d = diff(before.first, after.first, before.second, after.second);
        // After the step: ZeRO-1/2 re-gather every flat, ZeRO-3 only the always-gathered root unit.
        std::uint64_t want_ag = !spec.shards_optimizer() || shard.size() == 1 ? 0
                                : spec.shards_parameters()                    ? root_flats
                                                                              : F;
        EXPECT_EQ(d.ag, want_ag) << "step";
        EXPECT_EQ(d.rs + d.ar + d.rep_ar, 0u) << "step";
      }
    }
}

// Bytes moved per rank per step, nccl-tests' bus bytes: all_reduce 2(N-1)/N x size, reduce_scatter
// and all_gather (N-1)/N x the full size.
TEST(EngineCounts, TrafficMatchesZeroFormulas) {
  // Private shards, all-gathered around each use: what this test counts (node-shared parameters,
  // the default on one node, gather nothing).
  test::ScopedEnv private_shards("ACCEL_NODE_SHARED_PARAMS", "0");
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const std::vector<int64_t> widths = {64, 64, 64, 64, 64};
  const double psi = 4 * (64 * 64 + 64);  // parameters; all in units, none in the root
  for (auto [name, spec] : all_specs()) {
    if (spec.hybrid()) continue;
    SCOPED_TRACE(name);
    at::manual_seed(7);
    auto mlp = std::make_shared<MLPImpl>(widths, /*root_param=*/false);
    mlp->to(test_device());  // (ACCEL_TEST_DEVICE=cuda: the traffic of the device's collectives)
    auto user_opt = make_optimizer(OptKind::SGD, *mlp);
    auto p = zero::prepare(mlp, *user_opt, spec, world);
    std::vector<comm::Communicator*> groups{world.get()};
    for (auto* g : {p.engine->shard_group().get(), p.engine->gather_group().get()})
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    std::vector<comm::Counters> before;
    for (auto* g : groups) before.push_back(g->counters());
    at::manual_seed(3);
    at::Tensor x = at::randn({4 * N, 64}).to(test_device());
    p.engine->backward(mlp->forward(x.narrow(0, r * 4, 4)).pow(2).mean());
    p.optimizer->step();
    auto bytes = [&](Collective c, bool sent) {
      double b = 0;
      for (std::size_t k = 0; k < groups.size(); ++k) {
        auto after = groups[k]->counters();
        b += static_cast<double>(sent ? after[c].bytes_sent - before[k][c].bytes_sent
                                      : after[c].bytes_received - before[k][c].bytes_received);
      }
      return b;
    };
    double f = N > 1 ? (N - 1.0) / N : 0.0;
    double bus = bytes(Collective::AllReduce, true) * 2 * f + bytes(Collective::ReduceScatter, true) * f +
                 bytes(Collective::AllGather, false) * f;
    double want = (spec.shards_parameters() ? 3 : 2) * psi * f * 4;
    if (N == 1)
      EXPECT_EQ(bus, 0.0);
    else
      EXPECT_NEAR(bus / want, 1.0, 0.01) << "bus bytes " << bus << " want " << want;
  }
}

// Per-rank bytes by category (counting allocator) against the ZeRO formulas, fp32 AdamW:
// parameters 4Ψ (ZeRO-3: 4Ψ/N), gradients 4Ψ (ZeRO-2/3: 4Ψ/N), optimizer state 8Ψ (sharded: 8Ψ/N).
// Both with private shards and gradient buffers, all-gathered around each use (the path GPUs take),
// and with node-shared ones (the default on one CPU node): there each rank counts its share of the
// shared memory (its shard, its part of the gradient pool) and Snapshot::node_shared the whole, which
// the node holds once.
TEST(EngineMemory, BytesByCategoryMatchZeroFormulas) {
  ASSERT_TRUE(memory::counting_installed());
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  using memory::Category;
  for (bool shared : {false, true}) {
    test::ScopedEnv params("ACCEL_NODE_SHARED_PARAMS", shared ? "1" : "0");
    test::ScopedEnv grads("ACCEL_NODE_SHARED_GRADS", shared ? "1" : "0");
    for (auto [name, spec] : all_specs()) {
      if (spec.hybrid()) continue;
      SCOPED_TRACE(name + (shared ? " node-shared" : " private"));
      at::manual_seed(7);
      auto mlp = std::make_shared<MLPImpl>(std::vector<int64_t>{64, 64, 64, 64, 64}, /*root_param=*/false);
      auto user_opt = make_optimizer(OptKind::AdamW, *mlp);
      auto s0 = memory::snapshot();
      auto p = zero::prepare(mlp, *user_opt, spec, world);
      std::int64_t psi = 0, max_unit = 0;  // padded elements
      for (const auto& u : p.engine->units()) {
        std::int64_t n = 0;
        for (auto fi : u.flats) n += p.engine->flats()[fi].flat_param->layout().padded();
        max_unit = std::max(max_unit, n);
        psi += n;
      }
      const std::int64_t e = 4, shard = psi / N;
      const bool params_shared = p.engine->node_shared();
      const std::int64_t pool = p.engine->node_shared_grad_bytes();  // this rank's part of the gradient pool
      // (Node-shared memory needs the group on one node: across nodes, real or simulated, there is none.)
      if (shared && N > 1 && world->topology().num_nodes == 1) {
        EXPECT_EQ(params_shared, spec.shards_parameters());
        EXPECT_EQ(pool > 0, spec.shards_gradients());
      } else {
        EXPECT_FALSE(params_shared);
        EXPECT_EQ(pool, 0);
      }
      auto s1 = memory::snapshot();
      auto cur = [](const memory::Snapshot& a, const memory::Snapshot& b, Category c) {
        return b[c].current - a[c].current;
      };
      EXPECT_EQ(cur(s0, s1, Category::Parameters), (spec.shards_parameters() ? shard : psi) * e);
      // The node holds the shared parameters and the pool once: every rank's parts.
      EXPECT_EQ(s1.node_shared.current - s0.node_shared.current,
                (params_shared ? psi * e : 0) + static_cast<std::int64_t>(N) * pool);
      at::manual_seed(3);
      at::Tensor x = at::randn({4 * N, 64});
      memory::reset_peaks();
      auto s2 = memory::snapshot();
      p.engine->backward(mlp->forward(x.narrow(0, r * 4, 4)).pow(2).mean());
      auto s3 = memory::snapshot();
      // (A world of one passes autograd's gradients straight to the optimizer: nothing of the engine's.)
      EXPECT_EQ(cur(s0, s3, Category::Gradients),
                p.engine->plan().passthrough ? 0 : (spec.shards_gradients() ? shard : psi) * e + pool);
      if (spec.shards_parameters() && N > 1) {
        const std::int64_t gathered = s3[Category::Gathered].peak - s2[Category::Gathered].current;
        if (params_shared) {
          EXPECT_EQ(gathered, 0) << "node-shared parameters are whole without a gather";
        } else {
          // Gathered parameters never exceed the current unit plus the prefetched one (no root here).
          EXPECT_LE(gathered, 2 * max_unit * e);
          EXPECT_GT(gathered, 0);
        }
        EXPECT_EQ(cur(s0, s3, Category::Gathered), 0);  // all freed after backward
      }
      p.optimizer->step();
      auto s4 = memory::snapshot();
      EXPECT_EQ(cur(s0, s4, Category::OptimizerState), 2 * (spec.shards_optimizer() ? shard : psi) * e);
      EXPECT_EQ(cur(s0, s4, Category::Parameters), (spec.shards_parameters() ? shard : psi) * e);
    }
    // Gone with the engine: nothing of it is counted any more.
    EXPECT_EQ(memory::snapshot().node_shared.current, 0);
  }
}

TEST(EngineMemory, CountingAllocatorCountsByCategory) {
  using memory::Category;
  auto s0 = memory::snapshot();
  {
    memory::CategoryScope g(Category::Gradients);
    at::Tensor a = at::empty({1000}, at::kFloat);
    {
      memory::CategoryScope o(Category::OptimizerState);  // scopes nest
      at::Tensor b = at::empty({10}, at::kDouble);
      auto s1 = memory::snapshot();
      EXPECT_EQ(s1[Category::Gradients].current - s0[Category::Gradients].current, 4000);
      EXPECT_EQ(s1[Category::OptimizerState].current - s0[Category::OptimizerState].current, 80);
      EXPECT_EQ(s1.total.current - s0.total.current, 4080);
    }
    at::Tensor c = at::gelu(a.fill_(1.0f));  // oneDNN-style raw allocations go through it too
    EXPECT_FLOAT_EQ(c[0].item<float>(), 0.8413447f);
  }
  auto s2 = memory::snapshot();
  EXPECT_EQ(s2[Category::Gradients].current, s0[Category::Gradients].current);
  EXPECT_EQ(s2[Category::OptimizerState].current, s0[Category::OptimizerState].current);
  EXPECT_GE(s2[Category::Gradients].peak, s0[Category::Gradients].current + 4000);
  memory::reset_peaks();
  EXPECT_EQ(memory::snapshot()[Category::Gradients].peak, s2[Category::Gradients].current);
}

// --- edges -------------------------------------------------------------------------------------------

// Trains 3 SGD steps of a single-process reference (the whole batch) and of an identical model under
// `spec` (this rank's rows), then checks every shard. build(): a fresh model (same seed each call);
// ref_backward: the reference's backward on the global batch; local_loss: this rank's loss.
template <class M>
void compare_sgd(const ShardingSpec& spec, const std::function<std::shared_ptr<M>()>& build,
                 const std::function<void(M&, const at::Tensor&, const at::Tensor&)>& ref_backward,
                 const std::function<at::Tensor(M&, const at::Tensor&, const at::Tensor&)>& local_loss) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  auto ref = build(), mdl = build();
  auto trainable = [](M& m) {
    std::vector<at::Tensor> ps;
    for (auto& p : m.parameters())
      if (p.requires_grad()) ps.push_back(p);
    return ps;
  };
  torch::optim::SGD ref_opt(trainable(*ref), torch::optim::SGDOptions(0.1));
  torch::optim::SGD user_opt(trainable(*mdl), torch::optim::SGDOptions(0.1));
  auto p = zero::prepare(mdl, user_opt, spec, world);
  const int64_t local = 12 / N;
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = make_batch(ModelKind::MLP, at::kDouble, step, 0);
    ref_backward(*ref, x, y);
    p.engine->backward(local_loss(*mdl, x.narrow(0, r * local, local), y.narrow(0, r * local, local)));
    ref_opt.step();
    ref_opt.zero_grad();
    p.optimizer->step();
    p.optimizer->zero_grad();
  }
  auto want = params_by_name(*ref);
  for (const auto& f : p.engine->flats())
    EXPECT_LE(rel_err(f.flat_param->shard(), own_slice(*f.flat_param, flatten_like(*f.flat_param, want))), 1e-12)
        << f.flat_param->name();
}

// The MLP, edited by `tweak` before training.
void train_and_compare(const ShardingSpec& spec, const std::function<void(MLPImpl&)>& tweak) {
  compare_sgd<MLPImpl>(
      spec,
      [&] {
        at::manual_seed(11);
        auto m = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
        m->to(test_device(), at::kDouble);
        tweak(*m);
        return m;
      },
      [](MLPImpl& m, const at::Tensor& x, const at::Tensor& y) { at::mse_loss(m.forward(x), y).backward(); },
      [](MLPImpl& m, const at::Tensor& x, const at::Tensor& y) { return at::mse_loss(m.forward(x), y); });
}

TEST(EngineEdges, FrozenParameters) {
  for (auto [name, spec] : all_specs()) {
    SCOPED_TRACE(name);
    train_and_compare(spec, [](MLPImpl& m) {
      for (auto& p : m.layers[0]->parameters()) p.set_requires_grad(false);
      m.scale.set_requires_grad(false);
    });
  }
}

// A unit that exists but is never called: its parameters get no gradient on any rank.
struct WithUnused : MLPImpl {
  WithUnused() : MLPImpl({6, 10, 10, 3}) { spare = accel::unit(register_module("spare", torch::nn::Linear(3, 3))); }
  accel::Unit<torch::nn::LinearImpl> spare;
};

TEST(EngineEdges, UnusedUnitDoesNotHangOrCorrupt) {
  for (auto [name, spec] : all_specs()) {
    SCOPED_TRACE(name);
    compare_sgd<WithUnused>(
        spec,
        [] {
          at::manual_seed(5);
          auto m = std::make_shared<WithUnused>();
          m->to(test_device(), at::kDouble);
          return m;
        },
        [](WithUnused& m, const at::Tensor& x, const at::Tensor& y) { at::mse_loss(m.forward(x), y).backward(); },
        [](WithUnused& m, const at::Tensor& x, const at::Tensor& y) { return at::mse_loss(m.forward(x), y); });
  }
}

// A root-level parameter used by rank 0's forward only (data-dependent control flow): the others
// contribute zeros, and the result is the reference's average over ranks. No units: replicated
// strategies and ZeRO-1/2 allow ranks to run different graphs.
struct Branchy : torch::nn::Module {
  Branchy() {
    a = register_module("a", torch::nn::Linear(6, 3));
    extra = register_parameter("extra", at::randn({3}));
  }
  at::Tensor forward(const at::Tensor& x, bool use_extra) { return use_extra ? a(x) + extra : a(x); }
  torch::nn::Linear a{nullptr};
  at::Tensor extra;
};

TEST(EngineEdges, ParameterUnusedOnSomeRanks) {
  const int N = test::world()->size(), r = test::world()->rank();
  const int64_t local = 12 / N;
  for (auto [name, spec] : all_specs()) {
    if (spec.shards_parameters()) continue;
    SCOPED_TRACE(name);
    compare_sgd<Branchy>(
        spec,
        [] {
          at::manual_seed(9);
          auto m = std::make_shared<Branchy>();
          m->to(test_device(), at::kDouble);
          return m;
        },
        [&](Branchy& m, const at::Tensor& x, const at::Tensor& y) {
          for (int q = 0; q < N; ++q)  // the reference replays every rank's local loss, averaged
            (at::mse_loss(m.forward(x.narrow(0, q * local, local), q == 0), y.narrow(0, q * local, local)) / N)
                .backward();
          if (!m.extra.grad().defined()) m.extra.mutable_grad() = at::zeros_like(m.extra);
        },
        [&](Branchy& m, const at::Tensor& x, const at::Tensor& y) { return at::mse_loss(m.forward(x, r == 0), y); });
  }
}

// Every shard of a prepared model against the reference's parameters.
void expect_shards_equal(const zero::Engine& e, torch::nn::Module& ref, double tol = 1e-12) {
  auto want = params_by_name(ref);
  for (const auto& f : e.flats())
    EXPECT_LE(rel_err(f.flat_param->shard(), own_slice(*f.flat_param, flatten_like(*f.flat_param, want))), tol)
        << f.flat_param->name();
}

std::shared_ptr<MLPImpl> seeded_mlp() {
  at::manual_seed(11);
  auto m = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
  m->to(test_device(), at::kDouble);
  return m;
}

// Gradient lifetimes under `spec`: two sync backwards before one step add up; zero_grad without a
// step discards; a backward that throws on every rank is forgotten. Each against the reference doing
// the same (the throw comes before any bucket was reduced, so the gradients pending before it stay).
void gradient_lifetimes(const std::string& name, const ShardingSpec& spec) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const int64_t local = 12 / N;
  {
    for (int scenario = 0; scenario < 6; ++scenario) {
      // scenario 5 drives plain loss.backward() on a model without units: only the sharded-optimizer
      // strategies can notice a discard there (DDP's .grad views accumulate before any hook runs).
      if (scenario == 5 && !spec.shards_optimizer()) continue;
      SCOPED_TRACE(name + " scenario " + std::to_string(scenario));
      ShardingSpec sp = spec;
      if (scenario == 5) sp.wrap.kind = zero::WrapPolicy::Kind::None;
      auto ref = seeded_mlp(), mdl = seeded_mlp();
      torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      torch::optim::SGD user_opt(mdl->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto p = zero::prepare(mdl, user_opt, sp, world);
      auto& e = *p.engine;
      for (int step = 0; step < 2; ++step) {
        auto [x1, y1] = make_batch(ModelKind::MLP, at::kDouble, step, 0);
        auto [x2, y2] = make_batch(ModelKind::MLP, at::kDouble, step, 1);
        auto local_loss = [&](const at::Tensor& x, const at::Tensor& y) {
          return at::mse_loss(mdl->forward(x.narrow(0, r * local, local)), y.narrow(0, r * local, local));
        };
        auto ref_backward = [&](const at::Tensor& x, const at::Tensor& y) {
          at::mse_loss(ref->forward(x), y).backward();
        };
        // A backward that throws on every rank after part of the graph (the root scale) ran.
        auto throwing_backward = [&] {
          at::Tensor out = mdl->forward(x1.narrow(0, r * local, local));
          out.register_hook([](const at::Tensor& g) -> at::Tensor {
            if (g.defined()) throw std::runtime_error("injected");
            return g;
          });
          at::Tensor loss = at::mse_loss(out, y1.narrow(0, r * local, local)) * mdl->scale;
          EXPECT_THROW(e.backward(loss), std::exception);
        };
        switch (scenario) {
          case 0:  // two sync backwards, one step: the gradients add
            ref_backward(x1, y1);
            ref_backward(x2, y2);
            e.backward(local_loss(x1, y1));
            e.backward(local_loss(x2, y2));
            break;
          case 1:  // backward, zero_grad (no step), backward: only the second counts
            ref_backward(x2, y2);
            e.backward(local_loss(x1, y1));
            p.optimizer->zero_grad();
            e.backward(local_loss(x2, y2));
            break;
          case 2:  // a backward that throws, then a clean one
            ref_backward(x2, y2);
            throwing_backward();
            p.optimizer->zero_grad();
            e.backward(local_loss(x2, y2));
            break;
          case 3:  // sync backward, a throwing one, another sync one: the first and the last add
            ref_backward(x1, y1);
            ref_backward(x2, y2);
            e.backward(local_loss(x1, y1));
            throwing_backward();
            e.backward(local_loss(x2, y2));
            break;
          case 4: {  // an accumulation micro-step, zero_grad, a sync backward: only the last counts
            ref_backward(x2, y2);
            {
              zero::Engine::NoSync ns(e);
              e.backward(local_loss(x1, y1));
            }
            p.optimizer->zero_grad();
            e.backward(local_loss(x2, y2));
            break;
          }
          case 5:  // as 1, through plain loss.backward()
            ref_backward(x2, y2);
            local_loss(x1, y1).backward();
            p.optimizer->zero_grad();
            local_loss(x2, y2).backward();
            break;
        }
        ref_opt.step();
        ref_opt.zero_grad();
        p.optimizer->step();
        p.optimizer->zero_grad();
      }
      expect_shards_equal(e, *ref);
    }
  }
}

TEST(EngineLifecycle, GradientsLastUntilStepAndZeroGradDiscards) {
  for (auto [name, spec] : all_specs()) gradient_lifetimes(name, spec);
}

// The same under optimizer offload from a device (the masters in host memory, each window's sum
// arriving there): on a device its own (gpu_check.sh's engine_cuda steps), on the CPU through the
// emulated device (support/emulated_device.h). A zero_grad() inside a NoSync window is seen there too
// (the host masters' placeholder gradient); a backward that throws before any bucket was reduced keeps
// what was pending in host memory, as in memory (docs/design.md, accumulation).
TEST(EngineLifecycle, GradientsLastUntilStepUnderOptimizerOffload) {
  const EmulatedDevice emulated;  // (no effect on a device's model)
  for (auto [name, spec] : all_specs()) {
    if (!spec.shards_optimizer()) continue;  // (offload keeps sharded optimizer state)
    spec.offload.optimizer = zero::OffloadDevice::Cpu;
    gradient_lifetimes(name + " offloaded", spec);
  }
}

// zero_grad(set_to_none=false) discards too, also where the master's gradient is a converted copy:
// the run with a discarded backward must equal the run without it, exactly.
TEST(EngineLifecycle, InPlaceZeroGradDiscardsConvertedMasterGradients) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const int64_t local = 12 / N;
  for (auto [name, spec] : all_specs()) {
    SCOPED_TRACE(name);
    spec.master_dtype = at::kDouble;  // the model computes in float32
    std::vector<at::Tensor> shards[2];
    for (int discard = 0; discard < 2; ++discard) {
      at::manual_seed(11);
      auto mdl = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
      mdl->to(test_device());
      torch::optim::SGD user_opt(mdl->parameters(), torch::optim::SGDOptions(0.1));
      auto p = zero::prepare(mdl, user_opt, spec, world);
      for (int step = 0; step < 2; ++step) {
        auto [x1, y1] = make_batch(ModelKind::MLP, at::kFloat, step, 0);
        auto [x2, y2] = make_batch(ModelKind::MLP, at::kFloat, step, 1);
        if (discard) {
          p.engine->backward(
              at::mse_loss(mdl->forward(x1.narrow(0, r * local, local)), y1.narrow(0, r * local, local)));
          p.optimizer->zero_grad(/*set_to_none=*/false);
        }
        p.engine->backward(at::mse_loss(mdl->forward(x2.narrow(0, r * local, local)), y2.narrow(0, r * local, local)));
        p.optimizer->step();
        p.optimizer->zero_grad(false);
      }
      for (const auto& f : p.engine->flats())
        shards[discard].push_back(f.master.defined() ? f.master.clone() : f.flat_param->shard().clone());
    }
    for (std::size_t i = 0; i < shards[0].size(); ++i) EXPECT_TRUE(at::equal(shards[0][i], shards[1][i])) << i;
  }
}

// A zero_grad() inside a NoSync window discards the window whatever the masters' dtype: bf16 masters
// (DeepSpeed's bf16_master_weights_and_grads: the window adds up in bf16 by default, in fp32 where
// named, where the masters' gradient cannot be a view of it), fp64 masters over fp32 compute (an fp32
// window), fp32; and whether zero_grad sets the gradients to none or zeroes them in place (after a
// step's zero_grad(false), the masters' gradients are zeros nobody set for this window). The run with
// a discarded micro-step equals the run without it, exactly.
TEST(EngineLifecycle, ZeroGradInAWindowDiscardsItWhateverTheMasterDtype) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const int64_t local = 12 / N;
  struct Dtypes {
    const char* name;
    c10::ScalarType param, master;
    std::optional<c10::ScalarType> window;
    bool on_disk = false;  // the optimizer (masters) offloaded to nvme: the masters are meta handles
  };
  const Dtypes cases[] = {{"bf16 masters", at::kBFloat16, at::kBFloat16, std::nullopt},
                          {"bf16 masters, fp32 window", at::kBFloat16, at::kBFloat16, at::kFloat},
                          {"fp64 masters", at::kFloat, at::kDouble, std::nullopt},
                          {"fp32", at::kFloat, at::kFloat, std::nullopt},
                          {"fp32 masters, bf16 window", at::kBFloat16, at::kFloat, at::kBFloat16},
                          {"fp32 masters on disk, bf16 window", at::kBFloat16, at::kFloat, at::kBFloat16, true}};
  for (auto [name, base] : all_specs())
    for (const Dtypes& d : cases)
      for (bool to_none : {true, false}) {
        if (d.on_disk && !base.shards_optimizer()) continue;  // (offload keeps sharded optimizer state)
        SCOPED_TRACE(name + ", " + d.name + (to_none ? ", zero_grad to none" : ", zero_grad in place"));
        ShardingSpec spec = base;
        spec.param_dtype = d.param;
        spec.master_dtype = d.master;
        spec.reduce_dtype = at::kFloat;
        spec.accumulate_dtype = d.window;
        if (d.on_disk) {
          static const std::string dir = test::scratch_dir("window_masters");
          spec.offload.optimizer = zero::OffloadDevice::Nvme;
          spec.offload.optimizer_nvme_path = dir;
        }
        std::vector<at::Tensor> shards[2];
        for (int discard = 0; discard < 2; ++discard) {
          at::manual_seed(11);
          auto mdl = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
          mdl->to(test_device());
          torch::optim::SGD user_opt(mdl->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
          auto p = zero::prepare(mdl, user_opt, spec, world);
          auto loss = [&](const at::Tensor& x, const at::Tensor& y) {
            return at::mse_loss(mdl->forward(x.narrow(0, r * local, local).to(d.param)),
                                y.narrow(0, r * local, local).to(d.param));
          };
          for (int step = 0; step < 2; ++step) {
            auto [x1, y1] = make_batch(ModelKind::MLP, at::kFloat, step, 0);
            auto [x2, y2] = make_batch(ModelKind::MLP, at::kFloat, step, 1);
            if (discard) {
              {
                zero::Engine::NoSync ns(*p.engine);
                p.engine->backward(loss(x1, y1));
              }
              // The masters' stand-in gradient costs nothing beside the window: a view of it, or one
              // element.
              for (const auto& f : p.engine->flats()) {
                if (!f.master.defined() || !f.master.grad().defined()) continue;
                const at::Tensor& g = f.master.grad();
                const at::Tensor& full = f.flat_param->grad_full();
                EXPECT_TRUE((f.grad_sum.defined() && g.is_alias_of(f.grad_sum)) ||
                            (full.defined() && g.is_alias_of(full)) ||
                            g.storage().nbytes() <= static_cast<std::size_t>(g.element_size()))
                    << f.flat_param->name() << ": a placeholder of " << g.storage().nbytes() << " bytes";
              }
              p.optimizer->zero_grad(to_none);
            }
            p.engine->backward(loss(x2, y2));
            p.optimizer->step();
            p.optimizer->zero_grad(to_none);
          }
          for (const auto& f : p.engine->flats())  // (the masters, wherever they are: on disk too)
            shards[discard].push_back(p.engine->whole_values(f, zero::Engine::Source::Master).clone());
        }
        for (std::size_t i = 0; i < shards[0].size(); ++i) EXPECT_TRUE(at::equal(shards[0][i], shards[1][i])) << i;
      }
}

// A NoSync backward that throws drops the window's fp32 sum (bf16 compute), and the placeholder
// master.grad over it with it: kept, it would hold the sum's memory until the next sync backward. The
// next micro-step's placeholder is a view of its own sum again. The earlier micro-steps' gradients go
// with the window, and a warning says so (none where the window was empty).
TEST(EngineLifecycle, AFailedMicroStepLetsGoOfTheWindowsSum) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const int64_t local = 12 / N;
  for (auto [name, spec] : all_specs()) {
    SCOPED_TRACE(name);
    spec.param_dtype = at::kBFloat16;
    spec.master_dtype = at::kFloat;
    spec.reduce_dtype = at::kFloat;
    at::manual_seed(11);
    auto mdl = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});
    mdl->to(test_device());
    torch::optim::SGD user_opt(mdl->parameters(), torch::optim::SGDOptions(0.1));
    auto p = zero::prepare(mdl, user_opt, spec, world);
    zero::Engine& e = *p.engine;
    if (e.plan().passthrough) continue;
    auto [x, y] = make_batch(ModelKind::MLP, at::kFloat, 0, 0);
    at::Tensor xl = x.narrow(0, r * local, local).to(at::kBFloat16),
               yl = y.narrow(0, r * local, local).to(at::kBFloat16);
    // Each flat with a master has a placeholder over its window's sum.
    auto expect_placeholders = [&] {
      for (const auto& f : e.flats()) {
        if (!f.master.defined()) continue;
        ASSERT_TRUE(f.grad_sum.defined()) << f.flat_param->name();
        ASSERT_TRUE(f.master.grad().defined()) << f.flat_param->name();
        EXPECT_TRUE(f.master.grad().is_alias_of(f.grad_sum)) << f.flat_param->name();
      }
    };
    // A backward that throws; what it logged.
    auto failing_backward = [&] {
      at::Tensor out = mdl->forward(xl);
      out.register_hook([](const at::Tensor& g) -> at::Tensor {
        if (g.defined()) throw std::runtime_error("injected");
        return g;
      });
      testing::internal::CaptureStderr();
      EXPECT_THROW(e.backward(at::mse_loss(out, yl) * mdl->scale), std::exception);
      return testing::internal::GetCapturedStderr();
    };
    // (A log level above warnings, ACCEL_LOG_LEVEL=error, says nothing either way.)
    const bool warns = log::enabled(log::Level::Warning);
    const std::string kLost = "dropped the gradients of the micro-steps before it";
    auto lost = [&](const std::string& said) { return said.find(kLost) != std::string::npos; };
    {
      zero::Engine::NoSync ns(e);
      EXPECT_FALSE(lost(failing_backward())) << "nothing was in the window";
      EXPECT_FALSE(lost(failing_backward())) << "nothing was in the window after a failed backward";
      e.backward(at::mse_loss(mdl->forward(xl), yl));
      expect_placeholders();
      EXPECT_EQ(lost(failing_backward()), warns);
      for (const auto& f : e.flats()) {
        EXPECT_FALSE(f.grad_sum.defined()) << f.flat_param->name();
        EXPECT_FALSE(f.master.defined() && f.master.grad().defined())
            << "a placeholder over the dropped sum of " << f.flat_param->name();
      }
      e.backward(at::mse_loss(mdl->forward(xl), yl));
      expect_placeholders();
    }
    e.backward(at::mse_loss(mdl->forward(xl), yl));
    // A reduced gradient pending from a sync backward is no unreduced window (DDP keeps it in the
    // buffer its .grad show until the next backward settles it), nor is anything after a step.
    {
      zero::Engine::NoSync ns(e);
      EXPECT_FALSE(lost(failing_backward())) << "after a sync backward";
    }
    p.optimizer->step();
    EXPECT_FALSE(lost(failing_backward())) << "after a step";
  }
}

// A unit whose extra parameter only rank 0's forward uses (data-dependent, as in a mixture of
// experts): under ZeRO-3 that rank's reduce-scatter launches at a different time than the others'.
struct MaybeBonus : torch::nn::Module {
  MaybeBonus() {
    lin = register_module("lin", torch::nn::Linear(5, 5));
    bonus = register_parameter("bonus", at::randn({5}));
  }
  at::Tensor forward(const at::Tensor& x) { return use_bonus ? lin(x) + bonus : lin(x); }
  torch::nn::Linear lin{nullptr};
  at::Tensor bonus;
  bool use_bonus = false;
};
struct Stack : torch::nn::Module {
  Stack() {
    for (int i = 0; i < 4; ++i)
      blocks.push_back(accel::unit(register_module("b" + std::to_string(i), std::make_shared<MaybeBonus>())));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& b : blocks) x = at::tanh(b(x));
    return x;
  }
  void set_bonus(bool on) {
    for (auto& b : blocks) b->use_bonus = on;
  }
  std::vector<accel::Unit<MaybeBonus>> blocks;
};

std::shared_ptr<Stack> seeded_stack() {
  at::manual_seed(21);
  auto m = std::make_shared<Stack>();
  m->to(test_device(), at::kDouble);
  return m;
}

// The reference's backward for a global batch whose rank q uses the bonus iff q == 0: every rank's
// local loss replayed and averaged; bonuses no rank used get zero gradients, as the engine gives.
void stack_reference_backward(Stack& ref, const at::Tensor& x, const at::Tensor& y, int N) {
  const int64_t local = x.size(0) / N;
  for (int q = 0; q < N; ++q) {
    ref.set_bonus(q == 0);
    (at::mse_loss(ref.forward(x.narrow(0, q * local, local)), y.narrow(0, q * local, local)) / N).backward();
  }
  for (auto& b : ref.blocks)
    if (!b->bonus.grad().defined()) b->bonus.mutable_grad() = at::zeros_like(b->bonus);
}

TEST(EngineLifecycle, DataDependentUnusedParametersUnderZero3) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const int64_t local = 12 / N;
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "no prefetch");
    auto ref = seeded_stack(), mdl = seeded_stack();
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD user_opt(mdl->parameters(), torch::optim::SGDOptions(0.1));
    ShardingSpec spec = ShardingSpec::zero(3);
    spec.bucket_bytes = 0;
    spec.backward_prefetch = spec.forward_prefetch = prefetch;
    auto p = zero::prepare(mdl, user_opt, spec, world);
    for (int step = 0; step < 3; ++step) {
      at::manual_seed(300 + step);
      at::Tensor x = at::randn({12, 5}, at::kDouble).to(test_device()),
                 y = at::randn({12, 5}, at::kDouble).to(test_device());
      stack_reference_backward(*ref, x, y, N);
      mdl->set_bonus(r == 0);
      p.engine->backward(at::mse_loss(mdl->forward(x.narrow(0, r * local, local)), y.narrow(0, r * local, local)));
      ref_opt.step();
      ref_opt.zero_grad();
      p.optimizer->step();
      p.optimizer->zero_grad();
    }
    expect_shards_equal(*p.engine, *ref);
  }
}

// A backward that throws on every rank while one rank has launched reductions the others have not
// (its parameters were all used): the abort issues the rest, so no rank waits on a collective the
// others skip, and the next step is clean.
TEST(EngineLifecycle, ThrowingBackwardWithDataDependentUnusedParameters) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const int64_t local = 12 / N;
  for (auto [name, spec] : all_specs()) {
    SCOPED_TRACE(name);
    auto ref = seeded_stack(), mdl = seeded_stack();
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD user_opt(mdl->parameters(), torch::optim::SGDOptions(0.1));
    auto p = zero::prepare(mdl, user_opt, spec, world);
    at::manual_seed(300);
    at::Tensor x = at::randn({12, 5}, at::kDouble).to(test_device()),
               y = at::randn({12, 5}, at::kDouble).to(test_device());
    at::Tensor xl = x.narrow(0, r * local, local), yl = y.narrow(0, r * local, local);
    // The throwing backward: blocks 2 and 3 finish (rank 0 launches their reductions), then block 1's
    // output hook throws.
    mdl->set_bonus(r == 0);
    at::Tensor h = at::tanh(mdl->blocks[0](xl));
    h = at::tanh(mdl->blocks[1](h));
    h.register_hook([](const at::Tensor& g) -> at::Tensor {
      if (g.defined()) throw std::runtime_error("injected");
      return g;
    });
    h = at::tanh(mdl->blocks[3](at::tanh(mdl->blocks[2](h))));
    EXPECT_THROW(p.engine->backward(at::mse_loss(h, yl)), std::exception);
    p.optimizer->zero_grad();
    // Then a clean step, against the reference's.
    stack_reference_backward(*ref, x, y, N);
    p.engine->backward(at::mse_loss(mdl->forward(xl), yl));
    ref_opt.step();
    p.optimizer->step();
    expect_shards_equal(*p.engine, *ref);
  }
}

// A micro-step that throws in the middle of an accumulation window whose micro-steps reduce
// (Engine::MoreMicroSteps). Under ZeRO-2/3 and FSDP each reduced shard is added to the window's pending
// one as its bucket finishes, which cannot be taken back: where a rank throws after some buckets
// finished (here the last layers'), the window goes on every rank alike and the step has only the
// backward after it. Where every rank throws before any bucket finished (at the loss's own gradient),
// the window is kept: the step has both clean backward passes, as for DDP and ZeRO-1, which add at the
// end of backward. Against the reference doing the same. The ranks agree on it: rank 0 throws
// mid-network while its peers throw at the loss, where parameters are not gathered again in backward
// (ZeRO-2, SHARD_GRAD_OP; under ZeRO-3 and FULL_SHARD a rank that goes further in backward issues
// gathers its peers do not, so there every rank throws at the same point).
TEST(EngineLifecycle, AMicroStepThatThrowsMidNetworkDropsAWindowItAddedTo) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const int64_t local = 12 / N;
  std::vector<std::pair<std::string, ShardingSpec>> specs = {{"DDP", ShardingSpec::ddp()},
                                                             {"ZeRO1", ShardingSpec::zero(1)},
                                                             {"ZeRO2", ShardingSpec::zero(2)},
                                                             {"ZeRO3", ShardingSpec::zero(3)},
                                                             {"FULL_SHARD", ShardingSpec::fsdp("FULL_SHARD")},
                                                             {"SHARD_GRAD_OP", ShardingSpec::fsdp("SHARD_GRAD_OP")}};
  for (auto [name, spec] : specs)
    for (bool mid : {false, true}) {
      SCOPED_TRACE(name + (mid ? " mid-network on rank 0" : " at the loss"));
      spec.bucket_bytes = 0;            // a bucket per layer,
      spec.grad_buckets_in_flight = 1;  // each finished as soon as it is launched
      auto ref = seeded_mlp(), mdl = seeded_mlp();
      torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      torch::optim::SGD user_opt(mdl->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto p = zero::prepare(mdl, user_opt, spec, world);
      auto& e = *p.engine;
      auto [x1, y1] = make_batch(ModelKind::MLP, at::kDouble, 0, 0);
      auto [x2, y2] = make_batch(ModelKind::MLP, at::kDouble, 0, 1);
      auto local_loss = [&](const at::Tensor& x, const at::Tensor& y) {
        return at::mse_loss(mdl->forward(x.narrow(0, r * local, local)), y.narrow(0, r * local, local));
      };
      {
        zero::Engine::MoreMicroSteps more(e);
        e.backward(local_loss(x1, y1));
        // The throwing micro-step: fc2's and fc1's units run their backward first where the throw is
        // at fc0's output.
        auto thrower = [](const at::Tensor& g) -> at::Tensor {
          if (g.defined()) throw std::runtime_error("injected");
          return g;
        };
        const bool regathers = name == "ZeRO3" || name == "FULL_SHARD";
        const bool mid_here = mid && (r == 0 || regathers);
        at::Tensor h = at::tanh(mdl->layers[0](x1.narrow(0, r * local, local)));
        if (mid_here) h.register_hook(thrower);
        h = mdl->layers[2](at::tanh(mdl->layers[1](h))) * mdl->scale;
        if (!mid_here) h.register_hook(thrower);
        EXPECT_THROW(e.backward(at::mse_loss(h, y1.narrow(0, r * local, local))), std::exception);
      }
      e.backward(local_loss(x2, y2));
      // The reference: what the step should have. (One rank keeps everything: a passthrough engine puts
      // the gradients autograd had before the throw back.)
      const bool adds_on_the_way = name != "DDP" && name != "ZeRO1" && !e.plan().passthrough;
      if (!(mid && adds_on_the_way)) at::mse_loss(ref->forward(x1), y1).backward();
      at::mse_loss(ref->forward(x2), y2).backward();
      ref_opt.step();
      p.optimizer->step();
      expect_shards_equal(e, *ref);
    }
}

// unshard() leaves the model whole: it keeps working after the engine is gone.
TEST(EngineLifecycle, UnshardDetachesTheModelFromTheEngine) {
  auto world = test::world();
  auto mdl = seeded_mlp(), ref = seeded_mlp();
  at::Tensor x = at::randn({4, 6}, at::kDouble).to(test_device());
  {
    torch::optim::SGD opt(mdl->parameters(), torch::optim::SGDOptions(0.1));
    auto p = zero::prepare(mdl, opt, ShardingSpec::zero(3), world);
    p.engine->unshard();
  }
  EXPECT_LE(rel_err(mdl->forward(x).detach(), ref->forward(x).detach()), 1e-15);
  for (auto& [n, t] : params_by_name(*mdl)) EXPECT_LE(rel_err(t, params_by_name(*ref).at(n)), 0.0) << n;
}

// A master in another dtype than the compute buffer starts from the original values.
TEST(EngineLifecycle, MasterStartsFromTheOriginalValues) {
  auto world = test::world();
  at::manual_seed(11);
  auto mdl = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});  // float32
  auto originals = params_by_name(*mdl);
  for (auto& [n, t] : originals) t = t.detach().clone();
  torch::optim::AdamW opt(mdl->parameters(), torch::optim::AdamWOptions(0.1));
  ShardingSpec spec = ShardingSpec::zero(3);
  spec.param_dtype = at::kBFloat16;
  spec.master_dtype = at::kFloat;
  auto p = zero::prepare(mdl, opt, spec, world);
  for (const auto& f : p.engine->flats()) {
    ASSERT_EQ(f.master.scalar_type(), at::kFloat);
    at::Tensor want = own_slice(*f.flat_param, flatten_like(*f.flat_param, originals, at::kFloat));
    EXPECT_LE(rel_err(f.master, want), 0.0) << f.flat_param->name();
  }
}

struct UsesTensor : torch::nn::Module {
  explicit UsesTensor(const at::Tensor& t) { w = register_parameter("w", t); }
  at::Tensor forward(const at::Tensor& x) { return at::matmul(x, w); }
  at::Tensor w;
};
struct SharedAcrossUnits : torch::nn::Module {
  SharedAcrossUnits() {
    at::Tensor w = at::randn({4, 4});
    a = accel::unit(register_module("a", std::make_shared<UsesTensor>(w)));
    b = accel::unit(register_module("b", std::make_shared<UsesTensor>(w)));
  }
  accel::Unit<UsesTensor> a, b;
};

TEST(EngineEdges, ParameterSharedAcrossUnitsIsAClearError) {
  auto m = std::make_shared<SharedAcrossUnits>();
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  try {
    zero::prepare(m, opt, ShardingSpec::zero(3), test::world());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'b.w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'a.w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("different units"), std::string::npos) << msg;
  }
}

struct MyOptimizer : torch::optim::SGD {
  using torch::optim::SGD::SGD;
};
struct CustomOptimizer : torch::optim::Optimizer {
  explicit CustomOptimizer(std::vector<at::Tensor> ps)
      : torch::optim::Optimizer(std::move(ps), std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  at::Tensor step(LossClosure) override { return {}; }
};

TEST(EngineEdges, UnsupportedOptimizersAreNamed) {
  auto world = test::world();
  auto m = std::make_shared<MLPImpl>(std::vector<int64_t>{2, 2});
  torch::optim::LBFGS lbfgs(m->parameters(), torch::optim::LBFGSOptions(0.1));
  try {
    zero::prepare(m, lbfgs, ShardingSpec::zero(2), world);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("LBFGS"), std::string::npos) << e.what();
  }
  auto m2 = std::make_shared<MLPImpl>(std::vector<int64_t>{2, 2});
  CustomOptimizer custom(m2->parameters());
  try {
    zero::prepare(m2, custom, ShardingSpec::zero(2), world);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("CustomOptimizer"), std::string::npos) << e.what();
  }
  // A subclass of a supported optimizer is stepped as that optimizer; the result has its type.
  auto m3 = std::make_shared<MLPImpl>(std::vector<int64_t>{2, 2});
  MyOptimizer mine(m3->parameters(), torch::optim::SGDOptions(0.1));
  auto p = zero::prepare(m3, mine, ShardingSpec::zero(2), world);
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(p.optimizer.get()), nullptr);
}

TEST(EngineEdges, ClipGradNormMatchesLibtorch) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()})
    for (auto [name, spec] : all_specs()) {
      SCOPED_TRACE(name + " norm " + std::to_string(norm_type));
      Model ref = make_model(ModelKind::GPT, at::kDouble), mdl = make_model(ModelKind::GPT, at::kDouble);
      auto ref_opt = make_optimizer(OptKind::SGD, *ref.module);
      auto user_opt = make_optimizer(OptKind::SGD, *mdl.module);
      auto p = zero::prepare(mdl.module, *user_opt, spec, world);
      const int64_t local = 12 / N;
      for (int step = 0; step < 2; ++step) {
        auto [x, y] = make_batch(ModelKind::GPT, at::kDouble, step, 0);
        ref.loss(x, y).backward();
        p.engine->backward(mdl.loss(x.narrow(0, r * local, local), y.narrow(0, r * local, local)));
        double want = torch::nn::utils::clip_grad_norm_(ref.module->parameters(), 0.05, norm_type);
        double got = p.engine->clip_grad_norm(0.05, norm_type);
        EXPECT_NEAR(got, want, 1e-12 * want);
        EXPECT_GT(want, 0.05);  // so the clipping did something
        ref_opt->step();
        ref_opt->zero_grad();
        p.optimizer->step();
        p.optimizer->zero_grad();
      }
      auto want = params_by_name(*ref.module);
      for (const auto& f : p.engine->flats())
        EXPECT_LE(rel_err(f.flat_param->shard(), own_slice(*f.flat_param, flatten_like(*f.flat_param, want))), 1e-10)
            << f.flat_param->name();
    }
}

TEST(EngineEdges, WrapPolicies) {
  auto world = test::world();
  auto units_for = [&](zero::WrapPolicy w) {
    auto m = std::make_shared<MLPImpl>(std::vector<int64_t>{6, 10, 10, 3});  // fc0 70, fc1 110, fc2 33 params
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
    ShardingSpec s = ShardingSpec::zero(3);
    s.wrap = w;
    auto p = zero::prepare(m, opt, s, world);
    std::vector<std::string> names;
    for (const auto& u : p.engine->units()) names.push_back(u.name);
    return names;
  };
  using K = zero::WrapPolicy::Kind;
  EXPECT_EQ(units_for({K::Marked, {}, 0}), (std::vector<std::string>{"", "fc0", "fc1", "fc2"}));
  EXPECT_EQ(units_for({K::TypeName, {"LinearImpl"}, 0}), (std::vector<std::string>{"", "fc0", "fc1", "fc2"}));
  EXPECT_EQ(units_for({K::TypeName, {"BlockImpl"}, 0}), (std::vector<std::string>{""}));
  EXPECT_EQ(units_for({K::Size, {}, 50}), (std::vector<std::string>{"", "fc0", "fc1"}));
  EXPECT_EQ(units_for({K::None, {}, 0}), (std::vector<std::string>{""}));
  // Everything in the root unit still trains exactly under ZeRO-3.
  ShardingSpec s = ShardingSpec::zero(3);
  s.wrap.kind = K::None;
  train_and_compare(s, [](MLPImpl&) {});
}

TEST(EngineEdges, BadSpecsAreNamed) {
  EXPECT_THROW(ShardingSpec::zero(4), std::invalid_argument);
  try {
    ShardingSpec::fsdp("FULL");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD"), std::string::npos);
  }
  ShardingSpec s;
  s.bucket_bytes = -1;
  EXPECT_THROW(s.validate(), std::invalid_argument);
}

// The sharded optimizer (a subclass of the user's type) steps fp32 masters through the fused CPU
// kernels, which give torch::optim's bits (tests/optim): AdamW, Adam and SGD; other types (Adagrad)
// take their own step. Under every strategy that has masters.
TEST(EngineStep, ShardedOptimizersStepThroughTheFusedKernels) {
  auto world = test::world();
  for (int stage : {1, 2, 3}) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE(::testing::Message() << "zero stage " << stage << ", optimizer " << kind);
      at::manual_seed(11);
      auto mdl = torch::nn::Linear(8, 4);  // fp32
      std::unique_ptr<torch::optim::Optimizer> user_opt;
      if (kind == 0)
        user_opt = std::make_unique<torch::optim::AdamW>(mdl->parameters(), torch::optim::AdamWOptions(1e-2));
      if (kind == 1)
        user_opt = std::make_unique<torch::optim::Adam>(mdl->parameters(), torch::optim::AdamOptions(1e-2));
      if (kind == 2)
        user_opt = std::make_unique<torch::optim::SGD>(mdl->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      if (kind == 3)
        user_opt = std::make_unique<torch::optim::Adagrad>(mdl->parameters(), torch::optim::AdagradOptions(0.1));
      auto p = zero::prepare(mdl.ptr(), *user_opt, ShardingSpec::zero(stage), world);
      const std::uint64_t before = optim::fused_steps();
      for (int step = 0; step < 2; ++step) {
        p.engine->backward(mdl->forward(at::randn({4, 8})).square().sum());
        p.optimizer->step();
        p.optimizer->zero_grad();
      }
      EXPECT_EQ(optim::fused_steps() - before, kind < 3 ? 2u : 0u);
    }
  }
}

}  // namespace
}  // namespace accel::test
