// Shapes no plan fits (memory.oversize, issue 18) through the trainer binary: resnet18_cifar at
// sides 24, 32 and 48 under memory.policy none with a budget side 48 exceeds. By default the run
// ends with one error naming the shape and the smallest budget, before the step that would
// train it; with skip its batches are dropped (one warning, counted in the log, metrics.jsonl
// and summary.json) and every other batch trains in the order drawn, on every rank alike.
#include <algorithm>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/trainer/integration/run_metrics.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }

// run.seed 1 draws side 32 first, then 48 (checked against the reference run below).
std::string sides(int batch) {
  return " model.name=resnet18_cifar data.batch_size=" + std::to_string(batch) +
         " data.samples=256 'data.scales=[24, 32, 48]' run.seed=1 memory.measure=false "
         "device.memory=1GiB device.threads=1 ";
}

std::string train(const std::string& dir, int steps, int batch, const std::string& more) {
  return trainer() + " train " + quickstart() + " run.dir=" + dir +
         " run.steps=" + std::to_string(steps) +
         " run.log_every=1 checkpoint.every=0 memory.debug_poison=true" + sides(batch) + more;
}

// The budget: side 48's peak under none less a quarter of what it needs above side 32's.
uint64_t budget_below_side_48(int batch) {
  const Exit e =
      run(trainer() + " plan " + quickstart() + sides(batch) + "memory.policy=none --json");
  EXPECT_EQ(e.code, 0) << e.output;
  std::map<int64_t, uint64_t> peak;
  const nlohmann::json plan = nlohmann::json::parse(e.output);
  for (const auto& s : plan["shapes"]) {
    peak[s["side"].get<int64_t>()] = s["peak_bytes"].get<uint64_t>();
  }
  return peak.at(48) - (peak.at(48) - peak.at(32)) / 4;
}

std::vector<int64_t> without_48(const std::vector<int64_t>& sides, size_t n) {
  std::vector<int64_t> out;
  for (int64_t s : sides) {
    if (s != 48 && out.size() < n) out.push_back(s);
  }
  return out;
}

class Oversize : public ::testing::Test {
 protected:
  // The sides a run with unlimited memory draws: what every arm below is checked against (each
  // test its own run: ctest runs them in parallel).
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const std::string dir = scratch("oversize_reference_" + name);
    const Exit e = run(train(dir, kReference, 2, "memory.policy=none"));
    ASSERT_EQ(e.code, 0) << e.output;
    drawn_ = logged_sides(dir + "/rank0.log");
    ASSERT_EQ(drawn_.size(), static_cast<size_t>(kReference));
  }
  static constexpr int kReference = 24;
  std::vector<int64_t> drawn_;
};

TEST_F(Oversize, ByDefaultTheRunEndsBeforeTheStepNamingTheShapeAndTheSmallestBudget) {
  const size_t first_48 =
      static_cast<size_t>(std::find(drawn_.begin(), drawn_.end(), 48) - drawn_.begin());
  ASSERT_GE(first_48, 1u) << "run.seed 1 draws another side first";
  const std::string dir = scratch("oversize_error");
  const Exit e = run(train(
      dir, 12, 2, "memory.policy=none memory.budget=" + std::to_string(budget_below_side_48(2))));
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("error: input (2, 3, 48, 48): memory.policy none plans a peak of"),
            std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("hint: use memory.policy=auto, raise memory.budget to "),
            std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("memory.oversize=skip"), std::string::npos) << e.output;
  // Not one step at side 48; the steps before it may have run.
  const std::vector<int64_t> trained = logged_sides(dir + "/rank0.log");
  EXPECT_LE(trained.size(), first_48) << e.output;
  EXPECT_EQ(std::count(trained.begin(), trained.end(), 48), 0) << e.output;
}

TEST_F(Oversize, SkipDropsThoseBatchesCountedAndTrainsTheOthersInOrder) {
  constexpr int kSteps = 10;
  const std::vector<int64_t> expected = without_48(drawn_, kSteps);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps)) << "the reference drew enough";
  // Batches the skip run consumed: up to the kSteps-th that is not 48.
  size_t consumed = 0, kept = 0;
  while (kept < static_cast<size_t>(kSteps)) kept += drawn_[consumed++] != 48;
  const int64_t skipped = std::count(drawn_.begin(), drawn_.begin() + consumed, 48);
  ASSERT_GT(skipped, 0);

  const uint64_t budget = budget_below_side_48(2);
  const std::string dir = scratch("oversize_skip");
  const Exit e =
      run(train(dir, kSteps, 2,
                "memory.policy=none memory.oversize=skip memory.budget=" + std::to_string(budget)));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(logged_sides(dir + "/rank0.log"), expected);
  EXPECT_EQ(count(e.output, "\nskip     input (2, 3, 48, 48): memory.policy none plans a peak"), 1u)
      << e.output;
  EXPECT_NE(
      e.output.find(std::to_string(skipped) + " batch" + (skipped == 1 ? "" : "es") +
                    " dropped (memory.oversize: skip): (2, 3, 48, 48) x" + std::to_string(skipped)),
      std::string::npos)
      << e.output;
  const nlohmann::json s = read_json(dir + "/summary.json");
  EXPECT_EQ(s["steps"].get<int64_t>(), kSteps);
  EXPECT_EQ(s["oversize_skipped"].get<int64_t>(), skipped);
  ASSERT_EQ(s["skipped_shapes"].size(), 1u);
  EXPECT_EQ(s["skipped_shapes"][0]["shape"].get<std::vector<int64_t>>(),
            (std::vector<int64_t>{2, 3, 48, 48}));
  EXPECT_EQ(s["skipped_shapes"][0]["batches"].get<int64_t>(), skipped);
  for (const auto& shape : s["shapes"]) {
    EXPECT_NE(shape["shape"][2].get<int64_t>(), 48);
    EXPECT_EQ(shape["measured_peak_bytes"], shape["planned_peak_bytes"]);
    EXPECT_LE(shape["planned_peak_bytes"].get<uint64_t>(), budget);
  }
  EXPECT_LE(s["device_peak_bytes"].get<uint64_t>(), budget);
  // metrics.jsonl's last line has the count so far.
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  EXPECT_EQ(nlohmann::json::parse(last)["oversize_skipped"].get<int64_t>(), skipped);
}

