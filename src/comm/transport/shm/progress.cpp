// The progress thread (progress.h).
#include "comm/transport/shm/progress.h"

#include "comm/transport/mpi/mpi_backend.h"
#include "comm/transport/shm/group.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/prctl.h>

namespace accel::comm::shm {
namespace {

// The process's shm progress thread: moves the groups that have collectives queued while their
// callers compute. Spins briefly, then yields, then sleeps between polls (ranks may outnumber cores).
class ShmEngine {
 public:
  static ShmEngine& get() {
    static ShmEngine engine;
    return engine;
  }

  void activate(const std::shared_ptr<ShmGroup>& g) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (std::find(active_.begin(), active_.end(), g) == active_.end()) active_.push_back(g);
      ++generation_;
    }
    cv_.notify_one();
  }

 private:
  ShmEngine() : thread_([this] { loop(); }) {}
  ~ShmEngine() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  static constexpr int kYieldPolls = 2000;

  void loop() {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    using Clock = std::chrono::steady_clock;
    Clock::time_point stop_deadline{};
    std::vector<std::shared_ptr<ShmGroup>> groups;
    int empty_polls = 0;
    unsigned turns = 0;
    Clock::time_point idle_since = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        active_.erase(std::remove_if(active_.begin(), active_.end(), [](const auto& g) { return g->idle(); }),
                      active_.end());
        if (stop_) {
          // At exit: finish what peers may be waiting for, but never longer than one timeout.
          if (stop_deadline == Clock::time_point{}) stop_deadline = Clock::now() + default_timeout();
          if (active_.empty() || MpiBackend::is_broken()) return;
          if (Clock::now() > stop_deadline) {
            MpiBackend::mark_broken();  // MPI aborts the job instead of finalizing
            return;
          }
        } else if (active_.empty()) {
          cv_.wait(lk, [&] { return stop_ || !active_.empty(); });
          empty_polls = 0;
          idle_since = Clock::now();
          continue;
        }
        groups = active_;
      }
      bool moved = false;
      for (auto& g : groups) moved |= g->progress();
      groups.clear();
      if (moved) {
        empty_polls = 0;
        idle_since = Clock::now();
      } else if (Clock::now() - idle_since < detail::spin_before_yield()) {
        detail::spin_turn(turns);  // hot
      } else if (++empty_polls > kYieldPolls) {
        std::unique_lock<std::mutex> lk(mu_);
        const std::uint64_t gen = generation_;
        if (cv_.wait_for(lk, std::chrono::microseconds(20), [&] { return stop_ || generation_ != gen; })) {
          empty_polls = 0;  // a new collective: poll hot again
          idle_since = Clock::now();
        }
      } else {
        sched_yield();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::uint64_t generation_ = 0;  // bumped by every activate(), so a new collective cuts a sleep short
  std::vector<std::shared_ptr<ShmGroup>> active_;
  std::thread thread_;
};

}  // namespace

void activate(const std::shared_ptr<ShmGroup>& g) { ShmEngine::get().activate(g); }

}  // namespace accel::comm::shm
