// Multi-scale training (data.scales, issue 18) through the trainer binary: resnet18_cifar on
// synthetic images at sides 24-48 under a budget the largest side cannot meet without moving
// activations, in poison mode. For every shape the run saw, the measured device peak equals the
// planned one and is within the budget; the losses are bitwise those of memory.policy none with
// unlimited memory; at most one step waited for its plan; so with memory.per_shape false (one
// static plan: side 48's decisions at every side). Under mpirun -np 2 both ranks train
// every step at the same side (the one a single rank draws). Bad data.scales are one error line
// naming the key, exit 2.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "tests/trainer/integration/run_metrics.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }

std::string multi_scale(const std::string& dir, int steps, const std::string& more = "") {
  return trainer() + " train " + quickstart() + " run.dir=" + dir +
         " run.steps=" + std::to_string(steps) +
         " run.log_every=1 model.name=resnet18_cifar data.batch_size=2 data.samples=256 "
         "'data.scales=[24, 32, 40, 48]' optim.schedule=constant optim.warmup_steps=0 "
         "optim.lr=0.01 checkpoint.every=0 memory.measure=false memory.debug_poison=true "
         "device.memory=1GiB device.threads=1 " +
         more;
}

TEST(MultiScale, PerShapePlansTrainBitwiseLikeUnlimitedNoneWithinTheBudget) {
  constexpr int kSteps = 12;
  const std::string none_dir = scratch("multi_scale_none");
  NoneReference none;
  ASSERT_NO_FATAL_FAILURE(run_none_reference(multi_scale(none_dir, kSteps, "memory.policy=none"),
                                             none_dir, kSteps, 2, none));
  ASSERT_EQ(none.peaks.size(), 4u) << "12 steps drew every side:\n" << none.output;
  // Below what side 48 needs with everything resident, above what side 24 needs.
  const uint64_t budget = budget_between(none.peaks);

  struct Variant {
    std::string name, args;
  };
  for (const Variant& v :
       {Variant{"auto", ""},
        // The planner believes copies are slow: it rebuilds instead (recompute is the default).
        Variant{"auto_recompute", "memory.link_gbps=0.001"},
        // Mimose's static baseline: side 48's decisions for every side.
        Variant{"static", "memory.per_shape=false"}}) {
    SCOPED_TRACE(v.name);
    const std::string dir = scratch("multi_scale_" + v.name);
    BudgetedRun r;
    ASSERT_NO_FATAL_FAILURE(expect_bitwise_like_none(
        multi_scale(dir, kSteps,
                    "memory.policy=auto memory.budget=" + std::to_string(budget) + " " + v.args),
        dir, none, budget, r));
    const nlohmann::json& s = r.summary;
    for (const auto& shape : s["shapes"]) {
      SCOPED_TRACE(shape["shape"].dump());
      EXPECT_GT(shape["steps"].get<int64_t>(), 0);
      EXPECT_GT(shape["predicted_step_s"].get<double>(), 0);
    }
    if (v.name == "auto_recompute") {
      EXPECT_GT(r.given_up.rebuilt, 0);
    }
    // Side 24 fits with everything resident: a plan of its own moves nothing, the static plan
    // moves (or rebuilds) what side 48's does.
    for (const auto& shape : s["shapes"]) {
      if (shape["shape"][2] != 24) continue;
      const double paid =
          shape["offload_bytes"].get<double>() + shape["recompute_flops"].get<double>();
      if (v.name == "static") {
        EXPECT_GT(paid, 0) << "side 24 under the static plan";
      } else {
        EXPECT_EQ(paid, 0) << "side 24 under its own plan";
      }
    }
    // One line per new shape, saying how it was planned.
    EXPECT_EQ(count(r.exit.output, "\nshape    ("), 4u) << r.exit.output;
  }
}

TEST(MultiScale, TwoRanksTrainEveryStepAtTheSameSideAsOneRank) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  constexpr int kSteps = 8;
  const std::string one = scratch("multi_scale_one_rank");
  Exit e = run(multi_scale(one, kSteps, "data.batch_size=4"));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::vector<int64_t> sides = logged_sides(one + "/rank0.log");
  ASSERT_EQ(sides.size(), static_cast<size_t>(kSteps)) << e.output;
  const std::string two = scratch("multi_scale_two_ranks");
  e = run(mpirun(2) + multi_scale(two, kSteps, "data.batch_size=2"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(logged_sides(two + "/rank0.log"), sides);
  EXPECT_EQ(logged_sides(two + "/rank1.log"), sides);
  EXPECT_GT(std::set<int64_t>(sides.begin(), sides.end()).size(), 1u) << "the side changed";
}

TEST(MultiScale, BadScalesAreOneErrorNamingTheKeyAndExit2) {
  const std::string dir = scratch("multi_scale_bad");
  const std::string base = trainer() + " train " + quickstart() + " run.dir=" + dir +
                           " model.name=resnet18_cifar memory.measure=false ";
  expect_user_error(run(base + "'data.scales=[24, 0]'"), "data.scales[1]");
  expect_user_error(run(base + "'data.scales=[-3]'"), "data.scales[0]");
  expect_user_error(run(base + "'data.scales=[16385]'"), "data.scales[0]");
  expect_user_error(run(base + "'data.scales=[32]' data.source=cifar10 data.path=/nonexistent"),
                    "data.scales: data.source cifar10 cannot");
  expect_user_error(run(base + "'data.scales=[32]' data.source=idx data.path=/nonexistent"),
                    "data.scales: data.source idx cannot");
  expect_user_error(run(base + "'data.scales=[32]' data.source=tokens data.path=/nonexistent"),
                    "data.scales: data.source tokens cannot");
  // lenet5's classifier reads a flattened feature map whose size depends on the side.
  expect_user_error(run(base + "model.name=lenet5 'data.scales=[24, 32]'"),
                    "data.scales: model 'lenet5' at input");
}

}  // namespace
}  // namespace ferry::testing
