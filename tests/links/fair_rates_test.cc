// Max-min fair link sharing: equal split on a shared link, bottleneck freed capacity goes to
// the others, directions are separate, duplex factor applies only when both are busy, and no
// link-direction is ever over its capacity.
#include "links/fair_rates.h"

#include <cmath>
#include <random>
#include <stdexcept>

#include <gtest/gtest.h>

namespace ferry {
namespace {

constexpr auto kH = TransferDirection::kToHost;
constexpr auto kD = TransferDirection::kToDevice;

TEST(FairShare, TwoFlowsOnOneLinkSplitItEvenly) {
  std::vector<LinkCapacity> links{{12, 12, 1.0}};
  auto r = fair_rates(links, {{{0}, kH}, {{0}, kH}});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_DOUBLE_EQ(r[0], 6);
  EXPECT_DOUBLE_EQ(r[1], 6);
}

TEST(FairShare, DirectionsAreSeparateCapacities) {
  std::vector<LinkCapacity> links{{10, 8, 1.0}};
  auto r = fair_rates(links, {{{0}, kH}, {{0}, kD}});
  EXPECT_DOUBLE_EQ(r[0], 10);
  EXPECT_DOUBLE_EQ(r[1], 8);
}

TEST(FairShare, DuplexFactorAppliesOnlyWhenBothDirectionsAreBusy) {
  std::vector<LinkCapacity> links{{10, 10, 0.8}};
  EXPECT_DOUBLE_EQ(fair_rates(links, {{{0}, kH}})[0], 10);
  auto r = fair_rates(links, {{{0}, kH}, {{0}, kD}});
  EXPECT_DOUBLE_EQ(r[0], 8);
  EXPECT_DOUBLE_EQ(r[1], 8);
}

// DGX-1-like shape: two GPUs (links 0, 1) under one switch (link 2) whose uplink is the
// bottleneck; a third GPU (link 3) alone under another switch (link 4).
TEST(FairShare, GpusUnderOneSwitchShareItsUplink) {
  std::vector<LinkCapacity> links{{16, 16, 1}, {16, 16, 1}, {12, 12, 1}, {16, 16, 1}, {12, 12, 1}};
  auto r = fair_rates(links, {{{0, 2}, kH}, {{1, 2}, kH}, {{3, 4}, kH}});
  EXPECT_DOUBLE_EQ(r[0], 6);
  EXPECT_DOUBLE_EQ(r[1], 6);
  EXPECT_DOUBLE_EQ(r[2], 12);
}

TEST(FairShare, CapacityLeftByABottleneckedFlowGoesToTheOthers) {
  // Flow 0 is held to 2 by its own link 0; flows 0..2 share link 1 (capacity 10).
  std::vector<LinkCapacity> links{{2, 2, 1}, {10, 10, 1}};
  auto r = fair_rates(links, {{{0, 1}, kH}, {{1}, kH}, {{1}, kH}});
  EXPECT_DOUBLE_EQ(r[0], 2);
  EXPECT_DOUBLE_EQ(r[1], 4);
  EXPECT_DOUBLE_EQ(r[2], 4);
}

TEST(FairShare, EdgeCases) {
  std::vector<LinkCapacity> links{{0, 5, 1}, {5, 5, 1}};
  EXPECT_TRUE(fair_rates(links, {}).empty());
  auto r = fair_rates(links, {{{}, kH}, {{0, 1}, kH}, {{1, 1}, kD}});
  EXPECT_TRUE(std::isinf(r[0]));
  EXPECT_DOUBLE_EQ(r[1], 0);  // zero capacity
  EXPECT_DOUBLE_EQ(r[2], 5);  // a link listed twice counts once
  EXPECT_THROW(fair_rates(links, {{{2}, kH}}), std::out_of_range);
}

// An all-reduce hop goes up its GPU's link and down the peer's: per-link directions put it on
// the to-host side of one and the to-device side of the other, so it shares each with the
// copies going that way only.
TEST(FairShare, PerLinkDirectionsPutATurningFlowOnEachLinksOwnSide) {
  std::vector<LinkCapacity> links{{10, 10, 1.0}, {10, 10, 1.0}};
  Flow hop{{0, 1}, kH, {kH, kD}};
  // An offload on link 0 shares its to-host side with the hop; a prefetch on link 1 its
  // to-device side; an offload on link 1 crosses no side the hop uses.
  auto r = fair_rates(links, {hop, {{0}, kH}, {{1}, kD}, {{1}, kH}});
  EXPECT_DOUBLE_EQ(r[0], 5);
  EXPECT_DOUBLE_EQ(r[1], 5);
  EXPECT_DOUBLE_EQ(r[2], 5);
  EXPECT_DOUBLE_EQ(r[3], 10);
  // The same hop with one direction for the whole flow would take link 1's to-host side.
  auto one = fair_rates(links, {{{0, 1}, kH}, {{0}, kH}, {{1}, kD}, {{1}, kH}});
  EXPECT_DOUBLE_EQ(one[2], 10);
  EXPECT_DOUBLE_EQ(one[3], 5);
  // Empty link_directions is `direction` everywhere; a length mismatch is an error.
  EXPECT_EQ(fair_rates(links, {{{0, 1}, kD, {}}}), fair_rates(links, {{{0, 1}, kD}}));
  EXPECT_THROW(fair_rates(links, {{{0, 1}, kH, {kD}}}), std::invalid_argument);
}

TEST(FairShare, RandomCasesNeverOversubscribeAndEveryFlowHasABottleneck) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n_links = 1 + rng() % 6;
    std::vector<LinkCapacity> links(n_links);
    for (auto& l : links) {
      l.to_host_gbps = 1 + rng() % 20;
      l.to_device_gbps = 1 + rng() % 20;
      l.duplex_factor = 0.5 + 0.5 * (rng() % 3) / 2.0;
    }
    std::vector<Flow> flows(1 + rng() % 8);
    for (auto& f : flows) {
      f.direction = rng() % 2 ? kH : kD;
      for (int l = 0; l < n_links; ++l)
        if (rng() % 2) f.links.push_back(l);
      if (f.links.empty()) f.links.push_back(rng() % n_links);
      if (rng() % 3 == 0)  // a flow that turns around: its own direction per link
        for (size_t i = 0; i < f.links.size(); ++i)
          f.link_directions.push_back(rng() % 2 ? kH : kD);
    }
    auto rate = fair_rates(links, flows);
    // Effective capacity and load per link-direction.
    std::vector<double> load(n_links * 2, 0.0);
    std::vector<bool> busy(n_links * 2, false);
    for (size_t f = 0; f < flows.size(); ++f)
      for (size_t i = 0; i < flows[f].links.size(); ++i) {
        size_t r = flows[f].links[i] * 2 + (link_direction(flows[f], i) == kD);
        load[r] += rate[f];
        busy[r] = true;
      }
    auto cap = [&](size_t r) {
      int l = static_cast<int>(r / 2);
      auto d = r % 2 ? kD : kH;
      return direction_capacity(links[l], d, busy[l * 2] && busy[l * 2 + 1]);
    };
    for (size_t r = 0; r < load.size(); ++r) EXPECT_LE(load[r], cap(r) * (1 + 1e-9) + 1e-9);
    // Max-min: each flow crosses a saturated link-direction where no flow is faster.
    for (size_t f = 0; f < flows.size(); ++f) {
      bool has_bottleneck = false;
      for (size_t i = 0; i < flows[f].links.size(); ++i) {
        size_t r = flows[f].links[i] * 2 + (link_direction(flows[f], i) == kD);
        if (load[r] < cap(r) * (1 - 1e-9)) continue;
        bool largest = true;
        for (size_t g = 0; g < flows.size(); ++g)
          for (size_t j = 0; j < flows[g].links.size(); ++j)
            if (static_cast<size_t>(flows[g].links[j]) * 2 + (link_direction(flows[g], j) == kD) ==
                    r &&
                rate[g] > rate[f] * (1 + 1e-9))
              largest = false;
        has_bottleneck |= largest;
      }
      EXPECT_TRUE(has_bottleneck) << "trial " << trial << " flow " << f;
    }
  }
}

}  // namespace
}  // namespace ferry
