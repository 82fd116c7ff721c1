// The ledger's fluid model alone, on the test's own clock (no shared memory, no sleeping): copies
// on one link share it max-min fairly, a copy finishing frees its share for the others at that
// moment, the two directions of a link are independent (up to its duplex factor), a claim on a
// free link is granted at once and one on a busy link when the chunk before it is through, least
// slack first, a held chunk keeps its token until it is ended, and the bytes-over-time record
// never shows more than the capacity.
#include "links/fluid_model.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

namespace ferry {
namespace {

constexpr int kH = 0;  // to host
constexpr int kD = 1;  // to device
constexpr double kGB = 1e9;

// GPU links 0 and 1 under switch uplink 2, `gbps` each way; the model starts at t = 0.
class Fluid : public ::testing::Test {
 protected:
  void SetUp() override { init(1.0); }
  void init(double gbps, double duplex = 1.0, double bin_s = 0.01) {
    state_ = std::make_unique<FluidState>();
    FluidModel::init(*state_,
                     {{"gpu0", {gbps, gbps, duplex}},
                      {"gpu1", {gbps, gbps, duplex}},
                      {"sw0", {gbps, gbps, duplex}}},
                     bin_s, 0.0);
    model_ = std::make_unique<FluidModel>(*state_);
  }
  // A copy of rank `rank` over its GPU link and the uplink; returns its id.
  uint64_t copy(int rank, int dir, double bytes) {
    const std::vector<int32_t> path = {rank, 2};
    return model_->begin_flow(rank, 0, dir, path, static_cast<uint64_t>(bytes)).id;
  }
  // A chunk claim of rank `rank` for the uplink's token, crossing its path.
  uint64_t claim(int rank, double bytes, double latest_start, bool held = false) {
    const std::vector<int32_t> tokens = {2}, path = {rank, 2};
    bool granted = false;
    return model_
        ->add_claim(model_->now(), rank, 0, kH, tokens, path, static_cast<uint64_t>(bytes),
                    latest_start, held, &granted)
        .id;
  }
  FluidFlow& flow(uint64_t id) {
    FluidFlow* f = model_->find_flow(id);
    EXPECT_NE(f, nullptr) << "flow " << id;
    return *f;
  }
  double bytes_on(int link, int dir) {
    return model_->usage()[static_cast<size_t>(link)].bytes[dir];
  }

