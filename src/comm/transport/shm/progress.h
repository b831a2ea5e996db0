// accel::comm::shm — the process's shm progress thread: it moves the groups that have collectives
// queued while their callers compute. Internal.
#pragma once

#include <memory>

namespace accel::comm::shm {

class ShmGroup;

// Puts `g` on the progress thread's list (started on first use) until its queue is empty.
void activate(const std::shared_ptr<ShmGroup>& g);

}  // namespace accel::comm::shm
