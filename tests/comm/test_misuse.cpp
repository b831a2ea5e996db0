// Bad usage raises the documented error, on this rank (InvalidArgument) or on every rank
// (MismatchError), and the communicator stays usable afterwards.
#include "support/errors.h"
#include "test_world.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using namespace accel::comm;
using accel::test::world;

using accel::test::message_of;

namespace {

void expect_still_works(Communicator& c) {
  at::Tensor t = at::ones({4}, at::kFloat);
  c.all_reduce(t);
  EXPECT_TRUE(at::equal(t, at::full({4}, c.size(), at::kFloat)));
}

TEST(Misuse, LocalArgumentErrors) {
  auto comm = world();
  const int n = comm->size();
  at::Tensor strided = at::ones({4, 4}, at::kFloat).t();
  EXPECT_NE(message_of<InvalidArgument>([&] { comm->all_reduce(strided); }).find("not contiguous"), std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] {
              comm->reduce_scatter(at::ones({n * 3 + 1}), at::empty({3}));
            }).find("world_size"),
            std::string::npos);
  EXPECT_NE(
      message_of<InvalidArgument>([&] { comm->all_gather(at::ones({3}), at::empty({n * 3 + 2})); }).find("world_size"),
      std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] {
              comm->all_reduce(at::ones({3}), at::empty({3}, at::kDouble));
            }).find("differs from output dtype"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] { comm->all_reduce(at::ones({3}, at::kFloat8_e4m3fn)); }).find("fp8"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] {
              comm->all_reduce(at::ones({3}, at::kLong), {ReduceOp::Avg});
            }).find("avg needs a floating dtype"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] { comm->all_reduce(at::ones({3}, at::kBool)); }).find("not supported"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] { comm->all_reduce(at::ones({3}, at::kComplexFloat)); }).find("supported:"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] { comm->broadcast(at::ones({3}), {n}); }).find("root"), std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([&] { comm->all_reduce(at::Tensor()); }).find("undefined"), std::string::npos);
  at::Tensor buf = at::zeros({n * 4}, at::kFloat);
  if (n > 1) {
    // a slice of the output that is not this rank's own
    at::Tensor wrong = buf.narrow(0, ((comm->rank() + 1) % n) * 4, 4);
    EXPECT_NE(message_of<InvalidArgument>([&] { comm->all_gather(wrong, buf); }).find("not this rank's slice"),
              std::string::npos);
  }
  expect_still_works(*comm);
}

TEST(Misuse, RanksDisagreeOnSize) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int r = comm->rank();
  at::Tensor t = at::ones({r == 0 ? 5 : 4}, at::kFloat);
  std::string msg = message_of<MismatchError>([&] { comm->all_reduce(t); });
  EXPECT_NE(msg.find("ranks disagree on the input elements"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on rank " + std::to_string(r)), std::string::npos) << msg;
  expect_still_works(*comm);
}

TEST(Misuse, RanksDisagreeOnDtypeRootOrCollective) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  at::Tensor t = r == 1 ? at::ones({4}, at::kDouble) : at::ones({4}, at::kFloat);
  EXPECT_NE(message_of<MismatchError>([&] { comm->all_reduce(t); }).find("dtype"), std::string::npos);
  at::Tensor b = at::ones({4}, at::kFloat);
  EXPECT_NE(message_of<MismatchError>([&] { comm->broadcast(b, {r == 0 ? 1 : 0}); }).find("root"), std::string::npos);
  // rank 0 gathers while the others reduce: caught before any data moves
  std::string msg = message_of<MismatchError>([&] {
    if (r == 0)
      comm->all_gather(at::ones({4}), at::empty({4 * n}));
    else
      comm->all_reduce(at::ones({4}));
  });
  EXPECT_NE(msg.find("disagree on the collective"), std::string::npos) << msg;
  expect_still_works(*comm);
}

}  // namespace
