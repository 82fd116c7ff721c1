// A small thread pool for the data loader: the calling thread and workers - 1 helpers run the
// iterations of one parallel loop at a time. Invariant: run() returns only once every iteration
// it started has finished, and rethrows the lowest failed index's error, whatever the timing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry {

class WorkerPool {
 public:
  // `workers` >= 1 threads in all: the caller of run() and workers - 1 helpers.
  explicit WorkerPool(int workers);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int workers() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs body(i) for i in [0, n) on the helpers and the calling thread, each index once, and
  // waits for all. When some throw, rethrows the exception of the lowest failing index
  // (indices above it may not run). Call from one thread at a time.
  void run(int64_t n, const std::function<void(int64_t)>& body);

 private:
  struct Job;
  void helper_loop();
  static void work(Job& job);

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> helpers_;
  Job* job_ = nullptr;  // the loop in progress, or nullptr
  uint64_t generation_ = 0;
  int busy_ = 0;  // helpers inside job_
  bool stop_ = false;
};

}  // namespace ferry
