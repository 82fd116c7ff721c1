// plan_staging (Note [Gradients through a staging ring]): buckets reuse staging bytes only after
// the reduction of the bucket that held them, with a wait before the step that reuses them; a
// gradient written twice keeps its bytes for the whole backward; a backward that cannot fit grows
// the area; parameters no step writes are listed.
#include "trainer/optim/gradient_staging.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

struct Case {
  std::vector<GradSlice> slices;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<std::vector<size_t>> touched, written;
};

// `n` parameters of `bytes` each, laid out in order, produced in reverse, buckets of `cap`.
Case make(size_t n, uint64_t bytes, uint64_t cap) {
  Case c;
  for (size_t p = 0; p < n; ++p) c.slices.push_back({p * bytes, bytes});
  c.buckets = assign_buckets(c.slices, {}, cap);
  c.bucket_of.assign(n, 0);
  for (size_t b = 0; b < c.buckets.size(); ++b) {
    for (size_t p : c.buckets[b].params) c.bucket_of[p] = b;
  }
  return c;
}

StagingPlan plan(const Case& c, uint64_t capacity, bool overlap = true, uint64_t slot = 256) {
  StagingInputs in;
  in.buckets = c.buckets;
  in.bucket_of = c.bucket_of;
  in.slices = c.slices;
  in.touched = c.touched;
  in.written = c.written;
  in.overlap = overlap;
  in.capacity = capacity;
  in.slot_bytes = slot;
  return plan_staging(in);
}

TEST(GradientStaging, TwoBucketsAlternateAndEachReuseWaitsForTheOneBefore) {
  Case c = make(4, 256, 256);  // one parameter per bucket; backward writes 3, 2, 1, 0
  c.touched = c.written = {{3}, {2}, {1}, {0}};
  const StagingPlan p = plan(c, 512);
  ASSERT_EQ(c.buckets.size(), 4u);
  EXPECT_EQ(p.bytes, 512u);
  EXPECT_EQ(p.bucket_offset, (std::vector<uint64_t>{0, 256, 0, 256}));
  EXPECT_EQ(p.param_offset, (std::vector<uint64_t>{256, 0, 256, 0}));
  // Step 2 writes bucket 2 over bucket 0's bytes (launched after step 0), step 3 over bucket 1's.
  EXPECT_EQ(p.waits, (std::vector<std::vector<size_t>>{{}, {}, {0}, {1}, {}}));
  EXPECT_TRUE(p.unwritten.empty());
}

TEST(GradientStaging, ABucketLaunchedAfterAStepFreesItsBytesOnlyForLaterSteps) {
  Case c = make(4, 256, 256);
  // Step 0 writes 3 and 2: two buckets live at once, then 1 and 0 at step 1.
  c.touched = c.written = {{3, 2}, {1, 0}};
  const StagingPlan p = plan(c, 512);
  EXPECT_EQ(p.bytes, 512u);
  EXPECT_EQ(p.waits[1], (std::vector<size_t>{0, 1}));
}

TEST(GradientStaging, AGradientWrittenTwiceKeepsItsBytesThroughBackward) {
  Case c = make(4, 256, 256);
  // Parameter 0 (a tied table) is started by step 0 and finished by step 4, the last.
  c.touched = {{0}, {3}, {2}, {1}, {0}};
  c.written = {{}, {3}, {2}, {1}, {0}};
  const StagingPlan p = plan(c, 768);  // two buckets plus the held one
  EXPECT_EQ(p.bytes, 768u);
  const uint64_t held = p.bucket_offset[3];
  EXPECT_EQ(p.param_offset[0], held);
  for (size_t b = 0; b < 3; ++b) {
    const uint64_t at = p.bucket_offset[b];
    EXPECT_TRUE(at + 256 <= held || at >= held + 256) << "bucket " << b << " overwrites the held";
  }
  for (const auto& w : p.waits) {
    for (size_t b : w) EXPECT_NE(b, 3u) << "the held bucket is never waited for mid-backward";
  }
}

TEST(GradientStaging, ABackwardThatDoesNotFitGrowsTheArea) {
  Case c = make(3, 256, 256);
  c.touched = c.written = {{2, 1, 0}};  // three buckets first written by one step
  const StagingPlan p = plan(c, 512);
  EXPECT_EQ(p.bytes, 768u);
}

TEST(GradientStaging, ParametersOfOneBucketAreBackToBackAndUnwrittenOnesListed) {
  Case c = make(4, 128, 512);               // one bucket of four, one range
  c.touched = c.written = {{3}, {2}, {0}};  // parameter 1 is never written
  const StagingPlan p = plan(c, 1024, true, 512);
  ASSERT_EQ(c.buckets.size(), 1u);
  EXPECT_EQ(p.param_offset, (std::vector<uint64_t>{0, 128, 256, 384}));
  EXPECT_EQ(p.unwritten, (std::vector<size_t>{1}));
  EXPECT_EQ(p.bytes, 512u);
}

TEST(GradientStaging, WithoutOverlapNothingIsReusedBeforeTheEnd) {
  Case c = make(4, 256, 256);
  c.touched = c.written = {{3}, {2}, {1}, {0}};
  const StagingPlan p = plan(c, 512, /*overlap=*/false);
  EXPECT_EQ(p.bytes, 1024u);  // every bucket live until finish: past the two-bucket area
}

}  // namespace
}  // namespace ferry
