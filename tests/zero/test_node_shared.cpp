// Node-shared parameters (ACCEL_NODE_SHARED_PARAMS=1): the ranks of a shard group on one node keep
// each flat parameter in one shared-memory buffer, their shards side by side. The buffer itself
// (Communicator::node_shared_empty), then training against the same training with private shards:
// the same bits, no all-gather traffic, and parameters at rest that throw where private ones do. Node-shared
// gradient buffers (ACCEL_NODE_SHARED_GRADS, on by default): the same bits as private ones, with the
// reduce-scatters' peers reading the gradients in place.
#include "comm/transport/shm/shm_backend.h"
#include "support/harness.h"
#include "support/scoped_env.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>

namespace accel::test {
namespace {

bool shares_memory(comm::Communicator& c) { return c.size() > 1 && std::string(c.backend_name(at::Tensor())) == "shm"; }

// A parameter's data at rest: whether reading it (a sum) or writing it (fill_) throws c10::Error.
bool throws_on_read(const at::Tensor& p) {
  try {
    (void)p.detach().sum().item<double>();
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}
bool throws_on_write(const at::Tensor& p) {
  c10::NoGradGuard ng;
  try {
    p.detach().mul_(1.0);  // (a write that leaves the values as they are, should it not throw)
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}

TEST(NodeSharedMemory, OneBufferThatEveryRankWritesAndReads) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  at::Tensor t = world->node_shared_empty(1000, at::kFloat);
  if (!shares_memory(*world)) {
    EXPECT_FALSE(t.defined()) << "a group that shares no memory (one rank, several nodes) gets none";
    return;
  }
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 1000);
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_TRUE(t.is_cpu());
  EXPECT_EQ(t.abs().sum().item<double>(), 0.0) << "zero-filled";
  world->barrier();  // everyone has checked the zeros before anyone writes
  t.narrow(0, r * 10, 10).fill_(static_cast<double>(r + 1));
  world->barrier();
  for (int j = 0; j < N; ++j)
    EXPECT_EQ(t.narrow(0, j * 10, 10).sum().item<double>(), 10.0 * (j + 1)) << "rank " << j << "'s write";
  EXPECT_EQ(t.narrow(0, N * 10, 1000 - N * 10).abs().sum().item<double>(), 0.0);
  at::Tensor u = world->node_shared_empty(3, at::kDouble);  // another object, not the same memory
  ASSERT_TRUE(u.defined());
  EXPECT_EQ(u.scalar_type(), at::kDouble);
  EXPECT_NE(u.data_ptr(), t.data_ptr());
  at::Tensor empty = world->node_shared_empty(0, at::kFloat);
  ASSERT_TRUE(empty.defined());
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_THROW(world->node_shared_empty(-1, at::kFloat), comm::InvalidArgument);
  world->barrier();  // nobody unmaps t while a peer still reads it
}

struct Training {
  Model model;
  std::unique_ptr<torch::optim::Optimizer> user_opt;
  zero::EngineAndOptimizer prepared;
};

Training make_run(const zero::ShardingSpec& spec, bool node_shared, bool shared_grads = true) {
  ScopedEnv env("ACCEL_NODE_SHARED_PARAMS", node_shared ? "1" : "0");  // the engine reads it when built
  ScopedEnv grads("ACCEL_NODE_SHARED_GRADS", shared_grads ? "1" : "0");
  Training run;
  run.model = make_model(ModelKind::GPT, at::kFloat);
  run.user_opt = make_optimizer(OptKind::AdamW, *run.model.module);
  run.prepared = zero::prepare(run.model.module, *run.user_opt, spec, test::world());
  return run;
}

class NodeSharedEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(NodeSharedEngine, TrainsToTheSameBitsWithoutGathering) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const std::string strategy = GetParam();
  zero::ShardingSpec spec =
      strategy == "FULL_SHARD" ? zero::ShardingSpec::fsdp("FULL_SHARD") : zero::ShardingSpec::zero(3);
  if (strategy == "ZeRO3_bf16") {  // bf16 parameters, fp32 masters: the step copies each master into the shared shard
    spec.param_dtype = at::kBFloat16;
    spec.master_dtype = at::kFloat;
  }
  if (strategy == "ZeRO3_kept") spec.reshard_after_forward = false;
  Training priv = make_run(spec, false), shared = make_run(spec, true);
  zero::Engine& pe = *priv.prepared.engine;
  zero::Engine& se = *shared.prepared.engine;
  EXPECT_FALSE(pe.node_shared());
  const bool expect_shared = shares_memory(*se.shard_group()) && se.plan().params_sharded;
  ASSERT_EQ(se.node_shared(), expect_shared);
  std::int64_t padded_bytes = 0;
  for (const auto& f : se.flats()) {
    const sharding::FlatParam& fp = *f.flat_param;
    ASSERT_EQ(fp.node_shared(), expect_shared) << fp.name();
    padded_bytes += fp.layout().padded() * static_cast<std::int64_t>(fp.full().element_size());
    if (!expect_shared) continue;
    // The shard is this rank's slice of the one buffer, not a copy; at rest only the root unit's
    // full() points at the buffer, as only its full() is gathered under private shards.
    auto [b, e] = fp.layout().shard_range(fp.options().rank);
    EXPECT_EQ(fp.shard().data_ptr(), fp.node_buffer().narrow(0, b, e - b).data_ptr()) << fp.name();
    EXPECT_EQ(fp.gathered(), f.unit == 0) << fp.name();
    if (fp.gathered()) EXPECT_EQ(fp.full().data_ptr(), fp.node_buffer().data_ptr()) << fp.name();
  }
  EXPECT_EQ(se.node_shared_bytes(), expect_shared ? padded_bytes : 0);

