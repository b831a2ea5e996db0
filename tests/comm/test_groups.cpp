// Sub-communicators, the (simulated) node topology, and traffic counters.
#include "support/simulated_nodes.h"
#include "test_world.h"

#include "comm/topology.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

using namespace accel::comm;
using accel::test::world;

namespace {

double sum_of(const std::vector<int>& v) {
  double s = 0;
  for (int x : v) s += x;
  return s;
}

TEST(Groups, SplitByParity) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  auto sub = comm->split(r % 2, r);
  ASSERT_NE(sub, nullptr);
  std::vector<int> members;
  for (int q = r % 2; q < n; q += 2) members.push_back(q);
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(sub->rank(), r / 2);
  at::Tensor t = at::full({5}, r, at::kDouble);
  sub->all_reduce(t);
  EXPECT_TRUE(at::equal(t, at::full({5}, sum_of(members), at::kDouble)));
  // the group's collectives are independent of the world's
  at::Tensor g = at::zeros({2 * sub->size()}, at::kLong);
  sub->all_gather(at::full({2}, r, at::kLong), g);
  for (int i = 0; i < sub->size(); ++i) EXPECT_EQ(g[2 * i].item<long>(), members[i]);
}

TEST(Groups, KeyOrdersRanksAndNegativeColorOptsOut) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  auto rev = comm->split(0, n - 1 - r);
  ASSERT_NE(rev, nullptr);
  EXPECT_EQ(rev->rank(), n - 1 - r);
  auto without0 = comm->split(r == 0 ? -1 : 7, r);
  if (r == 0) {
    EXPECT_EQ(without0, nullptr);
  } else {
    ASSERT_NE(without0, nullptr);
    EXPECT_EQ(without0->size(), n - 1);
    at::Tensor t = at::full({1}, r, at::kLong);
    without0->all_reduce(t);
    EXPECT_EQ(t.item<long>(), static_cast<long>(n) * (n - 1) / 2);
  }
}

// The nodes ACCEL_RANKS_PER_NODE simulates (ctest's comm_simulated_nodes_np4, comm_uneven_nodes_np3),
// or one node of every rank: each node's first rank and size.
std::vector<std::pair<int, int>> expected_nodes(int n) {
  const std::vector<int> sizes = accel::test::simulated_node_sizes(n);
  std::vector<std::pair<int, int>> nodes;
  for (int first = 0, i = 0; i < static_cast<int>(sizes.size()); first += sizes[i++])
    nodes.emplace_back(first, sizes[i]);
  return nodes;
}

TEST(Topology, NodesAndHybridGroups) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const Topology& t = comm->topology();
  const char* env = std::getenv("ACCEL_RANKS_PER_NODE");
  const auto nodes = expected_nodes(n);
  int m = 0;
  while (r >= nodes[m].first + nodes[m].second) ++m;
  const auto [first, k] = nodes[m];
  EXPECT_EQ(t.rank, r);
  EXPECT_EQ(t.world_size, n);
  EXPECT_EQ(t.local_world_size, k);
  EXPECT_EQ(t.local_rank, r - first);
  EXPECT_EQ(t.node_rank, m);
  EXPECT_EQ(t.num_nodes, static_cast<int>(nodes.size()));
  EXPECT_EQ(t.simulated, env && *env);

  auto node = comm->node_local();
  auto cross = comm->cross_node();
  EXPECT_EQ(node->size(), k);
  EXPECT_EQ(node->rank(), r - first);
  // Across nodes: the ranks of the same local rank, one from each node that has one.
  int with_local = 0, before = 0;
  for (int q = 0; q < static_cast<int>(nodes.size()); ++q)
    if (nodes[q].second > r - first) {
      ++with_local;
      before += q < m;
    }
  EXPECT_EQ(cross->size(), with_local);
  EXPECT_EQ(cross->rank(), before);
  EXPECT_EQ(comm->node_local(), node) << "cached";
  // HYBRID_SHARD's two steps: sum inside the node, then across nodes = sum over the world (on nodes of
  // one size, where HYBRID_SHARD runs).
  at::Tensor x = at::full({3}, r, at::kDouble);
  node->all_reduce(x);
  double node_sum = 0;
  for (int q = first; q < first + k; ++q) node_sum += q;
  EXPECT_TRUE(at::equal(x, at::full({3}, node_sum, at::kDouble)));
  cross->all_reduce(x);
  double cross_sum = 0;
  for (const auto& [f, size] : nodes)
    if (size > r - first)
      for (int q = f; q < f + size; ++q) cross_sum += q;
  EXPECT_TRUE(at::equal(x, at::full({3}, cross_sum, at::kDouble)));
  if (n % k == 0 && static_cast<int>(nodes.size()) * k == n)
    EXPECT_TRUE(at::equal(x, at::full({3}, n * (n - 1) / 2.0, at::kDouble)));
}

