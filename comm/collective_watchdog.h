// Times the collective in flight and calls `on_timeout` once past comm.timeout_s (a peer that
// never arrives); async_error_watchdog.h instead reacts to a backend's reported error. Invariant:
// at most one collective in flight per watchdog, and on_timeout runs at most once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ferry {

// Note [The collective watchdog]
// A rank that stops (SIGSTOP, a hang, a debugger) before a collective leaves every other rank
// blocked in that collective for ever: nothing fails, so the fault path of comm/fault.h never
// runs. As PyTorch's NCCL watchdog does, a thread per communicator watches the collective in
// flight and, past comm.timeout_s, ends the job through fail_job (MPI_Abort). The blocking MPI
// collectives (the default, the fastest: comm/backends.h) cannot be given a deadline, so the
// watchdog is a separate thread rather than a deadline in a polling loop. To name the ranks that
// did not arrive, each rank posts the sequence number of the collective it enters, and beats a
// heartbeat counter from a thread of its own, where the others can read both without its help
// (comm/mpi_arrivals.h): a rank is late when it has not entered the collective, or entered it and
// stopped running (a stopped process's comm thread may be ahead of its host thread). The lowest
// rank that is in the collective and running reports; the others wait a little, so one message
// names the late ranks. A watchdog that wakes long after its deadline was itself stopped and
// times its collective again rather than blame the others (Open MPI continues a stopped rank to
// kill it).

class CollectiveWatchdog {
 public:
  // The collective that timed out: what it was ("all-reduce"), its sequence number, and how long
  // it had waited when the watchdog fired.
  struct Stalled {
    std::string what;
    int64_t sequence = 0;
    double waited_s = 0;
  };
  using OnTimeout = std::function<void(const Stalled&)>;

  // timeout_s > 0. `on_timeout` runs on the watchdog's thread; it is expected to end the job.
  CollectiveWatchdog(double timeout_s, OnTimeout on_timeout);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // The calling thread enters collective `sequence` (`what` must outlive the call to end()).
  void begin(const char* what, int64_t sequence);
  // The collective begun last has completed.
  void end();

  double timeout_s() const { return timeout_.count(); }

 private:
  using Clock = std::chrono::steady_clock;
  void run();

  std::chrono::duration<double> timeout_;
  OnTimeout on_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool active_ = false;   // a collective is in flight
  bool idle_ = false;     // the watchdog thread waits for a collective to begin
  uint64_t started_ = 0;  // collectives begun so far: tells one from the next
  const char* what_ = "";
  int64_t sequence_ = 0;
  Clock::time_point since_;
  std::thread thread_;
};

}  // namespace ferry
