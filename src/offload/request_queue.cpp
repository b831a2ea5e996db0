// accel::offload::detail::RequestQueue — io_uring (liburing) with a thread-pool fallback; see the header.
#include "offload/request_queue.h"

#include "base/log.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace accel::offload::detail {

struct RequestQueue::Ring {
  io_uring ring{};
  bool ready = false;  // io_uring_queue_init succeeded
  ~Ring() {
    if (ready) io_uring_queue_exit(&ring);
  }
};

namespace {

void log_uring_unavailable(int err, const std::string& path, int threads) {
  static std::once_flag once;
  std::call_once(once, [&] {
    log::warning("offload: io_uring is not available here (io_uring_queue_init: " + std::string(std::strerror(err)) +
                 "; a container's seccomp profile or kernel.io_uring_disabled may block it), so offload files such "
                 "as " +
                 path + " are read and written by a pool of " + std::to_string(threads) +
                 " threads doing pread/pwrite instead");
  });
}

bool retryable(int err) { return err == EINTR || err == EAGAIN; }

}  // namespace

RequestQueue::RequestQueue(int fd, bool direct, const AioOptions& options, const std::string& path)
    : fd_(fd),
      direct_(direct),
      queue_depth_(options.queue_depth),
      single_submit_(options.single_submit),
      overlap_events_(options.overlap_events) {
  if (!options.kernel_aio) return;
  auto ring = std::make_unique<Ring>();
  const int rc = io_uring_queue_init(static_cast<unsigned>(queue_depth_), &ring->ring, 0);
  if (rc == 0) {
    ring->ready = true;
    uring_ = std::move(ring);
  } else {
    log_uring_unavailable(-rc, path, queue_depth_);
  }
}

RequestQueue::~RequestQueue() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] {
      return std::all_of(tickets_.begin(), tickets_.end(), [](const auto& t) { return t.second.chunks_left == 0; });
    });
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void RequestQueue::start_workers() {
  if (!workers_.empty()) return;
  if (uring_) {
    workers_.emplace_back([this] { uring_loop(); });
  } else {
    for (int i = 0; i < queue_depth_; ++i) workers_.emplace_back([this] { pool_loop(); });
  }
}

void RequestQueue::enqueue(std::uint64_t ticket, std::vector<Chunk> chunks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tickets_[ticket].chunks_left = chunks.size();
    for (auto& c : chunks) pending_.push_back(c);
  }
  if (chunks.empty()) return;
  start_workers();
  work_cv_.notify_all();
}

Outcome RequestQueue::wait(std::uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return {};
  Ticket* t = &it->second;  // stays valid across rehashing
  done_cv_.wait(lock, [&] { return t->chunks_left == 0; });
  const Outcome outcome = t->outcome;
  tickets_.erase(ticket);
  return outcome;
}

void RequestQueue::complete(const Chunk& chunk, int err) {
  std::lock_guard<std::mutex> lock(mutex_);
  Ticket& t = tickets_.at(chunk.ticket);
  if (err != 0 && t.outcome.err == 0) t.outcome = {err, chunk.offset + chunk.done};
  if (--t.chunks_left == 0) done_cv_.notify_all();
}

// How a transfer that returned `got` bytes (>= 0) goes on: 0 when the chunk is done, -2 to continue
// (a short transfer), else the error to report.
static int after_transfer(Chunk& c, std::size_t got, bool direct) {
  if (got == 0) return c.write ? EIO : kEndOfFile;  // a write that makes no progress: nothing else to call it
  c.done += got;
  if (c.done == c.bytes) return 0;
  // O_DIRECT reads stop short only at the end of the file; what is left is then misaligned.
  if (!c.write && direct && (c.offset + c.done) % kAlignment != 0) return kEndOfFile;
  return -2;
}