TEST(TopologyOverride, RejectsBadValues) {
  Topology t;
  t.rank = 5;
  t.world_size = 8;
  EXPECT_THROW(apply_node_override(t, "3"), std::invalid_argument);
  EXPECT_THROW(apply_node_override(t, "0"), std::invalid_argument);
  EXPECT_THROW(apply_node_override(t, "two"), std::invalid_argument);
  Topology s = apply_node_override(t, "4");
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.num_nodes, 2);
  EXPECT_EQ(apply_node_override(t, "").num_nodes, 1);
}

TEST(TopologyOverride, NodesOfTheSizesListed) {
  Topology t;
  t.world_size = 6;
  const int node_of[] = {0, 0, 0, 1, 2, 2}, local_of[] = {0, 1, 2, 0, 0, 1}, size_of[] = {3, 3, 3, 1, 2, 2};
  for (int r = 0; r < 6; ++r) {
    t.rank = r;
    Topology s = apply_node_override(t, "3,1,2");
    EXPECT_EQ(s.node_rank, node_of[r]) << r;
    EXPECT_EQ(s.local_rank, local_of[r]) << r;
    EXPECT_EQ(s.local_world_size, size_of[r]) << r;
    EXPECT_EQ(s.num_nodes, 3);
    EXPECT_TRUE(s.simulated);
  }
  EXPECT_EQ(apply_node_override(t, "2,2,2").local_rank, 1);  // (rank 5) the same as "2"
  EXPECT_EQ(apply_node_override(t, "6").num_nodes, 1);
  for (const char* bad : {"3,2", "3,1,3", "3,,3", "3,0,3", "2,x,2", "3,3,", ",6", "-1,7"})
    EXPECT_THROW(apply_node_override(t, bad), std::invalid_argument) << bad;
  try {
    apply_node_override(t, "4,1");
    ADD_FAILURE() << "4,1 on 6 ranks: no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ACCEL_RANKS_PER_NODE='4,1'"), std::string::npos) << e.what();
  }
}

TEST(Counters, BytesPerCollective) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  auto sub = comm->split(0, r);  // fresh counters, untouched by other tests
  sub->reset_counters();
  const int k = 10;
  sub->all_reduce(at::ones({k}, at::kFloat));
  sub->reduce_scatter(at::ones({n * k}, at::kBFloat16), at::empty({k}, at::kBFloat16));
  sub->all_gather(at::ones({k}, at::kDouble), at::empty({n * k}, at::kDouble));
  sub->all_gather(at::ones({k}, at::kDouble), at::empty({n * k}, at::kDouble));
  sub->broadcast(at::ones({k}, at::kLong), {0});
  sub->barrier();
  Counters c = sub->counters();
  EXPECT_EQ(c[Collective::AllReduce].calls, 1u);
  EXPECT_EQ(c[Collective::AllReduce].bytes_sent, 4u * k);
  EXPECT_EQ(c[Collective::AllReduce].bytes_received, 4u * k);
  EXPECT_EQ(c[Collective::ReduceScatter].bytes_sent, 2u * n * k);
  EXPECT_EQ(c[Collective::ReduceScatter].bytes_received, 2u * k);
  EXPECT_EQ(c[Collective::AllGather].calls, 2u);
  EXPECT_EQ(c[Collective::AllGather].bytes_sent, 2u * 8 * k);
  EXPECT_EQ(c[Collective::AllGather].bytes_received, 2u * 8 * n * k);
  EXPECT_EQ(c[Collective::Broadcast].bytes_sent, r == 0 ? 8u * k : 0u);
  EXPECT_EQ(c[Collective::Broadcast].bytes_received, r == 0 ? 0u : 8u * k);
  EXPECT_EQ(c[Collective::Barrier].calls, 1u);
  EXPECT_EQ(c.total().calls, 6u);
  sub->reset_counters();
  EXPECT_EQ(sub->counters().total().calls, 0u);
  EXPECT_EQ(sub->counters().total().bytes_sent, 0u);
}

}  // namespace
