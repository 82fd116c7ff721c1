// A job sharing its device: its curve is the planner's (the lower bound is the smallest budget
// the policy meets, the ladder falls from it to the peak), admission waits for the lower bound
// to fit, printing once who holds the device, gives up after memory.share_wait with exit code 2's
// error, and the lease leaves the ledger when the job ends; it registers its curve a granule
// higher and plans a granule below its grant (Note [A shared budget in held bytes]).
#include "trainer/share/lease.h"

#include <stdlib.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "common/shm_names.h"
#include "trainer/plan/planning.h"

namespace ferry {
namespace {

Config resnet_config() {
  Config c = parse_config_text(
      "model: {name: resnet18_cifar, classes: 10, input: [3, 32, 32]}\n"
      "data: {source: synthetic, batch_size: 32}\n"
      "device: {backend: cpu, memory: 1GiB}\n"
      "memory: {policy: auto, measure: false, share: true}\n",
      {});
  c.run.dir = "runs/share";
  return c;
}

TEST(MemoryShare, TheCurveRunsFromTheSmallestBudgetThePolicyMeetsToThePeak) {
  const Config c = resnet_config();
  const ShareCurve curve = share_curve(c, 6);
  OfflinePlanner planner(c);
  const MemoryPlan alone = planner.plan_at(MemoryPolicy::kAuto, 32, 0);
  EXPECT_EQ(curve.peak, alone.peak_bytes());
  EXPECT_LT(curve.lower, curve.peak);
  EXPECT_GE(curve.lower, alone.lower_bound);
  EXPECT_NO_THROW(planner.plan_at(MemoryPolicy::kAuto, 32, curve.lower));
  const uint64_t tolerance = (curve.peak - alone.lower_bound) / 256 + 1;
  if (curve.lower > alone.lower_bound + tolerance)
    EXPECT_THROW(planner.plan_at(MemoryPolicy::kAuto, 32, curve.lower - tolerance), ConfigError);
  ASSERT_EQ(curve.ladder.size(), 6u);
  EXPECT_EQ(curve.ladder.front().budget, curve.lower);
  EXPECT_EQ(curve.ladder.back().budget, curve.peak);
  EXPECT_DOUBLE_EQ(curve.ladder.back().step_s, alone.prediction.step_seconds);
  EXPECT_GT(curve.ladder.front().step_s, curve.ladder.back().step_s);  // offloads cost time
  for (size_t k = 1; k < curve.ladder.size(); ++k)
    EXPECT_GT(curve.ladder[k].budget, curve.ladder[k - 1].budget);
  // memory.budget caps the peak.
  Config capped = c;
  capped.memory.budget = (curve.lower + curve.peak) / 2;
  const ShareCurve low = share_curve(capped, 4);
  EXPECT_EQ(low.peak, capped.memory.budget);
  EXPECT_NEAR(double(low.lower), double(curve.lower), double(tolerance));  // searched again
}

class MemoryShareLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = "/ferry-jobs-sessiontest-" + shm_names::job_token();
    setenv("FERRY_JOB_LEDGER", name_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("FERRY_JOB_LEDGER");
    JobLedger::unlink(name_);
  }
  std::string name_;
};

ShareCurve small_curve() { return {100 << 20, 200 << 20, {{100 << 20, 2.0}, {200 << 20, 1.0}}}; }

// A CUDA rank's GPU is keyed by its bus id where placement found it, so two jobs that number the
// GPUs differently meet on it; otherwise (and for the CPU's emulated devices) by local rank.
TEST(MemoryShare, ACudaRanksDeviceIsItsGpusBusIdWhereKnown) {
  Config c = default_config();
  RankInfo ranks;
  ranks.local_rank = 1;
  const std::optional<PciAddress> gpu = PciAddress::parse("0000:3b:00.0");
  ASSERT_TRUE(gpu);
  EXPECT_EQ(share_device_key(c, ranks, gpu), "cpu:1");
  c.device.backend = Backend::kCuda;
  EXPECT_EQ(share_device_key(c, ranks, gpu), "cuda:0000:3b:00.0");
  EXPECT_EQ(share_device_key(c, ranks), "cuda:1");
}

TEST(MemoryShare, AJobRegistersItsCurveInHeldBytes) {
  Config c = resnet_config();
  EXPECT_EQ(share_reserve(c), 2u << 20);
  c.device.backend = Backend::kCuda;
  EXPECT_EQ(share_reserve(c), 2u << 20);
  c.memory.share = false;
  EXPECT_EQ(share_reserve(c), 0u);
  const ShareCurve held = held_curve(small_curve(), 3);
  EXPECT_EQ(held.lower, (100u << 20) + 3);
  EXPECT_EQ(held.peak, (200u << 20) + 3);
  ASSERT_EQ(held.ladder.size(), 2u);
  EXPECT_EQ(held.ladder[0].budget, (100u << 20) + 3);
  EXPECT_EQ(held.ladder[1].budget, (200u << 20) + 3);
  EXPECT_EQ(held.ladder[1].step_s, 1.0);
}

TEST_F(MemoryShareLeaseTest, AJobWaitsForItsLowerBoundThenGivesUpWithOneClearError) {
  Config c = resnet_config();
  c.device.memory = 256 << 20;
  c.memory.share_wait = 0.3;
  // Another job holds 200 MiB of the 256 and will not shrink.
  auto ledger = JobLedger::attach();
  JobRequest other;
  other.device = "cpu:0";
  other.capacity = c.device.memory;
  other.config = "runs/other/config.yaml";
  other.curve.lower = other.curve.peak = 200 << 20;
  other.curve.ladder = {{other.curve.lower, 1.0}};
  other.objective = ShareObjective::kFair;
  const JobGrant held = ledger->join(other);
  ledger->report(held.id, 200 << 20);
  std::vector<std::string> said;
  const auto start = std::chrono::steady_clock::now();
  try {
    MemoryShareLease lease(c, RankInfo{}, small_curve(),
                           [&](const std::string& s) { said.push_back(s); });
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("memory.share_wait: waited 0.3 s and cpu:0 still cannot "
                                         "hold this job's lower bound 102.00 MiB"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(exit_code_for(e), 2);
  }
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.29);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[0],
            "memory.share: cpu:0 is divided for fair (the memory.share_objective of its first "
            "job), not throughput");
  said.erase(said.begin());
  EXPECT_NE(said[0].find("held by job 1 (pid"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("runs/other/config.yaml): share 200.00 MiB, granted 200.00 MiB, held "
                         "200.00 MiB"),
            std::string::npos)
      << said[0];
  // The job that gave up left nothing behind.
  ASSERT_EQ(ledger->snapshot().at(0).jobs.size(), 1u);

  // Admitted as soon as the other leaves.
  c.memory.share_wait = 10;
  std::thread leaves([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ledger->leave(held.id);
  });
  said.clear();
  {
    MemoryShareLease lease(c, RankInfo{}, small_curve(),
                           [&](const std::string& s) { said.push_back(s); });
    // Note [A shared budget in held bytes]: registered a granule higher, planned a granule below
    // the grant; until the first step it reports its whole grant as held.
    EXPECT_EQ(lease.reserve(), 2u << 20);
    EXPECT_EQ(lease.budget(), 200u << 20);
    ASSERT_EQ(said.size(), 3u);  // the objective, the wait, the budget
    EXPECT_NE(said[2].find("memory.share: budget 200.00 MiB on cpu:0"), std::string::npos)
        << said[2];
    EXPECT_NE(said[2].find("2.00 MiB below the grant"), std::string::npos) << said[2];
    const auto gpus = ledger->snapshot();
    ASSERT_EQ(gpus.size(), 1u);
    ASSERT_EQ(gpus[0].jobs.size(), 1u);
    EXPECT_EQ(gpus[0].jobs[0].curve.lower, 102u << 20);
    EXPECT_EQ(gpus[0].jobs[0].curve.peak, 202u << 20);
    ASSERT_EQ(gpus[0].jobs[0].curve.ladder.size(), 2u);
    EXPECT_EQ(gpus[0].jobs[0].curve.ladder[0].budget, 102u << 20);
    EXPECT_EQ(gpus[0].jobs[0].granted, 202u << 20);
    EXPECT_EQ(gpus[0].jobs[0].held, 202u << 20);
    EXPECT_EQ(gpus[0].jobs[0].run_dir, "runs/share");
  }
  leaves.join();
  EXPECT_TRUE(ledger->snapshot().empty());  // the lease left with the job
}

TEST_F(MemoryShareLeaseTest, ALowerBoundAboveTheWholeDeviceIsAnErrorAtOnce) {
  Config c = resnet_config();
  c.device.memory = 64 << 20;
  c.memory.share_wait = 100;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(MemoryShareLease(c, RankInfo{}, small_curve(), [](const std::string&) {}),
               ConfigError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
  EXPECT_TRUE(JobLedger::attach()->snapshot().empty());
}

}  // namespace
}  // namespace ferry
