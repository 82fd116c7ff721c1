// The node-wide job ledger: one block however many jobs attach at once, the hand-over (a shrinking
// job confirms before a growing one may use the memory), admission in arrival order, the sum of
// grants and of held bytes never above the capacity while jobs churn, and a job killed with
// kill -9 (even while it holds the ledger's mutex) reaped by the next job that looks.
#include "jobs/job_ledger.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "common/shm_names.h"

namespace ferry {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

JobRequest request(std::vector<SharePoint> ladder, uint64_t capacity = 300,
                   const std::string& device = "cpu:0") {
  JobRequest r;
  r.device = device;
  r.capacity = capacity;
  r.config = "configs/quickstart.yaml";
  r.run_dir = "runs/a";
  r.curve.lower = ladder.front().budget;
  r.curve.peak = ladder.back().budget;
  r.curve.ladder = std::move(ladder);
  return r;
}

class JobLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override { name_ = "/ferry-jobs-test-" + shm_names::job_token(); }
  void TearDown() override { JobLedger::unlink(name_); }
  std::string name_;
};

uint64_t sum_granted(const LedgerGpu& g) {
  uint64_t s = 0;
  for (const LedgerJob& j : g.jobs) s += j.granted;
  return s;
}

TEST_F(JobLedgerTest, TheFirstJobCreatesTheLedgerAndEveryOtherAttachesIt) {
  EXPECT_EQ(JobLedger::open_existing(name_), nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> joined{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto ledger = JobLedger::attach(name_);
      JobRequest r = request({{10, 1.0}}, 1000);
      r.rank = i;
      ledger->join(r);
      ++joined;
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(joined.load(), 8);
  auto ledger = JobLedger::open_existing(name_);
  ASSERT_NE(ledger, nullptr);
  const auto gpus = ledger->snapshot();
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].jobs.size(), 8u);  // one block: nobody's join was lost to a second one
  EXPECT_EQ(gpus[0].device, "cpu:0");
  EXPECT_EQ(gpus[0].jobs[0].config, "configs/quickstart.yaml");
  EXPECT_EQ(gpus[0].jobs[0].pid, getpid());
  // The private creation names are gone.
  EXPECT_TRUE(shm_names::remove_stale_blocks(name_.substr(1) + "-new").empty());
  EXPECT_EQ(shm_names::find_block(name_.substr(1) + "-new", ""), "");
  EXPECT_NE(JobLedger::default_name().find("/ferry-jobs-v"), std::string::npos);
}