  std::unique_ptr<FluidState> state_;
  std::unique_ptr<FluidModel> model_;
};

TEST_F(Fluid, TwoCopiesOnOneLinkShareItAndFinishTogether) {
  const uint64_t a = copy(0, kH, 1 * kGB);
  const uint64_t b = copy(1, kH, 1 * kGB);
  EXPECT_DOUBLE_EQ(flow(a).rate, 0.5 * kGB);  // the uplink is the bottleneck: half each
  EXPECT_DOUBLE_EQ(flow(b).rate, 0.5 * kGB);
  EXPECT_DOUBLE_EQ(model_->finish_time(flow(a)), 2.0);
  model_->advance(1.0);
  EXPECT_DOUBLE_EQ(model_->now(), 1.0);
  EXPECT_NEAR(flow(a).remaining, 0.5 * kGB, 1);
  EXPECT_FALSE(flow(a).done);
  model_->advance(2.0);
  EXPECT_TRUE(flow(a).done);
  EXPECT_TRUE(flow(b).done);
  EXPECT_NEAR(bytes_on(2, kH), 2 * kGB, 1);
  EXPECT_NEAR(bytes_on(0, kH), 1 * kGB, 1);
  EXPECT_EQ(bytes_on(2, kD), 0);
  // Never above capacity in any bin.
  for (const LinkUsage& u : model_->usage()) EXPECT_LE(u.peak_gbps[kH], 1.0 + 1e-9) << u.name;
  EXPECT_NEAR(model_->usage()[2].peak_gbps[kH], 1.0, 1e-9);
  EXPECT_NEAR(model_->usage()[0].peak_gbps[kH], 0.5, 1e-9);
}

TEST_F(Fluid, ACopyFinishingFreesItsShareAtThatMoment) {
  const uint64_t small = copy(0, kH, 0.5 * kGB);
  const uint64_t large = copy(1, kH, 1.5 * kGB);
  // Half each until the small one is through at t = 1; then the large one alone at 1 GB/s.
  model_->advance(1.5);
  EXPECT_TRUE(flow(small).done);
  EXPECT_DOUBLE_EQ(flow(large).rate, 1.0 * kGB);
  EXPECT_NEAR(flow(large).remaining, 0.5 * kGB, 1);
  EXPECT_NEAR(model_->finish_time(flow(large)), 2.0, 1e-9);
  model_->advance(2.0);
  EXPECT_TRUE(flow(large).done);
  EXPECT_NEAR(bytes_on(2, kH), 2 * kGB, 1);
}

TEST_F(Fluid, TheTwoDirectionsOfALinkAreIndependentUpToItsDuplexFactor) {
  const uint64_t up = copy(0, kH, 1 * kGB);
  const uint64_t down = copy(1, kD, 1 * kGB);
  EXPECT_DOUBLE_EQ(flow(up).rate, 1.0 * kGB);
  EXPECT_DOUBLE_EQ(flow(down).rate, 1.0 * kGB);
  model_->advance(1.0);
  EXPECT_TRUE(flow(up).done);
  EXPECT_TRUE(flow(down).done);
  EXPECT_NEAR(bytes_on(2, kH), 1 * kGB, 1);
  EXPECT_NEAR(bytes_on(2, kD), 1 * kGB, 1);

  init(1.0, /*duplex=*/0.8);
  const uint64_t up2 = copy(0, kH, 1 * kGB);
  EXPECT_DOUBLE_EQ(flow(up2).rate, 1.0 * kGB);  // alone: the whole direction
  const uint64_t down2 = copy(0, kD, 1 * kGB);
  EXPECT_DOUBLE_EQ(flow(up2).rate, 0.8 * kGB);  // both directions busy: the duplex factor
  EXPECT_DOUBLE_EQ(flow(down2).rate, 0.8 * kGB);
}

TEST_F(Fluid, AClaimOnAFreeLinkIsGrantedAtOnceAndTheNextWhenTheChunkIsThrough) {
  const uint64_t first = claim(0, 0.25 * kGB, /*latest_start=*/10);
  FluidClaim* c = model_->find_claim(first);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->granted);
  EXPECT_EQ(state_->tokens[2][kH].flow, c->flow);
  EXPECT_EQ(state_->tokens[0][kH].flow, 0u) << "only the arbitrated link's token is taken";
  const uint64_t first_flow = c->flow;
  EXPECT_DOUBLE_EQ(flow(first_flow).rate, 1.0 * kGB);
  // The second rank's chunk waits for the uplink's token, although its own link is free.
  const uint64_t second = claim(1, 0.25 * kGB, 10);
  EXPECT_FALSE(model_->find_claim(second)->granted);
  // The first chunk is through at t = 0.25: its token goes to the waiting claim then, and that
  // chunk's flow starts at that moment (finishing at 0.5), whatever time the model is read at.
  model_->advance(0.4);
  EXPECT_TRUE(flow(first_flow).done);
  FluidClaim* s = model_->find_claim(second);
  ASSERT_TRUE(s->granted);
  EXPECT_EQ(state_->tokens[2][kH].flow, s->flow);
  EXPECT_DOUBLE_EQ(state_->tokens[2][kH].since, 0.25);
  EXPECT_NEAR(model_->finish_time(flow(s->flow)), 0.5, 1e-9);
  model_->advance(0.5);
  EXPECT_TRUE(flow(s->flow).done);
  EXPECT_EQ(state_->tokens[2][kH].flow, 0u);
  EXPECT_NEAR(bytes_on(2, kH), 0.5 * kGB, 1);
}

TEST_F(Fluid, WaitingClaimsAreGrantedLeastSlackFirst) {
  const uint64_t busy = claim(0, 0.1 * kGB, 0);
  ASSERT_TRUE(model_->find_claim(busy)->granted);
  const uint64_t lax = claim(0, 0.1 * kGB, /*latest_start=*/5);
  const uint64_t urgent = claim(1, 0.1 * kGB, /*latest_start=*/1);
  model_->advance(0.15);  // the busy chunk was through at 0.1: one of the two got the token
  EXPECT_TRUE(model_->find_claim(urgent)->granted);
  EXPECT_FALSE(model_->find_claim(lax)->granted);
  model_->advance(0.3);
  EXPECT_TRUE(model_->find_claim(lax)->granted);
}

TEST_F(Fluid, AHeldChunkKeepsItsTokenUntilItIsEnded) {
  const uint64_t held = claim(0, 0.1 * kGB, 0, /*held=*/true);
  const uint64_t held_flow = model_->find_claim(held)->flow;
  const uint64_t next = claim(1, 0.1 * kGB, 0);
  model_->advance(1.0);  // the model is long through with the held chunk's bytes
  EXPECT_TRUE(flow(held_flow).done);
  EXPECT_EQ(state_->tokens[2][kH].flow, held_flow);
  EXPECT_TRUE(model_->token_stalled(state_->tokens[2][kH]));
  EXPECT_FALSE(model_->find_claim(next)->granted);
  // Its mover says the hardware moved it: the token goes to the next claim now.
  model_->end_flow(held_flow);
  FluidClaim* n = model_->find_claim(next);
  ASSERT_TRUE(n->granted);
  EXPECT_EQ(state_->tokens[2][kH].flow, n->flow);
  EXPECT_DOUBLE_EQ(state_->tokens[2][kH].since, 1.0);
  EXPECT_FALSE(model_->token_stalled(state_->tokens[2][kH]));
}

TEST_F(Fluid, EndingAFlowEarlyFreesItsShareAndAnEmptyCopyIsThroughAtOnce) {
  const uint64_t a = copy(0, kH, 1 * kGB);
  const uint64_t b = copy(1, kH, 1 * kGB);
  model_->advance(0.5);
  model_->end_flow(a);  // its mover failed
  EXPECT_EQ(model_->find_flow(a), nullptr);
  EXPECT_DOUBLE_EQ(flow(b).rate, 1.0 * kGB);
  EXPECT_NEAR(model_->finish_time(flow(b)), 0.5 + 0.75, 1e-9);
  // A zero-byte copy is through as soon as it starts.
  const std::vector<int32_t> path = {0};
  EXPECT_TRUE(model_->begin_flow(0, 0, kH, path, 0).done);
}

TEST_F(Fluid, AFullTableIsAnArbitrationError) {
  for (int i = 0; i < kFluidMaxFlows; ++i) copy(0, kH, 1 * kGB);
  EXPECT_THROW(copy(0, kH, 1 * kGB), LinkArbiterError);
}

TEST_F(Fluid, AZeroSpeedLinkMakesNoProgressAndItsTokenStalls) {
  init(0.0);
  const uint64_t c = claim(0, 1000, 0);
  const FluidFlow& f = flow(model_->find_claim(c)->flow);
  EXPECT_EQ(f.rate, 0);
  EXPECT_EQ(model_->finish_time(f), std::numeric_limits<double>::infinity());
  model_->advance(100);
  EXPECT_FALSE(f.done);
  EXPECT_TRUE(model_->token_stalled(state_->tokens[2][kH]));
}

}  // namespace
}  // namespace ferry
