// The asynchronous-error watchdog and the fault actions (issue 16, defect 5: NCCL had no error or
// abort path): an asynchronous error seen while a host waits aborts the backend once and throws;
// the watchdog's own thread aborts even when no host wait polls (a blocking device synchronize
// then returns); fail_job aborts registered communicators before it ends the job. The backend
// here is two fakes; that ncclCommGetAsyncError and ncclCommAbort behave as the fakes do is
// shown only on GPUs (two ranks, so two GPUs).
#include "comm/async_error_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "comm/fault.h"
#include "common/error.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

// A backend whose asynchronous error appears when `fail` is set.
struct FakeBackend {
  std::atomic<bool> fail{false};
  std::atomic<int> health_calls{0};
  std::atomic<int> aborts{0};
  std::atomic<bool> collective_done{false};  // an abort ends the collective, as ncclCommAbort

  AsyncErrorWatchdog watchdog(std::chrono::milliseconds poll = 5ms) {
    return AsyncErrorWatchdog(
        "FAKE",
        [this] {
          ++health_calls;
          return fail ? std::string("peer 1 is gone") : std::string();
        },
        [this] {
          ++aborts;
          collective_done = true;
        },
        poll);
  }
};

TEST(AsyncErrorWatchdog, AnErrorSeenWhileWaitingAbortsOnceAndThrows) {
  FakeBackend backend;
  AsyncErrorWatchdog watchdog(
      "FAKE", [&] { return backend.fail ? "peer 1 is gone" : std::string(); },
      [&] { ++backend.aborts; }, 1h);  // only the wait polls here
  std::thread peer([&] {
    std::this_thread::sleep_for(20ms);
    backend.fail = true;
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    watchdog.wait([] { return false; }, "all-reduce");  // a collective that never completes
    ADD_FAILURE() << "the wait returned";
  } catch (const LibraryError& e) {
    EXPECT_NE(std::string(e.what()).find("peer 1 is gone"), std::string::npos) << e.what();
    EXPECT_EQ(e.library(), "FAKE");
  }
  peer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(backend.aborts, 1);
  EXPECT_TRUE(watchdog.aborted());
  EXPECT_THROW(watchdog.throw_if_failed("next all-reduce"), LibraryError);
  watchdog.abort("again");
  EXPECT_EQ(backend.aborts, 1) << "abort runs at most once";
  EXPECT_EQ(watchdog.failure(), "peer 1 is gone");
}

// The trainer mostly waits in device synchronizes, which do not poll: the watchdog's thread
// must abort on its own (the abort is what lets those synchronizes return).
TEST(AsyncErrorWatchdog, ItsThreadAbortsWhenNobodyPolls) {
  FakeBackend backend;
  AsyncErrorWatchdog watchdog = backend.watchdog();
  std::this_thread::sleep_for(30ms);
  EXPECT_GT(backend.health_calls, 0) << "the thread polls";
  EXPECT_EQ(backend.aborts, 0) << "a healthy backend is not aborted";
  backend.fail = true;
  const auto start = std::chrono::steady_clock::now();
  while (!backend.collective_done && std::chrono::steady_clock::now() - start < 5s) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(backend.collective_done);
  EXPECT_EQ(backend.aborts, 1);
}

TEST(AsyncErrorWatchdog, ACollectiveEndedByAnAbortIsNotAResult) {
  FakeBackend backend;
  AsyncErrorWatchdog watchdog = backend.watchdog(1h);
  backend.fail = true;
  // ready() turns true only because the abort ended the collective: still an error.
  EXPECT_THROW(watchdog.wait([&] { return backend.collective_done.load(); }, "broadcast"),
               LibraryError);
  EXPECT_EQ(backend.aborts, 1);
}

TEST(AsyncErrorWatchdog, AHealthyWaitReturnsWithoutAborting) {
  FakeBackend backend;
  AsyncErrorWatchdog watchdog = backend.watchdog();
  int polls = 0;
  watchdog.wait([&] { return ++polls == 50; }, "all-reduce");
  EXPECT_EQ(polls, 50);
  EXPECT_EQ(backend.aborts, 0);
  EXPECT_NO_THROW(watchdog.throw_if_failed("all-reduce"));
}

TEST(AsyncErrorWatchdog, AfterStopTheBackendIsNeverAskedAgain) {
  FakeBackend backend;
  AsyncErrorWatchdog watchdog = backend.watchdog();
  watchdog.stop();
  const int calls = backend.health_calls;
  backend.fail = true;
  std::this_thread::sleep_for(30ms);
  watchdog.abort("too late");
  int polls = 0;
  watchdog.wait([&] { return ++polls == 3; }, "destroy");
  EXPECT_EQ(backend.health_calls, calls);
  EXPECT_EQ(backend.aborts, 0);
}

TEST(FaultActions, FailJobRunsTheRegisteredActionsOnce) {
  int runs = 0;
  {
    ScopedFaultAction action([&] { ++runs; });
    ScopedFaultAction throwing([] { throw std::runtime_error("cannot abort"); });
    EXPECT_EQ(fail_job(RankInfo{}, "injected failure", "", 3), 3);  // no MPI: returns the code
    EXPECT_EQ(runs, 1);
    run_fault_actions();
    EXPECT_EQ(runs, 1) << "each action runs at most once";
  }
  ScopedFaultAction later([&] { runs += 10; });
  run_fault_actions();
  EXPECT_EQ(runs, 11);
}

TEST(FaultActions, AnActionGoneOutOfScopeDoesNotRun) {
  int runs = 0;
  {
    ScopedFaultAction action([&] { ++runs; });
  }
  run_fault_actions();
  EXPECT_EQ(runs, 0);
}

}  // namespace
}  // namespace ferry
