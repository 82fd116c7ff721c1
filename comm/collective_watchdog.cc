// The watchdog thread (Note [The collective watchdog] in comm/collective_watchdog.h). A
// collective's start wakes the thread only when it is idle; an end never wakes it: the thread wakes
// at the deadline of the collective it timed, and if that one has ended it times the one in flight
// now, if any.
#include "comm/collective_watchdog.h"

#include "common/error.h"

namespace ferry {
namespace {

// A wake-up this late after its deadline means the process was not running.
constexpr std::chrono::seconds kSuspended{1};

}  // namespace

CollectiveWatchdog::CollectiveWatchdog(double timeout_s, OnTimeout on_timeout)
    : timeout_(timeout_s), on_timeout_(std::move(on_timeout)) {
  FERRY_ASSERT(timeout_s > 0, "the watchdog's timeout must be positive");
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::begin(const char* what, int64_t sequence) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    active_ = true;
    ++started_;
    what_ = what;
    sequence_ = sequence;
    since_ = Clock::now();
    wake = idle_;
  }
  if (wake) cv_.notify_one();
}

void CollectiveWatchdog::end() {
  std::lock_guard lock(mu_);
  active_ = false;
}

void CollectiveWatchdog::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (!active_) {
      idle_ = true;
      cv_.wait(lock, [&] { return stop_ || active_; });
      idle_ = false;
      continue;
    }
    const uint64_t timed = started_;
    const auto deadline = since_ + std::chrono::duration_cast<Clock::duration>(timeout_);
    const bool moved_on =
        cv_.wait_until(lock, deadline, [&] { return stop_ || !active_ || started_ != timed; });
    if (moved_on || Clock::now() < deadline) continue;  // re-time whatever is in flight now
    if (Clock::now() - deadline > kSuspended) {
      // Woken long after the deadline: this process itself was stopped (SIGSTOP, a debugger),
      // which says nothing about the other ranks. Time the collective again from now; the job
      // that stopped us is usually about to kill us (Open MPI continues a process to end it).
      since_ = Clock::now();
      continue;
    }
    const Stalled stalled{what_, sequence_,
                          std::chrono::duration<double>(Clock::now() - since_).count()};
    lock.unlock();
    on_timeout_(stalled);  // ends the job; if it returns, stay quiet
    return;
  }
}

}  // namespace ferry
