// The collective watchdog without MPI: it fires once for a collective that outlasts the timeout,
// with its name and sequence number, never for collectives that end in time however many there
// are, and times each collective from its own start.
#include "comm/collective_watchdog.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ferry {
namespace {

using namespace std::chrono_literals;

struct Fired {
  std::atomic<int> count{0};
  std::atomic<int64_t> sequence{0};
  std::atomic<double> waited{0};
  std::string what;
};

CollectiveWatchdog::OnTimeout record(Fired& f) {
  return [&f](const CollectiveWatchdog::Stalled& s) {
    f.what = s.what;
    f.sequence = s.sequence;
    f.waited = s.waited_s;
    ++f.count;
  };
}

TEST(CollectiveWatchdog, FiresOnceForACollectiveThatOutlastsTheTimeout) {
  Fired f;
  CollectiveWatchdog w(0.2, record(f));
  w.begin("all-reduce", 7);
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(f.count, 1);
  EXPECT_EQ(f.what, "all-reduce");
  EXPECT_EQ(f.sequence, 7);
  EXPECT_GE(f.waited, 0.2);
  EXPECT_LT(f.waited, 0.5);
  w.end();
}

TEST(CollectiveWatchdog, QuietWhileEveryCollectiveEndsInTime) {
  Fired f;
  CollectiveWatchdog w(0.15, record(f));
  // 0.5 s of collectives of 0.05 s each, back to back and with idle gaps: longer than the
  // timeout in all, never in one.
  for (int i = 1; i <= 10; ++i) {
    w.begin("broadcast", i);
    std::this_thread::sleep_for(50ms);
    w.end();
    if (i % 3 == 0) std::this_thread::sleep_for(200ms);  // idle longer than the timeout
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(f.count, 0);
}

TEST(CollectiveWatchdog, TimesEachCollectiveFromItsOwnStart) {
  Fired f;
  CollectiveWatchdog w(0.3, record(f));
  w.begin("all-reduce", 1);
  std::this_thread::sleep_for(200ms);
  w.end();
  w.begin("barrier", 2);  // starts 0.2 s into the first one's window: fires at 0.5 s, not 0.3 s
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(f.count, 0);
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(f.count, 1);
  EXPECT_EQ(f.what, "barrier");
  EXPECT_EQ(f.sequence, 2);
  w.end();
}

// A process stopped past its deadline and then continued (Open MPI continues a stopped rank to
// kill it) times its collective again instead of firing at once: the stop was its own, not the
// other ranks' fault. It still fires if the collective then stays stuck for the timeout.
TEST(CollectiveWatchdog, AStoppedAndContinuedProcessTimesItsCollectiveAgain) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    CollectiveWatchdog w(0.5,
                         [&](const CollectiveWatchdog::Stalled&) { (void)!write(fds[1], "F", 1); });
    w.begin("all-reduce", 1);
    std::this_thread::sleep_for(10s);
    _exit(0);
  }
  close(fds[1]);
  const auto fired_within = [&](std::chrono::milliseconds wait) {
    pollfd p{fds[0], POLLIN, 0};
    return poll(&p, 1, static_cast<int>(wait.count())) == 1;
  };
  std::this_thread::sleep_for(100ms);
  kill(child, SIGSTOP);  // past the 0.5 s deadline by more than a second
  std::this_thread::sleep_for(1800ms);
  kill(child, SIGCONT);
  EXPECT_FALSE(fired_within(250ms)) << "fired at once after being continued";
  EXPECT_TRUE(fired_within(2000ms)) << "never fired for a collective still stuck";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(fds[0]);
}

}  // namespace
}  // namespace ferry
