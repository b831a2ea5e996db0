// accel::zero::StepWorker — one thread that runs the optimizer's step on shards whose gradients are
// final while backward goes on (ShardingSpec::step_in_backward): the engine posts a task per flat as
// its reduction finishes, and waits for all of them before anything reads the masters again.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace accel::zero {

class StepWorker {
 public:
  // on_start runs first on the worker's thread (the engine makes its device current there).
  explicit StepWorker(std::function<void()> on_start = nullptr);
  ~StepWorker();  // waits for what is posted, then ends the thread (an error of a task is dropped)
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  // Runs `task` on the worker's thread, after every task posted before it.
  void post(std::function<void()> task);
  // Blocks until every posted task has run; rethrows the first error a task threw since the last wait
  // (the tasks after it still ran).
  void wait();

  // Tests: every task starts this many milliseconds late (0: none), so that a caller that forgets to
  // wait reads what the tasks have not written yet.
  static void delay_tasks_for_tests(int ms);

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::size_t running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace accel::zero