  const int64_t G = 12, local = G / N;
  auto train = [&](int step) {
    auto [x, y] = make_batch(ModelKind::GPT, at::kFloat, step, 0);
    at::Tensor xl = x.narrow(0, r * local, local), yl = y.narrow(0, r * local, local);
    at::Tensor lp = priv.model.loss(xl, yl), ls = shared.model.loss(xl, yl);
    EXPECT_TRUE(at::equal(lp.detach(), ls.detach()))
        << "step " << step << ": " << lp.item<double>() << " against " << ls.item<double>();
    pe.backward(lp);
    se.backward(ls);
    priv.prepared.optimizer->step();
    shared.prepared.optimizer->step();
    priv.prepared.optimizer->zero_grad();
    shared.prepared.optimizer->zero_grad();
  };
  se.gather_group()->reset_counters();
  const int steps = 4;
  for (int step = 0; step < steps; ++step) train(step);
  const comm::Counters c = se.gather_group()->counters();
  if (expect_shared) {
    EXPECT_EQ(c[comm::Collective::AllGather].bytes_received, 0u) << "nothing gathered";
    // What orders the writes: a barrier as the step begins and one after its writes, nothing else.
    EXPECT_EQ(c[comm::Collective::Barrier].calls, 2u * steps);
  }
  for (std::size_t i = 0; i < pe.flats().size(); ++i) {
    const auto& a = *pe.flats()[i].flat_param;
    const auto& b = *se.flats()[i].flat_param;
    ASSERT_EQ(a.name(), b.name());
    EXPECT_TRUE(at::equal(a.shard(), b.shard())) << "shard of " << a.name() << " on rank " << r;
    // Between steps the node-shared buffer holds the whole values on every rank: the private engine's gather.
    at::Tensor whole = pe.whole_values(pe.flats()[i], zero::Engine::Source::Compute);
    if (expect_shared) EXPECT_TRUE(at::equal(b.node_buffer(), whole)) << a.name();
    EXPECT_TRUE(at::equal(se.whole_values(se.flats()[i], zero::Engine::Source::Compute), whole)) << a.name();
  }
  // The module's own parameters at rest: a read and a write throw exactly where they throw under
  // private shards (every sharded unit's), and the rest (the root unit's) read the same values.
  auto pp = params_by_name(*priv.model.module), sp = params_by_name(*shared.model.module);
  int thrown = 0;
  for (const auto& [name, p] : pp) {
    const at::Tensor& q = sp.at(name);
    const bool private_throws = throws_on_read(p);
    EXPECT_EQ(throws_on_read(q), private_throws) << name;
    EXPECT_EQ(throws_on_write(q), private_throws) << name;
    if (!private_throws) EXPECT_TRUE(at::equal(p, q)) << name;
    thrown += private_throws ? 1 : 0;
  }
  if (pe.plan().params_sharded) EXPECT_GT(thrown, 0) << "the sharded units' parameters throw at rest";
  // unshard(): each rank's own copy from then on; training goes on alike, and a write stays local.
  pe.unshard();
  se.unshard();
  EXPECT_FALSE(se.node_shared());
  for (const auto& f : se.flats()) EXPECT_FALSE(f.flat_param->node_shared()) << f.flat_param->name();
  train(steps);
  world->barrier();
  const sharding::FlatParam& first = *se.flats().back().flat_param;
  const at::Tensor before = first.full().clone();
  world->barrier();
  if (r == 0) first.full().add_(1.0);
  world->barrier();
  if (r != 0) EXPECT_TRUE(at::equal(first.full(), before)) << "rank 0's write reached rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Strategies, NodeSharedEngine,
                         ::testing::Values("ZeRO3", "ZeRO3_kept", "ZeRO3_bf16", "FULL_SHARD"),
                         [](const auto& info) { return info.param; });

// Node-shared gradient buffers against private ones, side by side: identical losses and shards every
// step, under gradient accumulation too; the reduce-scatters read the peers' gradients in place (their
// input bytes from every peer, each step), and the private engine's read none.
class NodeSharedGrads : public ::testing::TestWithParam<std::string> {};

TEST_P(NodeSharedGrads, TrainToTheSameBitsAndAreReadInPlace) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  const std::string strategy = GetParam();
  zero::ShardingSpec spec = strategy == "FULL_SHARD" ? zero::ShardingSpec::fsdp("FULL_SHARD")
                            : strategy == "ZeRO2"    ? zero::ShardingSpec::zero(2)
                                                     : zero::ShardingSpec::zero(3);
  if (strategy == "ZeRO3_alone") spec.bucket_bytes = 1;  // every flat reduced alone, from its own buffer
  if (strategy == "ZeRO3_bf16") {                        // bf16 gradients staged into fp32 reduce buffers
    spec.param_dtype = at::kBFloat16;
    spec.master_dtype = at::kFloat;
  }
  Training priv = make_run(spec, false, false), shared = make_run(spec, false, true);
  zero::Engine& pe = *priv.prepared.engine;
  zero::Engine& se = *shared.prepared.engine;
  EXPECT_EQ(pe.node_shared_grad_bytes(), 0);
  const bool expect_shared = shares_memory(*se.shard_group());
  EXPECT_EQ(se.node_shared_grad_bytes() > 0, expect_shared);

