#include "zero/step_worker.h"

#include <atomic>
#include <chrono>
#include <utility>

namespace accel::zero {
namespace {
std::atomic<int> g_delay_ms{0};
}  // namespace

void StepWorker::delay_tasks_for_tests(int ms) { g_delay_ms.store(ms); }

StepWorker::StepWorker(std::function<void()> on_start)
    : thread_([this, on_start = std::move(on_start)] {
        if (on_start) {
          try {
            on_start();
          } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            error_ = std::current_exception();
          }
        }
        run();
      }) {}

StepWorker::~StepWorker() {
  try {
    wait();
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepWorker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void StepWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return tasks_.empty() && running_ == 0; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void StepWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // (stop_, nothing left)
    std::exception_ptr err;
    {
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      lock.unlock();
      if (const int ms = g_delay_ms.load(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      try {
        task();
      } catch (...) {
        err = std::current_exception();
      }
    }  // (what the task holds goes before wait() returns)
    lock.lock();
    --running_;
    if (err && !error_) error_ = err;
    cv_.notify_all();
  }
}

}  // namespace accel::zero