TEST_F(JobLedgerTest, AShrinkingJobConfirmsBeforeAGrowingJobMayUseTheMemory) {
  auto ledger = JobLedger::attach(name_);
  const JobGrant a0 = ledger->join(request({{100, 3.0}, {200, 2.0}, {300, 1.0}}));
  EXPECT_EQ(a0.share, 300u);
  EXPECT_EQ(a0.granted, 300u);
  EXPECT_FALSE(a0.waiting);
  ledger->report(a0.id, 300, 1.0);
  // B arrives: throughput gives A 100 (1/3 of its speed) and B its peak 200 (full speed).
  JobRequest rb = request({{100, 2.0}, {200, 1.0}}, 400);  // another capacity: the first holds
  rb.run_dir = "runs/b";
  const JobGrant b0 = ledger->join(rb);
  EXPECT_EQ(b0.capacity, 300u);
  EXPECT_EQ(b0.share, 200u);
  EXPECT_EQ(b0.granted, 0u);  // A still holds 300
  EXPECT_TRUE(b0.waiting);
  const JobGrant a1 = ledger->poll(a0.id);
  EXPECT_EQ(a1.share, 100u);
  EXPECT_EQ(a1.granted, 300u);
  EXPECT_NE(a1.generation, a0.generation);
  EXPECT_THROW(ledger->confirm(a0.id, 150), Error);  // it still holds more than its share
  EXPECT_THROW(ledger->report(b0.id, 1), Error);     // B may hold nothing yet
  EXPECT_EQ(ledger->poll(b0.id).granted, 0u);
  ledger->report(a0.id, 100);  // A re-planned for 100 and freed the rest...
  EXPECT_EQ(ledger->poll(b0.id).granted, 0u);
  const JobGrant a2 = ledger->confirm(a0.id, 100);  // ...and says so
  EXPECT_EQ(a2.granted, 100u);
  const JobGrant b1 = ledger->wait_change(b0.id, b0.generation, 1.0);
  EXPECT_EQ(b1.granted, 200u);
  EXPECT_FALSE(b1.waiting);
  ledger->report(b0.id, 200, 1.1);
  auto gpus = ledger->snapshot();
  ASSERT_EQ(gpus[0].jobs.size(), 2u);
  EXPECT_EQ(gpus[0].jobs[1].run_dir, "runs/b");
  EXPECT_DOUBLE_EQ(gpus[0].jobs[1].measured_step_s, 1.1);
  EXPECT_DOUBLE_EQ(gpus[0].jobs[0].predicted_step_s, 3.0);
  EXPECT_EQ(gpus[0].peak_held, 300u);
  // B leaves: A grows back, at once (nobody has to shrink).
  ledger->leave(b0.id);
  EXPECT_TRUE(ledger->poll(b0.id).gone);
  EXPECT_EQ(ledger->poll(a0.id).granted, 300u);
  ledger->leave(a0.id);
  EXPECT_TRUE(ledger->snapshot().empty());
  // A newcomer whose lower bound fits in what is free starts there, and grows once the other
  // confirms its smaller share.
  const JobGrant c0 = ledger->join(request({{100, 2.0}, {200, 1.0}}, 350));
  EXPECT_EQ(c0.granted, 200u);
  const JobGrant d0 = ledger->join(request({{100, 3.0}, {250, 1.0}}, 350));
  EXPECT_EQ(ledger->poll(c0.id).share, 100u);  // throughput: d's 250 buys more
  EXPECT_EQ(d0.share, 250u);
  EXPECT_EQ(d0.granted, 150u);  // what c leaves free
  EXPECT_FALSE(d0.waiting);
  ledger->confirm(c0.id, 100);
  EXPECT_EQ(ledger->poll(d0.id).granted, 250u);
  ledger->leave(c0.id);
  ledger->leave(d0.id);
  // The GPU's entry went with its last job: the next job's capacity holds.
  EXPECT_EQ(ledger->join(request({{100, 1.0}}, 500)).capacity, 500u);
}

TEST_F(JobLedgerTest, TheHeldRecordFollowsEveryChangeAndEachJobHearsWhyItsShareChanged) {
  auto ledger = JobLedger::attach(name_);
  const std::string me = " (pid " + std::to_string(getpid()) + ")";
  const JobGrant a = ledger->join(request({{100, 3.0}, {200, 2.0}, {300, 1.0}}));
  ledger->report(a.id, 250, 1.0);
  ledger->report(a.id, 250, 1.1);  // nothing held changed: no entry
  const JobGrant b = ledger->join(request({{100, 2.0}, {200, 1.0}}));
  EXPECT_EQ(ledger->poll(a.id).reason, "job " + std::to_string(b.id) + me + " arrived");
  ledger->confirm(a.id, 100);
  EXPECT_EQ(ledger->poll(b.id).reason,
            "job " + std::to_string(a.id) + me + " confirmed its smaller share");
  ledger->report(b.id, 180);
  // B re-registers a flatter curve: A (step 3 s at 100) buys more with the bytes now.
  ledger->update_curve(b.id, {100, 200, {{100, 1.1}, {200, 1.0}}}, "drifted");
  EXPECT_EQ(ledger->poll(b.id).share, 100u);
  EXPECT_EQ(ledger->poll(b.id).reason,
            "job " + std::to_string(b.id) + me + " re-registered its curve (drifted)");
  ledger->leave(b.id);
  EXPECT_EQ(ledger->poll(a.id).reason, "job " + std::to_string(b.id) + me + " left");
  ledger->leave(a.id);
  // (jobs, held, granted) after each change, in order, numbered from 1 without a gap.
  const std::vector<HeldRecord> h = ledger->history();
  std::vector<std::tuple<int, uint64_t, uint64_t>> seen;
  for (size_t k = 0; k < h.size(); ++k) {
    EXPECT_EQ(h[k].seq, k + 1);
    EXPECT_EQ(h[k].device, "cpu:0");
    EXPECT_EQ(h[k].capacity, 300u);
    EXPECT_LE(h[k].held, h[k].capacity);
    EXPECT_LE(h[k].granted, h[k].capacity);
    if (k > 0) {
      EXPECT_GE(h[k].t, h[k - 1].t);
    }
    seen.emplace_back(h[k].jobs, h[k].held, h[k].granted);
  }
  const std::vector<std::tuple<int, uint64_t, uint64_t>> expected{
      {1, 0, 300},    // A joins
      {1, 250, 300},  // A holds 250
      {2, 250, 300},  // B joins: A keeps 300 until it confirms, B gets nothing yet
      {2, 100, 100},  // A confirms 100 (before the others are served)
      {2, 100, 300},  // B granted 200
      {2, 280, 300},  // B holds 180
      {2, 280, 300},  // B's share falls to 100, its grant stays until it confirms: no change
      {1, 100, 300},  // B leaves: A's grant rises at once (nobody has to shrink)
      {0, 0, 0}};     // A leaves
  std::vector<std::tuple<int, uint64_t, uint64_t>> want;
  for (const auto& e : expected)
    if (want.empty() || want.back() != e) want.push_back(e);
  EXPECT_EQ(seen, want);
  EXPECT_EQ(h[1].job, a.id);
  EXPECT_EQ(h[1].job_held, 250u);
  EXPECT_EQ(ledger->history(h.size() - 1).size(), 1u);  // after a number
  EXPECT_TRUE(ledger->history(h.size()).empty());
  // The ring keeps the last kHistory entries.
  const JobGrant c = ledger->join(request({{10, 1.0}}, 300));
  for (int k = 0; k < JobLedger::kHistory + 10; ++k) ledger->report(c.id, k % 2 ? 10 : 5);
  const std::vector<HeldRecord> ring = ledger->history();
  ASSERT_EQ(ring.size(), size_t(JobLedger::kHistory));
  EXPECT_EQ(ring.back().seq, ring.front().seq + JobLedger::kHistory - 1);
  EXPECT_GT(ring.front().seq, 1u);
}

