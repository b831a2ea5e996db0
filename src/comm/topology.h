// accel::comm::Topology — where this process sits: global rank, node and rank within the node.
// Read from MPI (ranks sharing memory form a node); ACCEL_RANKS_PER_NODE=k overrides it so that one
// machine simulates world_size/k nodes of k ranks (node_rank = rank / k), for HYBRID_SHARD tests, and
// ACCEL_RANKS_PER_NODE=k0,k1,... simulates nodes of those sizes in rank order (uneven nodes: "2,1").
#pragma once

#include <string>

namespace accel::comm {

struct Topology {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank within the node
  int local_world_size = 1;  // ranks on this node
  int node_rank = 0;
  int num_nodes = 1;
  bool simulated = false;  // true when ACCEL_RANKS_PER_NODE set the nodes

  // The ranks on this machine: the node's, or every rank when the nodes are simulated (they then say
  // nothing about machines).
  int ranks_on_this_machine() const { return simulated ? world_size : local_world_size; }
  // This rank's index among them (which GPU of the machine it takes).
  int rank_on_this_machine() const { return simulated ? rank : local_rank; }
  std::string to_string() const;
};

// Applies ACCEL_RANKS_PER_NODE (if set) to a topology read from MPI. Throws std::invalid_argument
// naming the variable when it is neither a positive divisor of the world size nor a list of positive
// node sizes that add up to it.
Topology apply_node_override(Topology t, const char* ranks_per_node_env);

}  // namespace accel::comm
