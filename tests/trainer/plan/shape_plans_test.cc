// Dropping the batches of shapes no plan fits (memory.oversize, Note [Dropping oversize batches]
// in trainer/plan/shape_plans.cc), through a Session of resnet18_cifar: under skip a shape is
// decided once with every rank (a shape another rank cannot plan is dropped here too), drops are
// counted per shape with one warning line each, and once every shape the loader can draw is
// dropped the run is a ConfigError; under error a shape the budget cannot hold throws its
// BudgetError naming the shape.
#include "trainer/plan/shape_plans.h"

#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "trainer/configured/dataset.h"
#include "trainer/configured/model.h"
#include "trainer/session/session.h"

namespace ferry {
namespace {

Config two_sides(std::vector<int64_t> scales) {
  Config c = default_config();
  c.model.name = "resnet18_cifar";
  c.data.batch_size = 2;
  c.data.samples = 64;
  c.data.scales = std::move(scales);
  c.device.memory = 2ull << 30;
  c.device.threads = 1;
  c.memory.measure = false;
  return c;
}

struct Training {
  explicit Training(const Config& c)
      : session(c, RankInfo{}, /*training=*/true), loader(open_configured_dataset(c), [&] {
          LoaderOptions o = loader_options(c, session.device());
          o.scales = c.data.scales;
          return o;
        }()) {}
  Session session;
  DataLoader loader;
};

TEST(ShapePlans, AShapeAnotherRankCannotPlanIsDroppedHereTooDecidedOnce) {
  const Config c = two_sides({24, 32});
  Training r(c);
  std::vector<bool> asked;                   // what this rank told the others
  std::vector<bool> others = {false, true};  // the other rank cannot plan the second shape
  ShapePlans shapes(r.session.executor(), r.session.device(), r.loader, OversizeAction::kSkip,
                    [&](bool mine) {
                      const bool other = others[asked.size()];
                      asked.push_back(mine);
                      return mine || other;
                    });
  const Shape s24 = configured_input(c, 2, 24), s32 = configured_input(c, 2, 32);
  EXPECT_TRUE(shapes.admit(s24));
  EXPECT_FALSE(shapes.admit(s32));
  EXPECT_EQ(asked, (std::vector<bool>{false, false})) << "both fit here";
  // Decided: no second collective.
  EXPECT_TRUE(shapes.admit(s24));
  EXPECT_FALSE(shapes.admit(s32));
  EXPECT_EQ(asked.size(), 2u);
  const std::string line = shapes.skip(s32, 5);
  EXPECT_EQ(line.rfind("skip     input (2, 3, 32, 32): another rank", 0), 0u) << line;
  EXPECT_NE(line.find("from step 5 on"), std::string::npos) << line;
  EXPECT_EQ(shapes.skip(s32, 6), "") << "one warning per shape";
  EXPECT_EQ(shapes.skipped_batches(), 2);
  const nlohmann::json j = shapes.skipped_summary();
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["shape"].get<std::vector<int64_t>>(), s32.dims());
  EXPECT_EQ(j[0]["batches"].get<int64_t>(), 2);
  EXPECT_NE(shapes.end_line().find("2 batches dropped"), std::string::npos) << shapes.end_line();
}

TEST(ShapePlans, UnderSkipAShapeTheBudgetCannotHoldHereIsDroppedEverywhere) {
  Config c = two_sides({24, 512});
  c.memory.policy = MemoryPolicy::kAuto;
  c.memory.budget = 400ull << 20;  // side 512's lower bound is above it
  Training r(c);
  std::vector<bool> asked;
  ShapePlans shapes(r.session.executor(), r.session.device(), r.loader, OversizeAction::kSkip,
                    [&](bool mine) {
                      asked.push_back(mine);
                      return mine;
                    });
  const Shape s512 = configured_input(c, 2, 512);
  EXPECT_FALSE(shapes.admit(s512));
  EXPECT_EQ(asked, std::vector<bool>{true}) << "this rank told the others it cannot";
  const std::string line = shapes.skip(s512, 1);
  EXPECT_NE(line.find("input (2, 3, 512, 512): memory.budget"), std::string::npos) << line;
  EXPECT_NE(line.find("lower bound"), std::string::npos) << line;
  EXPECT_TRUE(shapes.admit(configured_input(c, 2, 24)));
  // The loader draws side 24 too: the run goes on. The first trained position is one of side 24.
  const LoaderPosition first = shapes.first_admitted(LoaderPosition{});
  EXPECT_EQ(r.loader.side(first), 24);
}

TEST(ShapePlans, WhenNoShapeFitsTheRunEndsAndUnderErrorTheShapeIsNamed) {
  Config c = two_sides({512});
  c.memory.policy = MemoryPolicy::kAuto;
  c.memory.budget = 400ull << 20;
  {
    Training r(c);
    ShapePlans shapes(r.session.executor(), r.session.device(), r.loader, OversizeAction::kSkip);
    try {
      (void)shapes.first_admitted(LoaderPosition{});
      ADD_FAILURE() << "a run where no shape fits was started";
    } catch (const BudgetError& e) {
      ADD_FAILURE() << "not the run's error: " << e.what();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("no input shape fits memory.budget"), std::string::npos)
          << e.what();
    }
  }
  Training r(c);
  ShapePlans shapes(r.session.executor(), r.session.device(), r.loader, OversizeAction::kError);
  try {
    (void)shapes.admit(configured_input(c, 2, 512));
    ADD_FAILURE() << "side 512 planned within 400 MiB";
  } catch (const BudgetError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("input (2, 3, 512, 512): ", 0), 0u) << e.what();
    EXPECT_NE(e.hint().find("the smallest budget that can work is"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("memory.oversize=skip"), std::string::npos) << e.hint();
  }
}

// Issue 27 item 13: a shape trained only within the first logging interval (which the timing
// leaves out) has no measured step; the end line said "-1.0000s", now it says why.
TEST(ShapePlans, AShapeWithoutAMeasuredStepSaysSoAtTheEnd) {
  const Config c = two_sides({24, 32});
  Training r(c);
  ShapePlans shapes(r.session.executor(), r.session.device(), r.loader, OversizeAction::kError);
  const Shape s24 = configured_input(c, 2, 24), s32 = configured_input(c, 2, 32);
  // Side 24 once, in the first interval; side 32 in the next two (three intervals, two shapes:
  // the first one is left out).
  const auto step = [&](const Shape& input, int64_t at, double seconds) {
    ASSERT_TRUE(shapes.admit(input));
    shapes.before_step(input);
    (void)shapes.after_step(input, at);
    shapes.interval(seconds);
  };
  step(s24, 1, 0.5);
  step(s32, 2, 0.25);
  step(s32, 3, 0.25);
  const std::string line = shapes.end_line();
  EXPECT_EQ(line.find("-1.0000s"), std::string::npos) << line;
  EXPECT_NE(line.find("(2, 3, 24, 24) x1 not measured (trained once)/"), std::string::npos) << line;
  EXPECT_NE(line.find("(2, 3, 32, 32) x2 0.2500s/"), std::string::npos) << line;
}

}  // namespace
}  // namespace ferry
