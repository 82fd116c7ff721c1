// WorkerPool: helpers claim indices from one atomic counter; a helper joins a loop only under
// the mutex while the loop is published, and run() unpublishes it and waits for busy_ == 0
// before returning, so no helper ever touches a finished loop.
#include "trainer/data/worker_pool.h"

#include <atomic>
#include <limits>

#include "common/error.h"

namespace ferry {

struct WorkerPool::Job {
  const std::function<void(int64_t)>* body = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> failed_index{std::numeric_limits<int64_t>::max()};
  std::mutex error_mu;
  std::exception_ptr error;
};

WorkerPool::WorkerPool(int workers) {
  FERRY_ASSERT(workers >= 1, "a worker pool needs at least one worker");
  for (int i = 1; i < workers; ++i) helpers_.emplace_back([this] { helper_loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void WorkerPool::work(Job& job) {
  while (true) {
    const int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    // Indices are claimed in increasing order: past a failure, the rest can be dropped.
    if (i >= job.n || i > job.failed_index.load(std::memory_order_relaxed)) return;
    try {
      (*job.body)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mu);
      if (i < job.failed_index.load(std::memory_order_relaxed)) {
        job.failed_index.store(i, std::memory_order_relaxed);
        job.error = std::current_exception();
      }
    }
  }
}

void WorkerPool::helper_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (job_ != nullptr && generation_ != seen); });
    if (stop_) return;
    seen = generation_;
    Job* job = job_;
    ++busy_;
    lock.unlock();
    work(*job);
    lock.lock();
    if (--busy_ == 0) cv_.notify_all();
  }
}

void WorkerPool::run(int64_t n, const std::function<void(int64_t)>& body) {
  if (n <= 0) return;
  Job job;
  job.body = &body;
  job.n = n;
  if (!helpers_.empty() && n > 1) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      ++generation_;
    }
    cv_.notify_all();
    work(job);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = nullptr;
    cv_.wait(lock, [&] { return busy_ == 0; });
  } else {
    work(job);
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace ferry
