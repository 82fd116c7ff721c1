// Liveness over a hand-built tape.
#include "prefetch/liveness.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

// load: x; f1: a = f(x); f2: b = g(a); b1: ga = g'(b, a); b2: uses x.
Tape small_tape() {
  Tape t;
  t.tensors = {{"x", 100}, {"a", 200}, {"b", 300}, {"ga", 200}};
  t.steps = {
      {StepPhase::kLoad, -1, "load", "load", {}, {0}},
      {StepPhase::kForward, 0, "f1", "conv2d", {0}, {1}},
      {StepPhase::kForward, 1, "f2", "relu", {1}, {2}},
      {StepPhase::kBackward, 1, "f2", "relu", {2, 1}, {3}},
      {StepPhase::kBackward, 0, "f1", "conv2d", {3, 0}, {}},
  };
  return t;
}

TEST(Liveness, ProducersUsesAndDeaths) {
  const Liveness live = analyse_liveness(small_tape());
  EXPECT_EQ(live.forward_end, 2);
  const TensorLiveness& x = live.tensors[0];
  EXPECT_EQ(x.produced, 0);
  EXPECT_EQ(x.uses, (std::vector<int>{1, 4}));
  EXPECT_EQ(x.last_use, 4);
  EXPECT_EQ(x.last_forward_use, 1);
  EXPECT_EQ(x.first_backward_use, 4);
  const TensorLiveness& b = live.tensors[2];
  EXPECT_EQ(b.produced, 2);
  EXPECT_EQ(b.last_forward_use, 2);  // produced last in forward, read first in backward
  EXPECT_EQ(b.first_backward_use, 3);
  const TensorLiveness& ga = live.tensors[3];
  EXPECT_EQ(ga.produced, 3);
  EXPECT_EQ(ga.last_use, 4);
  EXPECT_EQ(ga.first_backward_use, 4);
}

TEST(Liveness, AReadBeforeAnyWriteIsAnInvariantViolation) {
  Tape t = small_tape();
  t.steps[1].reads = {2};  // f1 reads b, which f2 writes later
  EXPECT_DEATH(analyse_liveness(t), "before it is written");
}

}  // namespace
}  // namespace ferry