TEST_F(JobLedgerTest, AJobWhoseLowerBoundDoesNotFitWaitsInArrivalOrder) {
  auto ledger = JobLedger::attach(name_);
  const JobGrant a = ledger->join(request({{100, 1.0}}, 250));
  const JobGrant b = ledger->join(request({{100, 2.0}, {140, 1.0}}, 250));
  const JobGrant c = ledger->join(request({{100, 1.0}}, 250));
  const JobGrant d = ledger->join(request({{30, 1.0}}, 250));
  EXPECT_FALSE(a.waiting);
  EXPECT_FALSE(ledger->poll(b.id).waiting);
  EXPECT_EQ(ledger->poll(b.id).granted, 140u);
  EXPECT_TRUE(c.waiting);
  EXPECT_TRUE(d.waiting);  // behind c
  const double start = now_s();
  EXPECT_TRUE(ledger->wait_admitted(c.id, 0.2).waiting);
  EXPECT_GE(now_s() - start, 0.19);
  ledger->leave(a.id);
  // b's share falls to 100 for c and d; c fits beside b's 140 already, d waits for b's confirm.
  EXPECT_FALSE(ledger->poll(c.id).waiting);
  EXPECT_TRUE(ledger->poll(d.id).waiting);
  EXPECT_EQ(ledger->poll(b.id).share, 100u);
  EXPECT_EQ(ledger->poll(b.id).granted, 140u);
  ledger->confirm(b.id, 90);
  EXPECT_FALSE(ledger->wait_admitted(d.id, 1.0).waiting);
  EXPECT_EQ(ledger->poll(d.id).granted, 30u);
  for (const LedgerGpu& g : ledger->snapshot()) EXPECT_LE(sum_granted(g), g.capacity);
}

TEST_F(JobLedgerTest, MalformedLaddersAreRefusedAndLongOnesThinned) {
  auto ledger = JobLedger::attach(name_);
  JobRequest bad = request({{100, 1.0}, {200, 0.5}});
  bad.curve.peak = 300;
  EXPECT_THROW(ledger->join(bad), ConfigError);
  std::vector<SharePoint> longer;
  for (int k = 0; k < 100; ++k) longer.push_back({uint64_t(100 + k), 2.0 - k / 100.0});
  const JobGrant g = ledger->join(request(longer, 1000));
  EXPECT_EQ(g.share, 199u);
  const auto gpus = ledger->snapshot();
  ASSERT_EQ(gpus[0].jobs[0].curve.ladder.size(), size_t(JobLedger::kMaxLadder));
  EXPECT_EQ(gpus[0].jobs[0].curve.ladder.front().budget, 100u);
  EXPECT_EQ(gpus[0].jobs[0].curve.ladder.back().budget, 199u);
}

