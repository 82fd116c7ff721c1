// AsyncErrorWatchdog (Note [Ending a job when a collective cannot finish] in
// async_error_watchdog.h).
#include "comm/async_error_watchdog.h"

#include <utility>

#include "common/error.h"

namespace ferry {

AsyncErrorWatchdog::AsyncErrorWatchdog(std::string library, std::function<std::string()> health,
                                       std::function<void()> abort, std::chrono::milliseconds poll)
    : library_(std::move(library)),
      health_(std::move(health)),
      abort_(std::move(abort)),
      poll_(poll),
      thread_([this] { run(); }) {}

AsyncErrorWatchdog::~AsyncErrorWatchdog() { stop(); }

void AsyncErrorWatchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    stopped_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void AsyncErrorWatchdog::abort(const std::string& why) {
  std::lock_guard lock(mutex_);
  abort_locked(why);
}

void AsyncErrorWatchdog::abort_locked(const std::string& why) {
  if (aborted_ || stopped_) return;
  aborted_ = true;
  failure_ = why;
  abort_();  // under the lock: a concurrent abort() returns only after the backend is aborted
}

bool AsyncErrorWatchdog::aborted() const {
  std::lock_guard lock(mutex_);
  return aborted_;
}

std::string AsyncErrorWatchdog::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void AsyncErrorWatchdog::throw_if_failed(const std::string& what) const {
  std::string why;
  {
    std::lock_guard lock(mutex_);
    if (!aborted_) return;
    why = failure_;
  }
  throw LibraryError(library_, what,
                     "the communicator was aborted: " + why +
                         " (the job ends: another rank failed or the transport broke)",
                     __FILE__, __LINE__);
}

void AsyncErrorWatchdog::check_health() {
  // Under the lock: once stop() has returned, the backend's communicator is never asked again.
  std::lock_guard lock(mutex_);
  if (aborted_ || stopped_) return;
  const std::string error = health_();
  if (!error.empty()) abort_locked(error);
}

void AsyncErrorWatchdog::wait(const std::function<bool()>& ready, const std::string& what) {
  for (int polls = 0;; ++polls) {
    throw_if_failed(what);
    if (ready()) {
      throw_if_failed(what);  // an abort also ends the collective: its data is not a result
      return;
    }
    check_health();
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void AsyncErrorWatchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, poll_, [this] { return stop_; });
    if (stop_ || aborted_) continue;
    lock.unlock();
    check_health();
    lock.lock();
  }
}

}  // namespace ferry
