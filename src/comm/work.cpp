#include "comm/work.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <sched.h>

namespace accel::comm {

namespace detail {
static std::atomic<std::int64_t> g_spin_us{10};
static std::atomic<bool> g_yield_in_spin{false};
void set_spin_before_yield(std::chrono::microseconds d, bool yield_in_spin) {
  g_spin_us = d.count();
  g_yield_in_spin = yield_in_spin;
}
std::chrono::microseconds spin_before_yield() { return std::chrono::microseconds(g_spin_us.load()); }
static std::atomic<std::uint64_t> g_progress{0};
void note_progress() { g_progress.fetch_add(1, std::memory_order_relaxed); }
std::uint64_t progress_count() { return g_progress.load(std::memory_order_relaxed); }
void spin_turn(unsigned& turns) {
  // (Measured, 2 unbound ranks that the scheduler put on one core, all_reduce of 128 KiB-1 MiB:
  // 1.9-3.3 GB/s spinning without a yield, 5.7-7.8 with one every 64 turns; ranks on cores of their
  // own see no difference. Oversubscribed ranks, whose hot window is 5 µs, do not yield in it: 4 on
  // 2 cores had a 1 KiB all_reduce take 17-18 µs with the yield against 9-10 without.)
  constexpr unsigned kYieldEvery = 64;
  if (g_yield_in_spin.load(std::memory_order_relaxed) && ++turns % kYieldEvery == 0) sched_yield();
}
}  // namespace detail

static std::string seconds(Duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", d.count() / 1000.0);
  return buf;
}

Work::Work(std::string what, int rank, int world_size, Duration timeout)
    : what_(std::move(what)), rank_(rank), world_size_(world_size), timeout_(timeout) {}

Work::~Work() = default;

void Work::finish(std::exception_ptr err) {
  std::vector<std::shared_ptr<void>> keep;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_ || finishing_) return;
    finishing_ = true;
    keep.swap(keep_);
  }
  // The finishing thread (the MPI progress thread, say) drops its references to the caller's tensors
  // before any waiter wakes: what the caller frees after wait() is freed on the caller's thread.
  keep.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    error_ = std::move(err);
  }
  cv_.notify_all();
}

void Work::set_poll(std::function<bool()> poll) {
  std::lock_guard<std::mutex> lk(mu_);
  poll_ = std::move(poll);
}

void Work::set_diagnosis(std::function<std::string()> f) {
  std::lock_guard<std::mutex> lk(mu_);
  diagnosis_ = std::move(f);
}

void Work::set_on_timeout(std::function<void()> f) {
  std::lock_guard<std::mutex> lk(mu_);
  on_timeout_.push_back(std::move(f));
}

void Work::keep_alive(std::shared_ptr<void> p) {
  std::lock_guard<std::mutex> lk(mu_);
  keep_.push_back(std::move(p));
}

// Runs the backend's poll (if any) outside the lock; finishes the work when it reports done.
bool Work::poll_once() {
  std::function<bool()> poll;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return true;
    poll = poll_;
  }
  if (!poll) return false;
  try {
    if (poll()) finish();
  } catch (...) {
    finish(std::current_exception());
  }
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

bool Work::is_completed() { return poll_once(); }

bool Work::finished() {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

std::exception_ptr Work::exception() {
  poll_once();
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void Work::wait(Duration timeout) {
  if (timeout <= Duration::zero()) timeout = timeout_;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  bool polled;
  {
    std::lock_guard<std::mutex> lk(mu_);
    polled = static_cast<bool>(poll_);
  }
  bool done = false;
  if (polled) {
    // The poll may move the collective itself (shared memory), so poll hot at first; then yield the
    // core to peers (ranks may outnumber cores), then sleep, woken early when another thread finishes.
    // Each step the transport makes (here or on the progress thread) starts the windows again.
    auto spin_until = start + detail::spin_before_yield();
    auto yield_until = spin_until + std::chrono::milliseconds(1);
    auto nap = std::chrono::microseconds(10);
    std::uint64_t seen = detail::progress_count();
    unsigned turns = 0;
    while (!(done = poll_once())) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      if (const std::uint64_t p = detail::progress_count(); p != seen) {
        seen = p;
        spin_until = now + detail::spin_before_yield();
        yield_until = spin_until + std::chrono::milliseconds(1);
        nap = std::chrono::microseconds(10);
      }
      if (now < spin_until) {
        detail::spin_turn(turns);
        continue;
      }
      if (now < yield_until) {
        sched_yield();
        continue;
      }
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, nap, [&] { return done_; });
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  } else {
    std::unique_lock<std::mutex> lk(mu_);
    done = cv_.wait_until(lk, deadline, [&] { return done_; });
  }
  if (wait_sink_)
    wait_sink_->fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  std::vector<std::function<void()>> on_timeout;
  std::function<std::string()> diagnosis;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!done) {
      on_timeout = std::move(on_timeout_);
      on_timeout_.clear();
      diagnosis = diagnosis_;
    }
    err = error_;
  }
  if (!done) {
    // Before the callbacks: they may abort the transport the diagnosis reads.
    std::string peers = diagnosis ? diagnosis() : std::string();
    for (auto& f : on_timeout) f();
    throw TimeoutError(fmt::format(
        "{} on rank {} of {} did not complete within {} s: {} (timeout: ACCEL_COMM_TIMEOUT_S or the collective's "
        "options). The communicator is now broken.",
        what_, rank_, world_size_, seconds(timeout),
        peers.empty() ? std::string("a peer rank is stuck, slow or dead") : peers));
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace accel::comm
