// Watches a device communicator's asynchronous error (NCCL): on the first error it aborts the
// backend once, so no stream stays blocked, and host waits poll it; collective_watchdog.h instead
// times collectives out. Invariant: abort runs at most once; after it every wait throws.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ferry {

// Note [Ending a job when a collective cannot finish]
// Backend-neutral: the backend passes the two functions (health, abort), so its rules are tested
// without a GPU.
// An MPI collective returns an error to its caller; an NCCL collective is a kernel that spins
// until its peers join, and a host wait on it (cudaEventSynchronize, cudaStreamSynchronize, a
// device-wide synchronize in the executor) blocks with it. So the NCCL communicator
//  - runs a AsyncErrorWatchdog thread that polls ncclCommGetAsyncError every `poll`, and on an
//  error
//    calls ncclCommAbort: the kernels return, every blocked host wait returns, and the next call
//    into the communicator (or the wait of a collective) throws LibraryError;
//  - waits for its own collectives (CommWork::wait, barrier, its destructor) by polling, with
//    the health checked each time, never in a blocking synchronize;
//  - registers a ScopedFaultAction (comm/fault.h), so that when this rank fails for any other
//    reason fail_job aborts the communicator before MPI_Abort.
// The exception reaches main, whose fail_job ends the job by MPI_Abort, the MPI path's bound:
// mpirun kills every other rank, wherever it waits.

class AsyncErrorWatchdog {
 public:
  // `health` returns the backend's asynchronous error ("" while healthy); `abort` ends the
  // backend's communicator. `library` names it in LibraryError ("NCCL"). Polls on a thread of
  // its own every `poll`.
  AsyncErrorWatchdog(std::string library, std::function<std::string()> health,
                     std::function<void()> abort,
                     std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  ~AsyncErrorWatchdog();  // stops the thread (does not abort)
  AsyncErrorWatchdog(const AsyncErrorWatchdog&) = delete;
  AsyncErrorWatchdog& operator=(const AsyncErrorWatchdog&) = delete;

  // Aborts the backend now unless it was already, recording `why` as the failure if none was.
  void abort(const std::string& why);
  bool aborted() const;
  // The failure that aborted the backend ("" if none).
  std::string failure() const;
  // Throws LibraryError(library, what, failure) when aborted.
  void throw_if_failed(const std::string& what) const;
  // Stops polling: health and abort are never called again (the backend's communicator is about
  // to be destroyed). wait() still polls ready(). Idempotent; the destructor calls it.
  void stop();
  // Returns once ready() is true. Polls ready() and the health, yielding the core between polls
  // (and sleeping 50 us after the first thousand); on a failure aborts and throws LibraryError.
  void wait(const std::function<bool()>& ready, const std::string& what);

 private:
  void check_health();
  void abort_locked(const std::string& why);
  void run();

  std::string library_;
  std::function<std::string()> health_;
  std::function<void()> abort_;
  std::chrono::milliseconds poll_;
  mutable std::mutex mutex_;  // guards failure_, aborted_, stop_; held while abort_ runs
  std::condition_variable wake_;
  std::string failure_;
  bool aborted_ = false;
  bool stop_ = false;     // the thread ends
  bool stopped_ = false;  // health and abort are off
  std::thread thread_;    // last: started once every other member is set
};

}  // namespace ferry