// One thread owns the ring: it moves chunks from pending_ into free slots (up to queue_depth in flight),
// submits them, and reaps completions, so requests progress while the caller computes. New work that
// arrives while it waits for a completion is picked up as soon as one completes.
void RequestQueue::uring_loop() {
  io_uring* ring = &uring_->ring;
  std::vector<Chunk> slot(static_cast<std::size_t>(queue_depth_));
  std::vector<bool> busy(slot.size(), false);
  std::vector<int> free_slots;
  for (int i = queue_depth_ - 1; i >= 0; --i) free_slots.push_back(i);
  std::vector<int> ready;  // slots to submit (new chunks and continued short transfers)
  int in_flight = 0;
  int broken = 0;  // an errno once the ring itself failed: every chunk from then on fails with it
  auto finish = [&](int s, int err) {
    complete(slot[s], err);
    busy[s] = false;
    free_slots.push_back(s);
  };
  // Everything prepared goes to the kernel (io_uring_submit may take fewer entries than are ready
  // when one fails early; the rest stay in the ring and the next call takes them).
  auto submit_all = [&]() -> int {
    while (io_uring_sq_ready(ring) > 0) {
      const int rc = io_uring_submit(ring);
      if (rc < 0 && !retryable(-rc) && rc != -EBUSY) return -rc;
      if (rc <= 0) std::this_thread::yield();
    }
    return 0;
  };

  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (in_flight == 0 && ready.empty()) {
        work_cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        if (pending_.empty()) return;  // stop_, and nothing left
      }
      // overlap_events=false: the next batch goes in only once the previous one has fully completed.
      if (overlap_events_ || in_flight == 0) {
        while (!pending_.empty() && !free_slots.empty()) {
          const int s = free_slots.back();
          free_slots.pop_back();
          slot[s] = pending_.front();
          busy[s] = true;
          pending_.pop_front();
          ready.push_back(s);
        }
      }
    }

    int prepared = 0;  // entries of `ready` given a submission entry, in order
    if (!broken) {
      for (int s : ready) {
        Chunk& c = slot[s];
        io_uring_sqe* sqe = io_uring_get_sqe(ring);  // never null: at most queue_depth entries in flight
        char* at = c.buffer + c.done;
        const auto n = static_cast<unsigned>(c.bytes - c.done);
        const std::uint64_t off = c.offset + c.done;
        if (c.write) {
          io_uring_prep_write(sqe, fd_, at, n, off);
        } else {
          io_uring_prep_read(sqe, fd_, at, n, off);
        }
        // Buffered files (no O_DIRECT): without IOSQE_ASYNC, io_uring_submit itself performed
        // page-cache-missing reads, blocking this thread for 8-98% of a run (measured, docs/offload.md);
        // handing them to the kernel's workers keeps submission non-blocking.
        if (!direct_) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
        io_uring_sqe_set_data64(sqe, static_cast<std::uint64_t>(s));
        ++prepared;
        if (single_submit_ && (broken = submit_all()) != 0) break;
      }
      if (!broken && !single_submit_ && prepared > 0) broken = submit_all();
    }
    if (broken) {
      // The ring failed: the entries the kernel did not take (the last ones; they stay in the ring,
      // never submitted) and those not prepared fail with its error; those taken are reaped below.
      const int sent = prepared > 0 ? prepared - static_cast<int>(io_uring_sq_ready(ring)) : 0;
      in_flight += sent;
      for (std::size_t i = static_cast<std::size_t>(sent); i < ready.size(); ++i) finish(ready[i], broken);
    } else {
      in_flight += prepared;
    }
    ready.clear();
    if (in_flight == 0) continue;

    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(ring, &cqe);
    if (rc < 0) {
      if (retryable(-rc)) continue;
      // Cannot reap: nothing more can be known about the requests in flight.
      broken = -rc;
      for (std::size_t s = 0; s < slot.size(); ++s)
        if (busy[s]) finish(static_cast<int>(s), broken);
      in_flight = 0;
      continue;
    }
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      --in_flight;
      const int s = static_cast<int>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      int err;
      if (res < 0) {
        err = retryable(-res) ? -2 : -res;
      } else {
        err = after_transfer(slot[s], static_cast<std::size_t>(res), direct_);
      }
      if (err == -2 && !broken) {
        ready.push_back(s);  // resubmitted at the top of the loop
      } else {
        finish(s, err == -2 ? broken : err);
      }
    }
    io_uring_cq_advance(ring, seen);
  }
}

// The fallback: queue_depth threads, each carrying one chunk at a time to the end.
void RequestQueue::pool_loop() {
  for (;;) {
    Chunk c;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;
      c = pending_.front();
      pending_.pop_front();
    }
    int err = -2;
    while (err == -2) {
      const ssize_t got = c.write ? ::pwrite(fd_, c.buffer + c.done, c.bytes - c.done, c.offset + c.done)
                                  : ::pread(fd_, c.buffer + c.done, c.bytes - c.done, c.offset + c.done);
      if (got < 0) {
        err = retryable(errno) ? -2 : errno;
      } else {
        err = after_transfer(c, static_cast<std::size_t>(got), direct_);
      }
    }
    complete(c, err);
  }
}

}  // namespace accel::offload::detail
