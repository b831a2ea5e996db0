// accel::comm — the fast transport for CPU collectives of one group, chosen once when the group is
// made: shared memory when every rank of the group sits on one node (shm_backend.h); across nodes,
// hierarchical collectives (node-local shared memory, MPI between the nodes: all_reduce is a
// node-local reduce-scatter, a cross-node all-reduce of each rank's slice and a node-local
// all-gather); or none (plain MPI), when ACCEL_COMM_SHM=0, for one rank, for one rank per node, or
// for nodes holding different numbers of the group's ranks.
#pragma once

#include "comm/topology.h"
#include "comm/transport/backend.h"

#include <memory>

namespace accel::comm {

class MpiBackend;

// Collective over `group`; every rank gets the same kind of answer. `topo`: this process's place.
std::unique_ptr<Backend> make_cpu_transport(MpiBackend& group, const Topology& topo);

}  // namespace accel::comm