// Four jobs as threads on two GPUs join, hold, shrink and leave at random; a monitor checks the
// ledger's invariants all along.
TEST_F(JobLedgerTest, GrantsAndHeldBytesNeverExceedTheCapacityWhileJobsChurn) {
  auto monitor_ledger = JobLedger::attach(name_);
  std::atomic<bool> stop{false};
  std::atomic<int> violations{0}, changes{0};
  std::vector<std::thread> jobs;
  for (int t = 0; t < 4; ++t) {
    jobs.emplace_back([&, t] {
      auto ledger = JobLedger::attach(name_);
      std::mt19937 rng(t);
      const std::string device = t % 2 ? "cpu:1" : "cpu:0";
      while (!stop) {
        std::vector<SharePoint> ladder;
        uint64_t b = 50 + rng() % 100;
        double step = 1 + rng() % 5;
        for (int k = 0; k < 4; ++k, b += 10 + rng() % 60, step *= 0.8) ladder.push_back({b, step});
        JobGrant g = ledger->join(request(ladder, 400, device));
        uint64_t held = 0;
        for (int round = 0; round < 30 && !stop; ++round) {
          g = ledger->poll(g.id);
          if (g.share < g.granted || held > g.share) {
            held = std::min(held, g.share);
            g = ledger->confirm(g.id, held);
            ++changes;
          } else if (!g.waiting) {
            held = g.granted - rng() % (g.granted / 4 + 1);
            g = ledger->report(g.id, held, 1.0);
          }
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
        }
        ledger->leave(g.id);
      }
    });
  }
  const double end = now_s() + 1.5;
  int looks = 0;
  while (now_s() < end) {
    for (const LedgerGpu& g : monitor_ledger->snapshot()) {
      uint64_t held = 0;
      for (const LedgerJob& j : g.jobs) {
        held += j.held;
        if (j.held > j.granted) ++violations;
      }
      if (held > g.capacity || sum_granted(g) > g.capacity || g.peak_held > g.capacity)
        ++violations;
    }
    ++looks;
  }
  stop = true;
  for (auto& t : jobs) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(looks, 100);
  EXPECT_GT(changes.load(), 4);  // shares did shrink and were handed over
  EXPECT_TRUE(monitor_ledger->snapshot().empty());
}

// Reads one byte from `fd` (the child says it is ready).
void await_child(int fd) {
  char c = 0;
  ASSERT_EQ(read(fd, &c, 1), 1);
}

TEST_F(JobLedgerTest, AJobKilledWithSigkillIsReapedAndItsMemoryGoesToTheOthers) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto ledger = JobLedger::attach(name_);
    const JobGrant g = ledger->join(request({{100, 2.0}, {300, 1.0}}));
    ledger->report(g.id, 300);
    (void)!write(ready[1], "x", 1);
    for (;;) pause();
  }
  await_child(ready[0]);
  auto ledger = JobLedger::attach(name_);
  const JobGrant mine = ledger->join(request({{100, 2.0}, {200, 1.0}}));
  EXPECT_EQ(mine.granted, 0u);  // the child holds everything until it confirms, which it never will
  EXPECT_TRUE(mine.waiting);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  const double start = now_s();
  // Not waited for yet: a zombie counts as dead.
  const JobGrant g = ledger->wait_admitted(mine.id, 5.0);
  EXPECT_LT(now_s() - start, 1.0);
  EXPECT_FALSE(g.waiting);
  EXPECT_EQ(g.granted, 200u);
  EXPECT_NE(g.reason.find("(pid " + std::to_string(child) + ") died (reaped)"), std::string::npos)
      << g.reason;
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  const auto gpus = ledger->snapshot();
  ASSERT_EQ(gpus.size(), 1u);
  ASSERT_EQ(gpus[0].jobs.size(), 1u);
  EXPECT_EQ(gpus[0].jobs[0].id, mine.id);
}

