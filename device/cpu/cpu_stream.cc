// Worker-thread streams and counter events.
#include "device/cpu/cpu_stream.h"

#include "common/error.h"
#include "device/host_waits.h"

namespace ferry::cpu {

bool CpuEvent::ready() {
  std::lock_guard lock(state_->mu);
  return state_->completed >= state_->recorded;
}

void CpuEvent::synchronize() {
  std::unique_lock lock(state_->mu);
  const uint64_t target = state_->recorded;
  if (state_->completed < target) count_host_wait();
  state_->cv.wait(lock, [&] { return state_->completed >= target; });
  if (state_->error) std::rethrow_exception(state_->error);
}

CpuStream::CpuStream(StreamKind kind, std::function<void()> thread_init) : kind_(kind) {
  worker_ = std::thread([this, init = std::move(thread_init)]() mutable { loop(std::move(init)); });
}

CpuStream::~CpuStream() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void CpuStream::push(Task task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
    ++enqueued_;
  }
  cv_.notify_all();
}

void CpuStream::enqueue(std::function<void()> task) { push(Task{std::move(task), false}); }

void CpuStream::record(Event& event) {
  auto state = static_cast<CpuEvent&>(event).state();
  uint64_t target;
  {
    std::lock_guard lock(state->mu);
    target = ++state->recorded;
  }
  push(Task{[this, state, target] {
              std::exception_ptr error;
              {
                std::lock_guard lock(mu_);
                error = error_;
              }
              {
                std::lock_guard lock(state->mu);
                if (target > state->completed) state->completed = target;
                state->completed_at = std::chrono::steady_clock::now();
                if (error) state->error = error;
              }
              state->cv.notify_all();
            },
            true});
}

void CpuStream::wait(Event& event) {
  auto state = static_cast<CpuEvent&>(event).state();
  uint64_t target;
  {
    std::lock_guard lock(state->mu);
    target = state->recorded;
    if (state->completed >= target) return;  // nothing outstanding: no ordering needed
  }
  push(Task{[state, target] {
              std::unique_lock lock(state->mu);
              state->cv.wait(lock, [&] { return state->completed >= target; });
            },
            true});
}

void CpuStream::synchronize() {
  FERRY_ASSERT(!on_worker(), "a stream cannot synchronize with itself");
  std::unique_lock lock(mu_);
  const uint64_t target = enqueued_;
  if (finished_ < target) count_host_wait();
  cv_.wait(lock, [&] { return finished_ >= target; });
  if (error_) std::rethrow_exception(error_);
}

void CpuStream::loop(std::function<void()> thread_init) {
  if (thread_init) thread_init();
  while (true) {
    Task task;
    bool poisoned;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      poisoned = error_ != nullptr;
    }
    if (!poisoned || task.always) {
      try {
        task.run();
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    {
      std::lock_guard lock(mu_);
      ++finished_;
    }
    cv_.notify_all();
  }
}

}  // namespace ferry::cpu
