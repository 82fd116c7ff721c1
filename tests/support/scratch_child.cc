// A test program for scratch_test.cc: its one test makes kept scratch under the folder given in
// FERRY_SCRATCH_ROOT and then passes or fails as FERRY_SCRATCH_OUTCOME says, so the parent can
// see what the process leaves behind at its end (Note [Scratch per process]).
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/scratch.h"

TEST(ScratchChild, MakesScratchThenEndsAsTold) {
  const char* root = std::getenv("FERRY_SCRATCH_ROOT");
  const char* outcome = std::getenv("FERRY_SCRATCH_OUTCOME");
  ASSERT_NE(root, nullptr);
  ASSERT_NE(outcome, nullptr);
  std::ofstream(ferry::testing::kept_scratch(root, "run") + "/log.txt") << "what the run wrote";
  EXPECT_EQ(std::string(outcome), "pass") << "failing as told";
}