  const int64_t G = 12, local = G / N;
  auto train = [&](int step, int micro_steps) {
    for (int m = 0; m < micro_steps; ++m) {
      auto [x, y] = make_batch(ModelKind::GPT, at::kFloat, step, m);
      at::Tensor xl = x.narrow(0, r * local, local), yl = y.narrow(0, r * local, local);
      const bool last = m + 1 == micro_steps;
      pe.set_gradient_sync(last);
      se.set_gradient_sync(last);
      at::Tensor lp = priv.model.loss(xl, yl), ls = shared.model.loss(xl, yl);
      EXPECT_TRUE(at::equal(lp.detach(), ls.detach()))
          << "step " << step << "." << m << ": " << lp.item<double>() << " against " << ls.item<double>();
      pe.backward(lp);
      const std::uint64_t before = comm::shm_bytes_read_in_place();
      se.backward(ls);
      const std::uint64_t read = comm::shm_bytes_read_in_place() - before;
      if (!last || !expect_shared) {
        EXPECT_EQ(read, 0u) << "step " << step << "." << m << ": nothing reduced, nothing read";
      } else {
        // Every flat's reduce-scatter input is N shards; each rank reads its shard from the N - 1 peers.
        std::uint64_t inputs = 0;
        for (const auto& f : se.flats())
          if (f.flat_param->requires_grad())
            inputs += static_cast<std::uint64_t>(f.flat_param->layout().padded()) * 4;  // fp32 reduction
        EXPECT_GT(read, 0u) << "step " << step;
        EXPECT_LE(read, inputs / N * (N - 1)) << "step " << step;
        // Without accumulation (whose windows hold more full gradients than there are buffers), every
        // flat finds a free buffer: the root unit's, the one launched and the one being filled.
        if (strategy == "ZeRO3_alone" && micro_steps == 1)
          EXPECT_EQ(read, inputs / N * (N - 1)) << "step " << step << ": every flat's gradient from the pool";
      }
    }
    priv.prepared.optimizer->step();
    shared.prepared.optimizer->step();
    priv.prepared.optimizer->zero_grad();
    shared.prepared.optimizer->zero_grad();
  };
  for (int step = 0; step < 4; ++step) train(step, step == 2 ? 3 : 1);  // step 2 accumulates 3 micro-batches
  for (std::size_t i = 0; i < pe.flats().size(); ++i) {
    const auto& a = *pe.flats()[i].flat_param;
    const auto& b = *se.flats()[i].flat_param;
    EXPECT_TRUE(at::equal(a.shard(), b.shard())) << "shard of " << a.name() << " on rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, NodeSharedGrads,
                         ::testing::Values("ZeRO2", "ZeRO3", "ZeRO3_alone", "ZeRO3_bf16", "FULL_SHARD"),
                         [](const auto& info) { return info.param; });

// The engine dropped without unshard() (an exception, a script that keeps the model): every rank's
// model keeps parameters that are its own (the root unit's, gathered at rest, now a private copy with
// the same values) or that throw (the sharded units'), never a buffer that another rank writes.
TEST(NodeSharedEngineDropped, LeavesEachRankItsOwnParametersOrOnesThatThrow) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  if (!shares_memory(*world)) GTEST_SKIP() << "needs ranks that share one node's memory";
  Training run = make_run(zero::ShardingSpec::zero(3), true, true);
  ASSERT_TRUE(run.prepared.engine->node_shared());
  const int64_t local = 12 / N;
  auto [x, y] = make_batch(ModelKind::GPT, at::kFloat, 0, 0);
  run.prepared.engine->backward(run.model.loss(x.narrow(0, r * local, local), y.narrow(0, r * local, local)));
  run.prepared.optimizer->step();
  run.prepared.optimizer->zero_grad();
  std::map<std::string, at::Tensor> root;  // the values readable at rest
  std::set<std::string> sharded;
  for (const auto& [name, p] : params_by_name(*run.model.module)) {
    if (throws_on_read(p))
      sharded.insert(name);
    else
      root[name] = p.detach().clone();
  }
  ASSERT_FALSE(root.empty());
  ASSERT_FALSE(sharded.empty());
  std::weak_ptr<zero::Engine> gone = run.prepared.engine;
  run.prepared = {};
  ASSERT_TRUE(gone.expired());
  auto pp = params_by_name(*run.model.module);
  for (const auto& name : sharded) {
    EXPECT_TRUE(throws_on_read(pp.at(name))) << name;
    EXPECT_TRUE(throws_on_write(pp.at(name))) << name;
  }
  for (const auto& [name, before] : root) EXPECT_TRUE(at::equal(pp.at(name), before)) << name;
  world->barrier();
  if (r == 0) {
    c10::NoGradGuard ng;
    for (const auto& [name, before] : root) pp.at(name).add_(1.0);
  }
  world->barrier();
  for (const auto& [name, before] : root)
    EXPECT_TRUE(at::equal(pp.at(name), r == 0 ? before + 1.0 : before)) << name << ": rank 0's write on rank " << r;
}