// Issue 27, item 10: A (150) set the capacity, B (1000) waited; once A is gone the capacity is
// the earliest live job's, B's, and C (1000) fits beside B.
TEST_F(JobLedgerTest, TheCapacityFollowsTheJobsThatAreAlive) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto ledger = JobLedger::attach(name_);
    const JobGrant g = ledger->join(request({{100, 2.0}, {150, 1.0}}, 150));
    ledger->report(g.id, 150);
    (void)!write(ready[1], "x", 1);
    for (;;) pause();
  }
  await_child(ready[0]);
  auto ledger = JobLedger::attach(name_);
  JobRequest rb = request({{100, 2.0}, {400, 1.0}}, 1000);
  rb.objective = ShareObjective::kFair;
  const JobGrant b0 = ledger->join(rb);
  EXPECT_EQ(b0.capacity, 150u);  // A's, while A lives
  EXPECT_TRUE(b0.waiting);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  const JobGrant b1 = ledger->wait_admitted(b0.id, 5.0);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(b1.waiting);
  EXPECT_EQ(b1.capacity, 1000u);  // B's now: A, which set 150, is gone
  EXPECT_EQ(b1.granted, 400u);
  ASSERT_EQ(ledger->snapshot().size(), 1u);
  EXPECT_EQ(ledger->snapshot()[0].objective, ShareObjective::kFair);  // B's too
  const JobGrant c0 = ledger->join(request({{100, 2.0}, {500, 1.0}}, 1000));
  EXPECT_FALSE(c0.waiting);
  EXPECT_EQ(c0.capacity, 1000u);
  EXPECT_GE(c0.granted, 100u);
  // A job that leaves hands the capacity on too: C's after B.
  ledger->leave(b0.id);
  ledger->leave(c0.id);
  const JobGrant d0 = ledger->join(request({{100, 1.0}}, 300));
  const JobGrant e0 = ledger->join(request({{100, 1.0}}, 700));
  EXPECT_EQ(ledger->poll(e0.id).capacity, 300u);
  ledger->leave(d0.id);
  EXPECT_EQ(ledger->poll(e0.id).capacity, 700u);
}

// When the capacity falls (its job left), no grant grows until the jobs above their new shares
// confirmed and the grants fit again.
TEST_F(JobLedgerTest, AFallingCapacityLetsNoGrantGrowUntilTheGrantsFit) {
  auto ledger = JobLedger::attach(name_);
  const JobGrant a = ledger->join(request({{100, 1.0}}, 1000));
  const JobGrant b = ledger->join(request({{100, 2.0}, {600, 1.0}}, 400));
  EXPECT_EQ(ledger->poll(b.id).granted, 600u);  // within A's 1000
  ledger->report(b.id, 600);
  ledger->leave(a.id);
  const JobGrant b1 = ledger->poll(b.id);
  EXPECT_EQ(b1.capacity, 400u);
  EXPECT_LE(b1.share, 400u);
  EXPECT_EQ(b1.granted, 600u);  // until it confirms
  const JobGrant c = ledger->join(request({{100, 1.0}}, 1000));
  EXPECT_EQ(ledger->poll(c.id).granted, 0u);
  ledger->report(b.id, b1.share);
  ledger->confirm(b.id, b1.share);
  EXPECT_EQ(ledger->poll(b.id).granted + ledger->poll(c.id).granted,
            ledger->poll(b.id).share + ledger->poll(c.id).share);
  EXPECT_LE(ledger->poll(b.id).granted + ledger->poll(c.id).granted, 400u);
}

TEST_F(JobLedgerTest, AJobKilledWhileItHoldsTheMutexLeavesAWorkingLedger) {
  auto ledger = JobLedger::attach(name_);
  const JobGrant mine = ledger->join(request({{100, 2.0}, {200, 1.0}}));
  for (int trial = 0; trial < 5; ++trial) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto l = JobLedger::attach(name_);
      const JobGrant g = l->join(request({{50, 2.0}, {100, 1.0}}));
      (void)!write(ready[1], "x", 1);
      for (uint64_t i = 0;; ++i) {  // in and out of the mutex, until killed in it or not
        const JobGrant p = l->poll(g.id);
        if (p.share < p.granted) l->confirm(g.id, 0);
        l->report(g.id, 0, double(i % 7));
      }
    }
    await_child(ready[0]);
    close(ready[0]);
    close(ready[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 10 * trial));
    ASSERT_EQ(kill(child, SIGKILL), 0);
    waitpid(child, nullptr, 0);
    const double start = now_s();
    const auto gpus = ledger->snapshot();
    EXPECT_LT(now_s() - start, 1.0);
    ASSERT_EQ(gpus.size(), 1u);
    ASSERT_EQ(gpus[0].jobs.size(), 1u) << "trial " << trial;
    EXPECT_EQ(ledger->poll(mine.id).share, 200u);
  }
  EXPECT_EQ(ledger->poll(mine.id).granted, 200u);
}

}  // namespace
}  // namespace ferry
