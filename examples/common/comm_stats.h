// The examples' --comm_stats FILE: what each rank's communicators moved, gathered to the main
// process, which writes one line per rank of space-separated key=value pairs:
//
//   rank=2 world_size=4 node=1 num_nodes=2 local_rank=0 local_world_size=2 simulated_nodes=0
//   netns=4026532246 <the example's own keys> shard_group=2 replicate_group=2
//   replicate.calls=40 replicate.sent=... replicate.received=... replicate.all_reduce.calls=40 ...
//   shard.* gather.* world.*
//
// Bytes are the communicators' own counters (comm/counters.h: payload in the caller's dtype, as the
// ZeRO formulas count it; all_reduce of n bytes = n sent + n received). `replicate` is the
// HYBRID_SHARD cross-node group (every gradient all-reduce across nodes; replicate_group=0 and no
// replicate.* keys without one), `shard` the group the state is sharded over (the node under
// HYBRID_SHARD), `gather` the parameter all-gather duplicate of it, `world` all ranks (weight
// broadcast in prepare, the loss reduce, barriers). Each communicator is written once: shard.* only
// where it is not the world itself (HYBRID_SHARD; otherwise its traffic is in world.*), gather.* only
// where it is not the shard group. The *_group keys give the sizes all the same. Per collective kind
// (.all_reduce .reduce_scatter .all_gather .broadcast .barrier) only kinds with calls.
// netns is the inode of the rank's network namespace (/proc/self/ns/net), to tell real hosts apart.
//
// Collective: every rank calls write_comm_stats at the same point (it snapshots the counters first,
// so its own gather is not in them).
#pragma once

#include "accelerator/accelerator.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace accel::examples {

inline void write_comm_stats(Accelerator& acc, const std::string& path,
                             const std::vector<std::pair<std::string, std::int64_t>>& extra = {}) {
  const comm::Topology& topo = acc.world()->topology();
  struct stat ns {};
  const std::int64_t netns = ::stat("/proc/self/ns/net", &ns) == 0 ? static_cast<std::int64_t>(ns.st_ino) : -1;
  std::vector<std::pair<std::string, std::int64_t>> kv = {{"rank", acc.process_index()},
                                                          {"world_size", acc.num_processes()},
                                                          {"node", topo.node_rank},
                                                          {"num_nodes", topo.num_nodes},
                                                          {"local_rank", topo.local_rank},
                                                          {"local_world_size", topo.local_world_size},
                                                          {"simulated_nodes", topo.simulated},
                                                          {"netns", netns}};
  kv.insert(kv.end(), extra.begin(), extra.end());

  const auto& engine = acc.engine();
  std::shared_ptr<comm::Communicator> shard = engine ? engine->shard_group() : nullptr;
  std::shared_ptr<comm::Communicator> replicate = engine ? engine->replicate_group() : nullptr;
  std::shared_ptr<comm::Communicator> gather = engine ? engine->gather_group() : nullptr;
  kv.emplace_back("shard_group", shard ? shard->size() : 0);
  kv.emplace_back("replicate_group", replicate ? replicate->size() : 0);
  kv.emplace_back("gather_group", gather ? gather->size() : 0);
  // One communicator, one set of keys: the gather group may be the shard group, which may be the world.
  if (gather == shard) gather = nullptr;
  if (shard == acc.world()) shard = nullptr;
  // Counters of every communicator, always the same keys on every rank (values gathered as one
  // int64 row per rank); zero per-kind entries are dropped when written.
  std::vector<bool> per_kind(kv.size(), false);
  auto add = [&](const std::string& name, const std::shared_ptr<comm::Communicator>& c) {
    const comm::Counters n = c ? c->counters() : comm::Counters{};
    const comm::CollectiveCount t = n.total();
    for (auto [key, v] : {std::pair{".calls", t.calls}, {".sent", t.bytes_sent}, {".received", t.bytes_received}}) {
      kv.emplace_back(name + key, static_cast<std::int64_t>(v));
      per_kind.push_back(!c);  // a missing communicator writes nothing
    }
    for (int k = 0; k < comm::kNumCollectives; ++k) {
      const comm::CollectiveCount& x = n.by_kind[k];
      const std::string kind = name + "." + comm::to_string(static_cast<comm::Collective>(k));
      for (auto [key, v] : {std::pair{".calls", x.calls}, {".sent", x.bytes_sent}, {".received", x.bytes_received}}) {
        kv.emplace_back(kind + key, static_cast<std::int64_t>(v));
        per_kind.push_back(true);
      }
    }
  };
  add("replicate", replicate);
  add("shard", shard);
  add("gather", gather);
  add("world", acc.world());

  const std::int64_t K = static_cast<std::int64_t>(kv.size());
  at::Tensor row = at::empty({K}, at::kLong);
  for (std::int64_t i = 0; i < K; ++i) row[i] = kv[i].second;
  at::Tensor all = acc.gather(row.to(acc.device())).to(at::kCPU);  // [world * K]
  if (!acc.is_main_process()) return;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::runtime_error("cannot write the comm stats file " + path);
  auto* v = all.data_ptr<std::int64_t>();
  for (int r = 0; r < acc.num_processes(); ++r) {
    std::string line;
    for (std::int64_t i = 0; i < K; ++i) {
      const std::int64_t x = v[r * K + i];
      if (per_kind[i] && x == 0) continue;
      line += (line.empty() ? "" : " ") + kv[i].first + "=" + std::to_string(x);
    }
    std::fprintf(f, "%s\n", line.c_str());
  }
  std::fclose(f);
}

}  // namespace accel::examples
