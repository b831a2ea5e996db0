// accel::comm::Work — the handle every asynchronous collective returns.
//
// Contract: the tensors passed to a collective belong to the caller, who must neither free nor touch
// them until wait() returns (the Work keeps them alive until the collective has finished, and drops
// that reference before wait() returns). A caller must not free their storage in place either until
// the collective is complete, even after a wait() that timed out. wait() blocks the calling host thread until
// the collective is complete, raising its error if it failed: MismatchError, CommError, or
// TimeoutError when it did not finish in time (the communicator is then broken). Thread-safe.
#pragma once

#include "types.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace accel::comm {

class Work {
 public:
  // what: "all_reduce(float32[1024], sum)", named in errors with the rank; timeout: the options'.
  Work(std::string what, int rank, int world_size, Duration timeout);
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Waits up to `timeout` (zero: the collective's own timeout). Rethrows the collective's error.
  void wait(Duration timeout = Duration::zero());
  // True once finished, successfully or not. Never blocks.
  bool is_completed();
  // Like is_completed() but without polling the backend (for transports waiting on each other).
  bool finished();
  // The error a finished collective failed with, or null.
  std::exception_ptr exception();
  const std::string& what() const { return what_; }

  // --- backend side ------------------------------------------------------------------------
  // Marks the collective finished (err null on success). Called once, from any thread.
  void finish(std::exception_ptr err = nullptr);
  // For backends that complete by polling (CUDA events): called under no lock, returns true once
  // done; wait() and is_completed() call it until it does, then finish() themselves.
  void set_poll(std::function<bool()> poll);
  // Adds a callback run once, on the waiting thread, when a wait times out (the communicator marks
  // itself broken; a backend may abort its transport). Callbacks run in the order added.
  void set_on_timeout(std::function<void()> f);
  // What the backend knows about the peers when a wait times out (which rank has not joined, and
  // whether its process is stopped or gone), appended to the TimeoutError's message; "" says nothing.
  void set_diagnosis(std::function<std::string()> f);
  // Objects kept alive until the collective has finished (tensors in flight, staging buffers); they
  // are dropped inside finish(), before any waiter wakes. This keeps objects alive, not their memory:
  // a storage freed in place (sharding::free_storage) while a collective still runs is a bug.
  void keep_alive(std::shared_ptr<void> p);
  // Where wait() adds the nanoseconds its caller spent blocked (the communicator's wait counter).
  void set_wait_sink(std::shared_ptr<std::atomic<std::int64_t>> sink) { wait_sink_ = std::move(sink); }

 private:
  bool poll_once();

  const std::string what_;
  const int rank_, world_size_;
  const Duration timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool finishing_ = false;
  std::exception_ptr error_;
  std::function<bool()> poll_;
  std::vector<std::function<void()>> on_timeout_;
  std::function<std::string()> diagnosis_;
  std::vector<std::shared_ptr<void>> keep_;
  std::shared_ptr<std::atomic<std::int64_t>> wait_sink_;
};

using WorkPtr = std::shared_ptr<Work>;

namespace detail {
// How long a waiter polls a polled Work hot before yielding its core to others (then it sleeps).
// Set once by the CPU transport: long when the node's ranks have a core each, short when they
// outnumber the cores (a peer may need this very core to make progress). yield_in_spin: the long
// window gives the core up now and then (spin_turn), for ranks the scheduler put on one core anyway.
void set_spin_before_yield(std::chrono::microseconds d, bool yield_in_spin = false);
std::chrono::microseconds spin_before_yield();
// Bumped by a transport each time it moves a collective along (a chunk copied or reduced). A waiter
// that sees it change polls hot again: a long collective advances chunk by chunk, and the spin and
// yield windows count from its latest step, not from the start of the wait.
void note_progress();
std::uint64_t progress_count();
// One turn of a hot poll: with yield_in_spin, every 64th turn gives the core up (sched_yield), which
// returns at once when nothing else wants it and otherwise lets a peer that shares this core (an
// unbound rank the scheduler put here) take its turn now rather than after the 50 µs window.
void spin_turn(unsigned& turns);
}  // namespace detail

}  // namespace accel::comm
