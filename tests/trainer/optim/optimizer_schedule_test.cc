// Learning-rate schedules and optimizer state sizes.
#include "trainer/optim/optimizer.h"

#include <cmath>

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(LrSchedule, WarmupIsLinearFromLrOverWarmupSteps) {
  LrSchedule s{ScheduleKind::kConstant, 0.4f, 4};
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(1), 0.2f);
  EXPECT_FLOAT_EQ(s.at(3), 0.4f);
  EXPECT_FLOAT_EQ(s.at(100), 0.4f);
}

TEST(LrSchedule, StepDecaysByGammaEveryStepSizeAfterWarmup) {
  LrSchedule s{ScheduleKind::kStep, 1.0f, 2, 10, 0.5f};
  EXPECT_FLOAT_EQ(s.at(2), 1.0f);  // first step after warm-up
  EXPECT_FLOAT_EQ(s.at(11), 1.0f);
  EXPECT_FLOAT_EQ(s.at(12), 0.5f);
  EXPECT_FLOAT_EQ(s.at(32), 0.125f);
}

TEST(LrSchedule, CosineGoesFromLrToMinLrAtTheLastStep) {
  LrSchedule s{ScheduleKind::kCosine, 1.0f, 0, 30, 0.1f, 0.1f, 101};
  EXPECT_FLOAT_EQ(s.at(0), 1.0f);
  EXPECT_NEAR(s.at(50), 0.55f, 1e-3);  // halfway: the mean of lr and min_lr
  EXPECT_NEAR(s.at(100), 0.1f, 1e-6);
  EXPECT_NEAR(s.at(500), 0.1f, 1e-6) << "clamped after the end";
  for (int i = 1; i <= 100; ++i) EXPECT_LE(s.at(i), s.at(i - 1)) << i;
}

TEST(OptimizerSlots, MatchTheStateEachOptimizerKeeps) {
  EXPECT_EQ(optimizer_slots({OptimizerKind::kSgd, 0.9f}), 1);
  EXPECT_EQ(optimizer_slots({OptimizerKind::kSgd, 0.0f}), 0);
  EXPECT_EQ(optimizer_slots({OptimizerKind::kAdamW, 0.0f}), 2);
}

}  // namespace
}  // namespace ferry
