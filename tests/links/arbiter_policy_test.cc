// The arbitration rule: least slack first, one chunk per link per direction, busy tokens
// respected, directions independent, ties broken by arrival; a claim that turns around takes each
// link in its own direction, and a blocked claim that reserves keeps less urgent ones off its
// links (Note [Claims that need several links at once]).
#include "links/arbiter_policy.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

constexpr auto kH = TransferDirection::kToHost;
constexpr auto kD = TransferDirection::kToDevice;

TEST(ArbiterGrant, LeastSlackWinsASharedLink) {
  std::vector<ChunkClaim> w{{0, kH, {0, 2}, 5.0, 0}, {1, kH, {1, 2}, 1.0, 1}};
  EXPECT_EQ(grant(w, {}), (std::vector<size_t>{1}));
}

TEST(ArbiterGrant, DisjointPathsAndOppositeDirectionsRunTogether) {
  std::vector<ChunkClaim> w{{0, kH, {0, 2}, 5.0, 0}, {1, kD, {1, 2}, 1.0, 1}, {2, kH, {3}, 9, 2}};
  EXPECT_EQ(grant(w, {}), (std::vector<size_t>{1, 0, 2}));
}

TEST(ArbiterGrant, BusyLinksBlockAndTiesGoByArrival) {
  std::vector<ChunkClaim> w{{0, kH, {0}, 1.0, 4}, {1, kH, {0}, 1.0, 3}, {2, kH, {1}, 0.0, 5}};
  EXPECT_EQ(grant(w, {}), (std::vector<size_t>{2, 1}));
  EXPECT_EQ(grant(w, {LinkDirection{1, kH}}), (std::vector<size_t>{1}));
  EXPECT_EQ(grant(w, {LinkDirection{1, kD}}), (std::vector<size_t>{2, 1}));
  EXPECT_TRUE(grant(w, {LinkDirection{0, kH}, LinkDirection{1, kH}}).empty());
}

TEST(ArbiterGrant, ClaimWithNoLinksIsAlwaysGranted) {
  std::vector<ChunkClaim> w{{0, kH, {}, 3.0, 0}};
  EXPECT_EQ(grant(w, {LinkDirection{0, kH}}), (std::vector<size_t>{0}));
  EXPECT_TRUE(grant({}, {}).empty());
}

TEST(ArbiterGrant, AClaimThatTurnsAroundTakesEachLinkInItsOwnDirection) {
  // A hop up link 0 and down link 1 (then up link 2): a copy to host on link 1 or to device on
  // link 0 runs beside it; a copy to host on link 0 or link 2 does not.
  const ChunkClaim hop{0, kH, {0, 1, 2}, 1.0, 0, {kH, kD, kH}};
  EXPECT_EQ(grant({hop, {1, kH, {1}, 2.0, 1}, {2, kD, {0}, 2.0, 2}}, {}),
            (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(grant({hop, {1, kH, {0}, 2.0, 1}, {2, kH, {2}, 2.0, 2}}, {}), (std::vector<size_t>{0}));
  EXPECT_TRUE(grant({hop}, {LinkDirection{1, kD}}).empty());
  EXPECT_EQ(grant({hop}, {LinkDirection{1, kH}}), (std::vector<size_t>{0}));
  const ChunkClaim bad{0, kH, {0, 1}, 1.0, 0, {kH}};
  EXPECT_THROW(grant({bad}, {}), std::invalid_argument);
}

TEST(ArbiterGrant, ABlockedClaimThatReservesKeepsLessUrgentOnesOffItsLinks) {
  // The most urgent claim needs links 0 and 1; link 0 is busy. Without a reservation the less
  // urgent claim on link 1 starts (and the next one after it, and so on); with one it waits, so
  // link 1 is free when link 0 frees. A more urgent claim is never held back.
  ChunkClaim urgent{0, kH, {0, 1}, 1.0, 0};
  const ChunkClaim later{1, kH, {1}, 5.0, 1};
  const ChunkClaim sooner{2, kH, {1}, 0.5, 2};
  const std::vector<LinkDirection> busy{{0, kH}};
  EXPECT_EQ(grant({urgent, later}, busy), (std::vector<size_t>{1}));
  urgent.reserve = true;
  EXPECT_TRUE(grant({urgent, later}, busy).empty());
  EXPECT_EQ(grant({urgent, later, sooner}, busy), (std::vector<size_t>{2}));
  EXPECT_EQ(grant({urgent, later}, {}), (std::vector<size_t>{0}));
  // Other directions and links stay free.
  EXPECT_EQ(grant({urgent, {3, kD, {1}, 9, 3}, {4, kH, {2}, 9, 4}}, busy),
            (std::vector<size_t>{1, 2}));
}

}  // namespace
}  // namespace ferry
