// The arbitration rule: least slack first, one chunk per link per direction, busy tokens
// respected, directions independent, ties broken by arrival.
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

}  // namespace
}  // namespace ferry
