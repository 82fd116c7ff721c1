// Arena layout: time-disjoint blocks share space, overlapping ones never do.
#include "prefetch/arena.h"

#include <random>

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(Arena, DisjointLifetimesShareOffsets) {
  std::vector<ArenaBlock> blocks = {{1024, 0, 1}, {1024, 2, 3}, {1024, 4, 5}};
  EXPECT_EQ(layout_arena(blocks), 1024u);
  EXPECT_EQ(blocks[0].offset, 0u);
  EXPECT_EQ(blocks[1].offset, 0u);
  EXPECT_EQ(blocks[2].offset, 0u);
}

TEST(Arena, OverlappingLifetimesStack) {
  std::vector<ArenaBlock> blocks = {{1000, 0, 2}, {3000, 1, 3}, {500, 2, 2}};
  const uint64_t size = layout_arena(blocks);
  EXPECT_TRUE(arena_is_valid(blocks));
  // All three are live at step 2: the arena holds at least their aligned sum.
  EXPECT_EQ(live_bytes_bound(blocks), 1024u + 3072u + 512u);
  EXPECT_EQ(size, 1024u + 3072u + 512u);
}

TEST(Arena, ReusesAGapLeftByAnEarlierBlock) {
  // A large early block and two small later ones: the later ones fit where the first was.
  std::vector<ArenaBlock> blocks = {{4096, 0, 1}, {256, 0, 5}, {2048, 2, 5}, {2048, 2, 5}};
  const uint64_t size = layout_arena(blocks);
  EXPECT_TRUE(arena_is_valid(blocks));
  EXPECT_EQ(size, 4096u + 256u);
}

TEST(Arena, RandomLayoutsAreValidAndNearTheBound) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<ArenaBlock> blocks;
    for (int i = 0; i < 60; ++i) {
      const int begin = static_cast<int>(rng() % 40);
      blocks.push_back({(rng() % 10000) + 1, begin, begin + static_cast<int>(rng() % 10)});
    }
    const uint64_t size = layout_arena(blocks);
    ASSERT_TRUE(arena_is_valid(blocks));
    const uint64_t bound = live_bytes_bound(blocks);
    EXPECT_GE(size, bound);
    EXPECT_LE(size, bound * 2) << "greedy layout should stay near the live-bytes bound";
  }
}

TEST(Arena, DetectsAnInvalidLayout) {
  std::vector<ArenaBlock> blocks = {{1024, 0, 3, 0}, {1024, 2, 4, 512}};
  EXPECT_FALSE(arena_is_valid(blocks));
  blocks[1].offset = 1024;
  EXPECT_TRUE(arena_is_valid(blocks));
}

}  // namespace
}  // namespace ferry
