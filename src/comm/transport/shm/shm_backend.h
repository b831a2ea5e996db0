// accel::comm — the shared-memory transport: all_reduce, reduce_scatter, all_gather, broadcast and
// barrier between the ranks of one group that all sit on one node (one POSIX shared-memory segment
// per group, set up over the group's MPI control channel).
//
// Each rank owns a control block (counters, the posted signature) and two chunk buffers in the
// segment. A collective first posts its signature and compares every rank's (the cross-rank check:
// MismatchError on every rank, no data moved), then runs chunk by chunk, double-buffered, so copying
// chunk t+1 in overlaps the peers' work on chunk t. all_reduce: each rank copies in the parts of a
// chunk the others reduce, reduces its 1/N slice from every rank's copy (shm_reduce.h), then everyone
// copies the reduced slices out. A reduce_scatter input in node-shared memory (node_shared_empty) is not
// copied in: its peers read it where it lies, and the collective ends for its rank once they are done
// (so the caller may write it again). Nothing ever blocks: a collective is a list of steps, each waiting
// on peers' counters (acquire/release atomics in the segment); it is moved by whichever thread holds
// the group's lock, the caller polling in Work::wait or the process's shm progress thread, so waits
// inherit Work's deadline (TimeoutError, communicator broken) and a dead peer ends in a timeout.
// Large broadcasts, all_gathers and reduce_scatters (ACCEL_COMM_SHM_SINGLE_COPY_KB) skip the chunks
// where the kernel lets a rank read its peers' memory (process_vm_readv, probed at setup) and every
// rank has a core: each rank posts where its data lies and reads what it needs from each peer at its
// own pace, then waits until its peers are done reading its own.
#pragma once

#include "comm/transport/backend.h"

#include <memory>

namespace accel::comm {

class MpiBackend;

// Collective over `group` (every rank must call it): the transport, or nullptr on every rank when
// the segment cannot be set up (the caller keeps MPI). The ranks must share one machine.
std::unique_ptr<Backend> make_shm_backend(MpiBackend& group);

// Bytes this process's reduce_scatters read in place from peers' node-shared inputs (node_shared.h)
// instead of through the peers' buffers, since the process started.
std::uint64_t shm_bytes_read_in_place();
// Bytes this process's collectives read straight from peers' private memory (process_vm_readv: large
// broadcasts, and all_gathers and reduce_scatters from ACCEL_COMM_SHM_SINGLE_COPY_KB) since it started.
std::uint64_t shm_bytes_read_from_peer_memory();

}  // namespace accel::comm