// One rank late at every turn (a sleep before its forward, between its backward and its step, and
// after the step) under node-shared parameters and gradients: the barriers order the writes against
// the peers' reads, so the training has the private run's bits at every step.
TEST(NodeSharedEngineDelays, ADelayedRankGetsThePrivateRunsBits) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  if (!shares_memory(*world)) GTEST_SKIP() << "needs ranks that share one node's memory";
  for (const std::string strategy : {"ZeRO3", "FULL_SHARD"}) {
    SCOPED_TRACE(strategy);
    const zero::ShardingSpec spec =
        strategy == "FULL_SHARD" ? zero::ShardingSpec::fsdp("FULL_SHARD") : zero::ShardingSpec::zero(3);
    Training priv = make_run(spec, false, false), shared = make_run(spec, true, true);
    ASSERT_TRUE(shared.prepared.engine->node_shared());
    const bool late = r == N - 1;
    auto nap = [&] {
      if (late) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    };
    const int64_t local = 12 / N;
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = make_batch(ModelKind::GPT, at::kFloat, step, 0);
      at::Tensor xl = x.narrow(0, r * local, local), yl = y.narrow(0, r * local, local);
      at::Tensor lp = priv.model.loss(xl, yl);
      priv.prepared.engine->backward(lp);
      priv.prepared.optimizer->step();
      priv.prepared.optimizer->zero_grad();
      nap();
      at::Tensor ls = shared.model.loss(xl, yl);
      shared.prepared.engine->backward(ls);
      nap();
      shared.prepared.optimizer->step();
      nap();
      shared.prepared.optimizer->zero_grad();
      EXPECT_TRUE(at::equal(lp.detach(), ls.detach())) << "step " << step;
    }
    const auto& pf = priv.prepared.engine->flats();
    const auto& sf = shared.prepared.engine->flats();
    ASSERT_EQ(pf.size(), sf.size());
    for (std::size_t i = 0; i < pf.size(); ++i)
      EXPECT_TRUE(at::equal(pf[i].flat_param->shard(), sf[i].flat_param->shard())) << pf[i].flat_param->name();
    world->barrier();  // (the shared run's buffers stay mapped until every rank is done reading)
  }
}

}  // namespace
}  // namespace accel::test