TEST_F(Oversize, SkipDropsTheSameBatchesOnEveryRank) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  constexpr int kSteps = 8;
  // Two ranks of batch 1 draw the sides one rank of batch 2 draws (the global batch is the same).
  const std::string dir = scratch("oversize_two_ranks");
  const Exit e = run(mpirun(2) + train(dir, kSteps, 1,
                                       "memory.policy=none memory.oversize=skip memory.budget=" +
                                           std::to_string(budget_below_side_48(1))));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::vector<int64_t> expected = without_48(drawn_, kSteps);
  EXPECT_EQ(logged_sides(dir + "/rank0.log"), expected);
  EXPECT_EQ(logged_sides(dir + "/rank1.log"), expected);
  EXPECT_GT(read_json(dir + "/summary.json")["oversize_skipped"].get<int64_t>(), 0);
}

// Note [Batches too large to train] (trainer/data/loader.cc): a side whose input alone exceeds
// the budget is decided before anything is allocated or generated for it. The oversize error
// names the shape (not the pinned host pool), and under skip the run costs what the sides that
// train cost: 8192-pixel batches (24 GiB each) within a 64 MiB pinned host pool.
TEST(OversizeInput, ASideLargerThanTheBudgetIsNeitherAllocatedNorGenerated) {
  const std::string dir = scratch("oversize_input");
  const std::string base = trainer() + " train " + quickstart() + " run.dir=" + dir +
                           " run.overwrite=true model.name=resnet18_cifar memory.measure=false "
                           "device.threads=1 run.steps=3 checkpoint.every=0 ";
  Exit e = run(base + "data.scales=[16384]");
  expect_user_error(e, "input (32, 3, 16384, 16384): memory.budget");
  EXPECT_NE(e.output.find("memory.oversize=skip"), std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("pinned"), std::string::npos) << e.output;
  expect_user_error(run(base + "data.scales=[16384] memory.oversize=skip"),
                    "memory.oversize skip: no input shape fits memory.budget");
  e = run(base + "'data.scales=[16, 8192]' memory.oversize=skip memory.host_limit=64MiB");
  ASSERT_EQ(e.code, 0) << e.output;
  const nlohmann::json summary = read_json(dir + "/summary.json");
  EXPECT_EQ(summary["steps"], 3);
  ASSERT_EQ(summary["skipped_shapes"].size(), 1u) << summary.dump();
  EXPECT_EQ(summary["skipped_shapes"][0]["shape"], nlohmann::json::parse("[32, 3, 8192, 8192]"));
  EXPECT_GT(summary["oversize_skipped"].get<int64_t>(), 0);
}

// The peak resident memory (KiB) of `command`, measured by a Python wrapper; -1 without it.
int64_t peak_rss_kib(const std::string& command) {
  const Exit e =
      run("/usr/bin/python3 -c 'import resource, subprocess, sys; "
          "r = subprocess.run(sys.argv[1], shell=True, stdout=subprocess.DEVNULL, "
          "stderr=subprocess.DEVNULL); "
          "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if "
          "r.returncode == 0 else -1)' \"" +
          command + "\"");
  return e.code == 0 ? std::stoll(e.output) : -1;
}

// A side the planner refuses although its input fits the budget (512 pixels: a 96 MiB input,
// 10 GiB of activations) is planned before the loader starts under skip, and costs no memory:
// the run peaks as the 16-pixel side alone does (before: about 200 MB more, its batches drawn).
TEST(OversizeInput, ASideThePlannerRefusesCostsNoMemoryUnderSkip) {
  if (std::system("test -x /usr/bin/python3") != 0) GTEST_SKIP() << "needs /usr/bin/python3";
  const std::string dir = scratch("oversize_planned");
  const std::string base = trainer() + " train " + quickstart() + " run.dir=" + dir +
                           " run.overwrite=true model.name=resnet18_cifar memory.measure=false "
                           "device.threads=1 run.steps=3 checkpoint.every=0 memory.oversize=skip ";
  const int64_t alone = peak_rss_kib(base + "data.scales=[16]");
  const int64_t with_512 = peak_rss_kib(base + "data.scales=[16,512]");
  ASSERT_GT(alone, 0);
  ASSERT_GT(with_512, 0);
  EXPECT_LT(with_512, alone + 48 * 1024) << "KiB: [16] " << alone << ", [16, 512] " << with_512;
  EXPECT_EQ(read_json(dir + "/summary.json")["skipped_shapes"][0]["shape"],
            nlohmann::json::parse("[32, 3, 512, 512]"));
}

}  // namespace
}  // namespace ferry::testing
