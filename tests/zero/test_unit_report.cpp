// zero::unit_report: the warning prepare logs when parameters are sharded but the root unit (the
// parameters in no accel::unit) is at least half of the model. A model with no unit is named with its
// largest submodules and how to mark them; a model whose blocks are units says nothing; strategies that
// keep parameters whole (DDP, ZeRO-1, ZeRO-2) say nothing.
#include "support/harness.h"
#include "zero/unit_report.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>

namespace accel::test {
namespace {

using zero::ShardingSpec;

// Blocks of 8x8 Linear layers (72 parameters each) under "blocks", and a small head (18): marked as
// units or not.
struct StackImpl : torch::nn::Module {
  StackImpl(int n, bool mark) {
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < n; ++i) {
      torch::nn::Linear l(8, 8);
      blocks->push_back(l);
      if (mark) units.push_back(accel::unit(l.ptr()));
    }
    head = register_module("head", torch::nn::Linear(8, 2));
  }
  torch::nn::ModuleList blocks;
  torch::nn::Linear head{nullptr};
  std::vector<accel::Unit<torch::nn::LinearImpl>> units;
};

std::optional<std::string> report_for(std::shared_ptr<torch::nn::Module> model, const ShardingSpec& spec) {
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto p = zero::prepare(model, sgd, spec, world());
  return zero::unit_report(*p.engine);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(EngineUnitReport, ModelWithNoUnitIsNamedWithItsLargestSubmodules) {
  const bool sharded = world()->size() > 1;  // a group of one keeps parameters whole
  for (const char* strategy : {"FULL_SHARD", "HYBRID_SHARD"}) {
    SCOPED_TRACE(strategy);
    auto r = report_for(std::make_shared<StackImpl>(5, false), ShardingSpec::fsdp(strategy));
    ASSERT_EQ(r.has_value(), sharded);
    if (!sharded) continue;
    EXPECT_TRUE(contains(*r,
                         "100% of this model's parameters (378 parameters, 1.5 KiB) are in no accel::unit "
                         "(the model marks none)"))
        << *r;
    EXPECT_TRUE(contains(*r, "stays gathered whole on every rank")) << *r;
    // "blocks" holds more than half of the root: its blocks are named instead, the largest first.
    EXPECT_TRUE(contains(*r, "The largest unmarked submodules:\n  blocks.0: 72 parameters (0.3 KiB)")) << *r;
    EXPECT_TRUE(contains(*r, "\n  blocks.3: 72 parameters")) << *r;
    EXPECT_TRUE(contains(*r, "\n  ... and 2 more")) << *r;  // blocks.4 and head
    EXPECT_FALSE(contains(*r, "\n  blocks:")) << *r;
    EXPECT_TRUE(contains(*r, "accel::unit(register_module(")) << *r;
    EXPECT_TRUE(contains(*r, "sharding/unit.h")) << *r;
  }
}

TEST(EngineUnitReport, MarkedModulesTheWrapPolicyLeftOutAreNamedWithThePolicy) {
  if (world()->size() == 1) GTEST_SKIP() << "parameters are sharded only over more than one rank";
  // The blocks are marked, but the policy wraps another type (a Llama under a config written for the
  // GPT's BlockImpl): the advice is the policy, not marking.
  ShardingSpec spec = ShardingSpec::fsdp("FULL_SHARD");
  spec.wrap.kind = zero::WrapPolicy::Kind::TypeName;
  spec.wrap.type_names = {"BlockImpl"};
  auto r = report_for(std::make_shared<StackImpl>(5, true), spec);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(contains(*r,
                       "are in no accel::unit (the model marks 5 modules, of type LinearImpl, but the wrap policy "
                       "took none of them)"))
      << *r;
  EXPECT_TRUE(contains(*r, "fsdp_transformer_layer_cls_to_wrap: LinearImpl")) << *r;
  EXPECT_FALSE(contains(*r, "accel::unit(register_module(")) << *r;
}

TEST(EngineUnitReport, UnmarkedPartBesideUnitsIsNamedWhenItIsMostOfTheModel) {
  if (world()->size() == 1) GTEST_SKIP() << "parameters are sharded only over more than one rank";
  // Two marked Linear layers (fc0, fc1: 6x10+10, 10x3+3 = 103) and, unmarked, "big" (40x40+40 = 1640).
  struct Mixed : torch::nn::Module {
    Mixed() {
      fc0 = accel::unit(register_module("fc0", torch::nn::Linear(6, 10)));
      fc1 = accel::unit(register_module("fc1", torch::nn::Linear(10, 3)));
      big = register_module("big", torch::nn::Linear(40, 40));
    }
    accel::Unit<torch::nn::LinearImpl> fc0, fc1;
    torch::nn::Linear big{nullptr};
  };
  auto r = report_for(std::make_shared<Mixed>(), ShardingSpec::zero(3));
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(contains(*r, "(1640 parameters, 6.4 KiB) are in no accel::unit (beside 2 units)")) << *r;
  EXPECT_TRUE(contains(*r, "\n  big: 1640 parameters (6.4 KiB)")) << *r;
}

TEST(EngineUnitReport, SaysNothingWhenTheBlocksAreUnits) {
  // The root keeps only the head (18 of 378 parameters) under every strategy.
  for (const char* strategy : {"FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD"}) {
    SCOPED_TRACE(strategy);
    EXPECT_EQ(report_for(std::make_shared<StackImpl>(5, true), ShardingSpec::fsdp(strategy)), std::nullopt);
  }
  // The sharding tests' MLP (every Linear a unit, one root scalar) and GPT (blocks are units; the
  // tied embedding, positions and final norm stay in the root).
  EXPECT_EQ(report_for(make_model(ModelKind::MLP, at::kFloat).module, ShardingSpec::zero(3)), std::nullopt);
  EXPECT_EQ(report_for(make_model(ModelKind::GPT, at::kFloat).module, ShardingSpec::zero(3)), std::nullopt);
}

TEST(EngineUnitReport, SaysNothingWhereParametersStayWhole) {
  for (auto [name, spec] :
       std::vector<std::pair<const char*, ShardingSpec>>{{"DDP", ShardingSpec::ddp()},
                                                         {"ZeRO-1", ShardingSpec::zero(1)},
                                                         {"ZeRO-2", ShardingSpec::zero(2)},
                                                         {"NO_SHARD", ShardingSpec::fsdp("NO_SHARD")}}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(report_for(std::make_shared<StackImpl>(5, false), spec), std::nullopt);
  }
}

}  // namespace
}  // namespace accel::test
