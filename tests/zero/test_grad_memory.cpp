// Bounded gradient memory: under every strategy that shards gradients, the gradient bytes alive during
// backward stay within this rank's reduced shards (Ψ/N, padded) plus grad_buckets_in_flight full
// buckets or units (plus the pool of node-shared gradient buffers, counted from prepare on;
// sharding_private runs it with private buffers; sharding_hybrid_2nodes across simulated nodes, where
// the hierarchical transport holds a block of 1/L of each collective), read from the counting allocator, with units
// both larger and smaller than the bucket; and the back-pressure that bounds them never deadlocks when the data makes
// ranks use different parameters.
#include "base/memory.h"
#include "support/harness.h"

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace accel::test {
namespace {

using memory::Category;
using zero::ShardingSpec;

std::vector<std::pair<std::string, ShardingSpec>> grad_sharding_specs() {
  return {{"ZeRO2", ShardingSpec::zero(2)},
          {"ZeRO3", ShardingSpec::zero(3)},
          {"FULL_SHARD", ShardingSpec::fsdp("FULL_SHARD")},
          {"SHARD_GRAD_OP", ShardingSpec::fsdp("SHARD_GRAD_OP")},
          {"HYBRID_SHARD", ShardingSpec::fsdp("HYBRID_SHARD")}};
}

struct Sizes {
  std::int64_t shards = 0;   // bytes of this rank's reduced shards, all flats
  std::int64_t largest = 0;  // bytes of the largest flat's full gradient
  std::int64_t whole = 0;    // bytes of every flat's full gradient (Ψ, padded)
};
Sizes sizes_of(const zero::Engine& e) {
  Sizes s;
  for (const auto& f : e.flats()) {
    if (!f.flat_param->requires_grad()) continue;
    const std::int64_t el = f.flat_param->full().element_size();
    s.shards += f.flat_param->layout().shard_size() * el;
    s.largest = std::max(s.largest, f.flat_param->layout().padded() * el);
    s.whole += f.flat_param->layout().padded() * el;
  }
  return s;
}

// Unequal units (so the largest is not every unit), no root parameters (the root unit's gradients
// live through the whole backward by design: the GPT's tied head gets its first gradient first).
std::shared_ptr<MLPImpl> uneven_mlp() {
  at::manual_seed(5);
  return std::make_shared<MLPImpl>(std::vector<int64_t>{48, 96, 64, 128, 64, 96, 32, 48}, /*root_param=*/false);
}

void expect_bounded_peaks(const std::vector<std::pair<std::string, ShardingSpec>>& specs) {
  ASSERT_TRUE(memory::counting_installed());
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (auto [name, spec] : specs)
    for (std::int64_t bucket : {std::int64_t{0}, std::int64_t{60000}})  // one unit per bucket / 1-3 per bucket
      for (int in_flight : {1, 2, 3}) {
        SCOPED_TRACE(fmt::format("{} bucket {} B, {} in flight", name, bucket, in_flight));
        spec.bucket_bytes = bucket;
        spec.grad_buckets_in_flight = in_flight;
        auto mlp = uneven_mlp();
        auto user_opt = make_optimizer(OptKind::AdamW, *mlp);
        const std::int64_t unprepared = memory::snapshot()[Category::Gradients].current;
        auto p = zero::prepare(mlp, *user_opt, spec, world);
        const Sizes z = sizes_of(*p.engine);
        // The largest bucket or unit: a bucket holds at most bucket_bytes, unless one flat alone is larger.
        const std::int64_t unit_or_bucket = std::max(bucket, z.largest);
        // A bucket of several flats is copied into one staging buffer at launch, while its flats'
        // gradients are still alive: two buckets' worth for that moment, whatever the limit.
        const std::int64_t held = bucket > 0 ? std::max(in_flight, 2) : in_flight;
        // Node-shared gradient buffers (ACCEL_NODE_SHARED_GRADS, the default on one node): this rank's
        // part of the pool, room for in_flight + 1 of the largest reduce-scatter inputs (a bucket's
        // staging copy may pass bucket_bytes by its last flat), is counted as its gradients from
        // prepare on. Counted from before prepare, the peak holds the pool whole, and what overflows
        // it stays within the bound above.
        const std::int64_t pool = p.engine->node_shared_grad_bytes();
        // A shard group across nodes (simulated: ACCEL_RANKS_PER_NODE) reduces through the hierarchical
        // transport, which holds for each collective in flight its node sums before the cross-node
        // step: 1/L of the input, L the group's ranks per node (src/comm/transport/hierarchical.cpp).
        auto& group = *p.engine->shard_group();
        const std::int64_t staging = std::string(group.backend_name(at::ones({1}))) == "shm+mpi"
                                         ? in_flight * unit_or_bucket / group.topology().local_world_size
                                         : 0;
        for (int step = 0; step < 3; ++step) {
          at::manual_seed(40 + step);
          at::Tensor x = at::randn({4 * N, 48});
          if (step == 1) {
            // An evaluation forward between steps (no backward follows it) changes nothing.
            c10::NoGradGuard no_grad;
            mlp->forward(x.narrow(0, r * 4, 4));
          }
          const std::int64_t before = pool > 0 ? unprepared : memory::snapshot()[Category::Gradients].current;
          memory::reset_peaks();
          p.engine->backward(mlp->forward(x.narrow(0, r * 4, 4)).pow(2).mean());
          const std::int64_t peak = memory::snapshot()[Category::Gradients].peak - before;
          if (N == 1 && p.engine->plan().passthrough) continue;  // autograd's own .grad, nothing of ours
          // With the pool and one flat per reduction, the flats in flight live in the pool: nothing on top.
          const std::int64_t in_flight_bytes = pool > 0 && bucket == 0 ? 0 : held * unit_or_bucket;
          EXPECT_LE(peak, z.shards + in_flight_bytes + pool + staging)
              << "step " << step << ": shards " << z.shards << ", unit or bucket " << unit_or_bucket << ", pool "
              << pool << ", staging " << staging;
          if (pool > 0) EXPECT_GE(peak, pool) << "the pool is counted in the peak";
          // Not the whole model's gradients at once (what every unit kept before the bound).
          if (p.engine->shard_group()->size() > 1 && in_flight == 1 && bucket == 0) EXPECT_LT(peak, z.whole);
          p.optimizer->step();
          p.optimizer->zero_grad();
        }
      }
}

TEST(EngineGradMemory, PeakDuringBackwardIsShardsPlusBucketsInFlight) { expect_bounded_peaks(grad_sharding_specs()); }

// Registered again across simulated nodes (sharding_hybrid_2nodes_*): node-local shards, the
// reduced shards then all-reduced across nodes.
TEST(EngineGradMemory, PeakUnderHybridShard) {
  expect_bounded_peaks({{"HYBRID_SHARD", ShardingSpec::fsdp("HYBRID_SHARD")}});
}

// Accumulation whose micro-steps reduce (Engine::MoreMicroSteps, DeepSpeed's ZeRO-2/3): each reduced
// shard is added to the window's pending one as its bucket finishes and let go of, so a window of three
// micro-steps holds no more gradient memory than a step of one backward, but for the outputs of the
// buckets in flight (in_flight scratches of the largest bucket's shard, and at times one more). Before, the pending
// shards and a second set of reduced shards were alive together at the end of each backward: Ψ/N more.
// (HYBRID_SHARD across nodes is not among these: its shards are final only after the cross-node
// averages in flush(), and are added at the end of backward, beside outputs of their own. Registered
// across simulated nodes too, where the other strategies' shard groups span the nodes.)
TEST(EngineGradMemory, MicroStepsThatReduceHoldOneShardOfGradients) {
  ASSERT_TRUE(memory::counting_installed());
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (auto [name, spec] : grad_sharding_specs()) {
    for (std::int64_t bucket : {std::int64_t{0}, std::int64_t{60000}})
      for (int in_flight : {1, 2}) {
        SCOPED_TRACE(fmt::format("{} bucket {} B, {} in flight", name, bucket, in_flight));
        spec.bucket_bytes = bucket;
        spec.grad_buckets_in_flight = in_flight;
        auto mlp = uneven_mlp();
        auto user_opt = make_optimizer(OptKind::AdamW, *mlp);
        auto p = zero::prepare(mlp, *user_opt, spec, world);
        const Sizes z = sizes_of(*p.engine);
        if (p.engine->replicate_group() && p.engine->replicate_group()->size() > 1) continue;
        const std::int64_t S = p.engine->shard_group()->size();
        const std::int64_t out_bucket = (std::max(bucket, z.largest) + S - 1) / S;
        auto backward = [&](int seed) {
          at::manual_seed(seed);
          at::Tensor x = at::randn({4 * N, 48});
          p.engine->backward(mlp->forward(x.narrow(0, r * 4, 4)).pow(2).mean());
        };
        std::int64_t single = 0, window = 0;
        for (int step = 0; step < 3; ++step) {
          const std::int64_t before = memory::snapshot()[Category::Gradients].current;
          memory::reset_peaks();
          if (step == 2) {
            zero::Engine::MoreMicroSteps more(*p.engine);
            backward(60);
            backward(61);
          }
          backward(62 + step);
          const std::int64_t peak = memory::snapshot()[Category::Gradients].peak - before;
          (step == 2 ? window : single) = peak;  // (step 0 made the reduced shards kept from then on)
          p.optimizer->step();
          p.optimizer->zero_grad();
        }
        if (N == 1 && p.engine->plan().passthrough) continue;
        // (in_flight outputs, and one for the once where a finished collective's request still held
        // a scratch when the next bucket launched: the progress thread lets go of it a moment later.)
        EXPECT_LE(window, single + (in_flight + 1) * out_bucket)
            << "one backward " << single << " B, a window of three " << window << " B; shards " << z.shards
            << " B, a bucket's shard " << out_bucket << " B";
      }
  }
}

// The same model trained with the tightest limit and with no limit to speak of: the back-pressure
// changes when reductions finish, never what they compute.
TEST(EngineGradMemory, InFlightLimitDoesNotChangeResults) {
  auto world = test::world();
  const int N = world->size(), r = world->rank();
  for (auto [name, spec] : grad_sharding_specs()) {
    SCOPED_TRACE(name);
    std::vector<std::vector<at::Tensor>> masters;
    for (int in_flight : {1, 64}) {
      spec.bucket_bytes = 0;
      spec.grad_buckets_in_flight = in_flight;
      auto mlp = uneven_mlp();
      auto user_opt = make_optimizer(OptKind::AdamW, *mlp);
      auto p = zero::prepare(mlp, *user_opt, spec, world);
      for (int step = 0; step < 3; ++step) {
        at::manual_seed(80 + step);
        at::Tensor x = at::randn({4 * N, 48});
        p.engine->backward(mlp->forward(x.narrow(0, r * 4, 4)).pow(2).mean());
        p.optimizer->step();
        p.optimizer->zero_grad();
      }
      masters.emplace_back();
      for (const auto& f : p.engine->flats())
        masters.back().push_back(f.master.defined() ? f.master.clone() : f.flat_param->shard().clone());
    }
    ASSERT_EQ(masters[0].size(), masters[1].size());
    for (std::size_t i = 0; i < masters[0].size(); ++i) EXPECT_TRUE(at::equal(masters[0][i], masters[1][i])) << i;
  }
}

TEST(EngineGradMemory, BadLimitIsRefused) {
  auto world = test::world();
  ShardingSpec spec = ShardingSpec::zero(3);
  spec.grad_buckets_in_flight = 0;
  auto mlp = uneven_mlp();
  auto user_opt = make_optimizer(OptKind::AdamW, *mlp);
  try {
    zero::prepare(mlp, *user_opt, spec, world);
    FAIL() << "grad_buckets_in_flight = 0 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("grad_buckets_in_flight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace accel::test
