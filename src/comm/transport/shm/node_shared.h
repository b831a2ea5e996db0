// accel::comm — where node-shared memory (Communicator::node_shared_empty) lies in this process, so that
// a transport can read a peer's tensor in place instead of copying it through its own buffers. Every
// object has a key that all the ranks which mapped it agree on; an address inside it is (key, offset)
// on every rank. Internal to src/comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace accel::comm {

struct SharedLocation {
  std::uint64_t key = 0;  // 0: not in node-shared memory
  std::uint64_t offset = 0;
};

// Where [p, p + bytes) lies, when it lies wholly inside one node-shared object this process maps.
SharedLocation find_node_shared(const void* p, std::size_t bytes);
// This process's address of `bytes` bytes at `offset` in the object `key`, or nullptr when this
// process does not map that object (or it is smaller).
char* node_shared_address(std::uint64_t key, std::uint64_t offset, std::size_t bytes);

// The POSIX shared-memory name of this process's n-th object of a kind ("seg": a transport's segment,
// "ns": node_shared_empty): /accel-<kind>-<pid>-<token>-<n>, the token random per process, so that jobs
// in different PID namespaces sharing one /dev/shm (containers) cannot pick the same name.
std::string shm_object_name(const char* kind, int n);

}  // namespace accel::comm
