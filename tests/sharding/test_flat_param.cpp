// A sharded FlatParam at rest: its parameters keep their shapes but have no storage, and every access
// to their data (reads, writes, raw pointers, serialization, printing, views made afterwards) throws
// the message that names get_state_dict / save_model, with the storage's pointer null, so no kernel can
// read freed memory. alloc_full lifts it, free_full brings it back; gradient buffers are unaffected.
#include "sharding/flat_param.h"
#include "support/errors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <functional>
#include <sstream>
#include <vector>

namespace accel::test {
namespace {

using sharding::FlatParam;

FlatParam make_flat(std::vector<at::Tensor>& params) {
  params = {at::arange(6, at::kFloat).view({2, 3}), at::arange(4, at::kFloat)};
  FlatParam::Options o;
  o.rank = 0;
  o.world = 2;
  o.sharded = true;
  return FlatParam("blocks.1[group 0, Float]", params, {"blocks.1.weight", "blocks.1.bias"}, o);
}

// Each access, as a user (or a library) would make it on a parameter read through named_parameters().
std::vector<std::pair<const char*, std::function<void(const at::Tensor&)>>> accesses() {
  return {
      {"sum", [](const at::Tensor& p) { (void)p.sum(); }},
      {"clone", [](const at::Tensor& p) { (void)p.clone(); }},
      {"to double", [](const at::Tensor& p) { (void)p.to(at::kDouble); }},
      {"add", [](const at::Tensor& p) { (void)(p + 1); }},
      {"detach().sum", [](const at::Tensor& p) { (void)p.detach().sum(); }},
      {"view made after freeing", [](const at::Tensor& p) { (void)p.reshape({-1}).narrow(0, 1, 1).item<float>(); }},
      {"data_ptr", [](const at::Tensor& p) { (void)p.data_ptr(); }},
      {"const_data_ptr", [](const at::Tensor& p) { (void)p.const_data_ptr(); }},
      {"typed data_ptr", [](const at::Tensor& p) { (void)p.data_ptr<float>(); }},
      {"storage data", [](const at::Tensor& p) { (void)p.storage().data(); }},
      {"torch::save",
       [](const at::Tensor& p) {
         std::ostringstream out;
         torch::save(p, out);
       }},
      {"print",
       [](const at::Tensor& p) {
         std::ostringstream out;
         out << p;
       }},
      {"fill_", [](const at::Tensor& p) { p.detach().fill_(1); }},
      {"copy_", [](const at::Tensor& p) { p.detach().copy_(at::ones_like(p)); }},
  };
}

void expect_all_throw(const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    EXPECT_TRUE(sharding::storage_throws_on_access(p));
    EXPECT_FALSE(sharding::storage_allocated(p));
    // What kernels would see if they got past the check: nothing (no freed memory is reachable).
    EXPECT_EQ(p.storage().unsafeGetStorageImpl()->_mutable_data_ptr_no_checks().get(), nullptr);
    for (const auto& [what, access] : accesses()) {
      SCOPED_TRACE(what);
      const std::string m = message_of<c10::Error>([&, &access = access] { access(p); });
      EXPECT_NE(m.find("has no storage between steps"), std::string::npos) << m;
      EXPECT_NE(m.find("get_state_dict()"), std::string::npos) << m;
      EXPECT_NE(m.find("save_model(model, dir)"), std::string::npos) << m;
      EXPECT_NE(m.find("blocks.1[group 0, Float]: blocks.1.weight and 1 more"), std::string::npos) << m;
    }
  }
}

TEST(FlatParamFreed, EveryAccessToAFreedParameterThrowsNamingGetStateDict) {
  std::vector<at::Tensor> params;
  FlatParam f = make_flat(params);
  ASSERT_FALSE(f.gathered());
  EXPECT_EQ(params[0].sizes(), (std::vector<std::int64_t>{2, 3}));  // the shape is left
  expect_all_throw(params);
  EXPECT_FALSE(sharding::storage_throws_on_access(f.shard()));               // the shard is this rank's, always there
  EXPECT_TRUE(at::equal(f.shard(), at::tensor({0.f, 1.f, 2.f, 3.f, 4.f})));  // 10 elements over 2 ranks
}

TEST(FlatParamFreed, AllocFullLiftsTheErrorAndFreeFullBringsItBack) {
  std::vector<at::Tensor> params;
  FlatParam f = make_flat(params);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    f.alloc_full();
    f.full().zero_();
    f.shard_to_full();
    for (const auto& p : params) EXPECT_FALSE(sharding::storage_throws_on_access(p));
    // This rank's shard (elements 0..4) in place, the other rank's (5..9) zeros here.
    EXPECT_TRUE(at::equal(params[0], at::tensor({0.f, 1.f, 2.f, 3.f, 4.f, 0.f}).view({2, 3})));
    EXPECT_EQ(params[1].sum().item<float>(), 0.f);
    EXPECT_NE(params[0].data_ptr(), nullptr);
    params[1].detach().fill_(2);  // writes through the parameter work while gathered
    EXPECT_EQ(f.full().narrow(0, 6, 4).sum().item<float>(), 8.f);
    std::ostringstream out;
    torch::save(params[0], out);
    EXPECT_FALSE(out.str().empty());
    f.free_full();
    expect_all_throw(params);
  }
}

TEST(FlatParamFreed, GradientBuffersAreNotMarked) {
  std::vector<at::Tensor> params;
  FlatParam f = make_flat(params);
  for (auto& p : params) p.set_requires_grad(true);
  f.alloc_grad();
  f.zero_grad_of(0);
  f.attach_grads();
  ASSERT_TRUE(params[0].grad().defined());
  EXPECT_EQ(params[0].grad().sum().item<float>(), 0.f);  // readable while the parameter is freed
  f.free_grad();
  EXPECT_FALSE(sharding::storage_throws_on_access(f.grad_full()));
  f.alloc_grad();
  f.zero_grad_of(0);
  EXPECT_EQ(f.grad_full().narrow(0, 0, 6).sum().item<float>(), 0.f);
}

}  // namespace
}  // namespace accel::test
