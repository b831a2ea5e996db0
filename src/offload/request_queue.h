// accel::offload::detail — the request queue under AsyncFile: a ticket's transfer, split into chunks
// of at most block_size bytes, carried out with up to queue_depth chunks in flight by io_uring (one
// ring and one completion thread per file) or, where io_uring cannot be set up, by a pool of
// queue_depth threads doing pread/pwrite. Short transfers are continued where they stopped; a
// failure is kept per ticket (the first one) for AsyncFile to describe.
//
// Internal to src/offload/ (AsyncFile is the interface).
#pragma once

#include "offload/async_file.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace accel::offload::detail {

struct Chunk {
  std::uint64_t ticket = 0;
  bool write = false;
  char* buffer = nullptr;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;
  std::size_t done = 0;  // bytes transferred so far; a short transfer goes on from here
};

// A read that reached the end of the file before its last byte (not an errno).
constexpr int kEndOfFile = -1;

// How a ticket ended: err 0 = every byte transferred; else the first failure's errno (or kEndOfFile)
// and the file offset where it happened.
struct Outcome {
  int err = 0;
  std::uint64_t at = 0;
};

class RequestQueue {
 public:
  // fd stays the caller's and must outlive the queue. direct: the fd is O_DIRECT (a short read that
  // stops off alignment is the end of the file). options: queue_depth, single_submit, overlap_events,
  // kernel_aio. path: for the log line when io_uring is unavailable.
  RequestQueue(int fd, bool direct, const AioOptions& options, const std::string& path);
  // Waits for everything queued, then stops the workers.
  ~RequestQueue();
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

  // Queues a ticket's chunks (none: complete at once) and returns without waiting.
  void enqueue(std::uint64_t ticket, std::vector<Chunk> chunks);
  // Blocks until every chunk of the ticket has completed, forgets the ticket and says how it ended.
  // An unknown (or already waited) ticket: complete.
  Outcome wait(std::uint64_t ticket);
  const char* engine() const { return uring_ ? "io_uring" : "thread pool"; }

 private:
  struct Ticket {
    std::size_t chunks_left = 0;
    Outcome outcome;
  };
  struct Ring;  // liburing's state, kept out of this header

  void start_workers();
  void uring_loop();
  void pool_loop();
  void complete(const Chunk& chunk, int err);  // err 0: done

  const int fd_;
  const bool direct_;
  const int queue_depth_;
  const bool single_submit_, overlap_events_;
  std::unique_ptr<Ring> uring_;  // null: the thread pool

  std::mutex mutex_;
  std::condition_variable work_cv_;  // workers: pending_ or stop_ changed
  std::condition_variable done_cv_;  // waiters: a ticket completed
  std::deque<Chunk> pending_;        // queued, not yet handed to the kernel / a thread
  std::unordered_map<std::uint64_t, Ticket> tickets_;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // started at the first request
};

}  // namespace accel::offload::detail
