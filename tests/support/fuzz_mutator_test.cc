// The shared fuzz mutator: its cases depend on the seed alone (reproducible CI), and
// replace_number() swaps exactly one number for one of the values given.
#include "tests/support/fuzz_mutator.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace ferry {
namespace {

TEST(FuzzMutator, TheSameSeedGivesTheSameCasesAndAnotherSeedOthers) {
  const std::string seed = "a: 12\nb: [3, 4.5]\nc: x\n";
  const auto cases = [&](uint64_t s) {
    fuzz::Rng rng(s);
    std::vector<std::string> out;
    for (int i = 0; i < 50; ++i) {
      out.push_back(fuzz::mutate_text(seed, rng, ":-[]{},"));
      out.push_back(fuzz::mutate_bytes(seed, rng));
    }
    return out;
  };
  EXPECT_EQ(cases(7), cases(7));
  EXPECT_NE(cases(7), cases(8));
}

TEST(FuzzMutator, ReplaceNumberSwapsOneNumberForOneOfTheValues) {
  fuzz::Rng rng(3);
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) seen.insert(fuzz::replace_number("n: 12, m: 3.5e2", rng, {"X"}));
  EXPECT_EQ(seen, (std::set<std::string>{"n: X, m: 3.5e2", "n: 12, m: X"}));
  EXPECT_EQ(fuzz::replace_number("no digits", rng, {"X"}), "no digits");
  EXPECT_EQ(fuzz::replace_number("7", rng, {}), "7");
}

TEST(FuzzTally, ExpectTallyChecksEveryBoundItIsGiven) {
  const fuzz::Tally tally{.accepted = 30, .rejected = 70};
  fuzz::expect_tally(tally, "ok fuzz", "loaded", "a DataError",
                     {.cases = 100, .rejected_above = 69, .accepted_above = 29});
  fuzz::expect_tally(tally, "rejected only", "loaded", "a DataError", {.rejected_above = 50});
  EXPECT_NONFATAL_FAILURE(fuzz::expect_tally(tally, "count", "loaded", "a DataError",
                                             {.cases = 99, .rejected_above = 0}),
                          "count");
  EXPECT_NONFATAL_FAILURE(
      fuzz::expect_tally(tally, "few rejected", "loaded", "a DataError", {.rejected_above = 70}),
      "few rejected");
  EXPECT_NONFATAL_FAILURE(fuzz::expect_tally(tally, "few accepted", "loaded", "a DataError",
                                             {.rejected_above = 0, .accepted_above = 30}),
                          "few accepted");
}

}  // namespace
}  // namespace ferry
