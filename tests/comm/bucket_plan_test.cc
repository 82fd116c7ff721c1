// Bucket assignment: DDP's fill-to-cap rule in production order, the single oversized
// parameter, merging of touching slices into ranges, and the table checks.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "comm/bucket_plan.h"

namespace ferry {
namespace {

// `n` slices of `bytes` each, laid out back to back from offset 0.
std::vector<GradSlice> packed(size_t n, uint64_t bytes) {
  std::vector<GradSlice> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = {i * bytes, bytes};
  return s;
}

// Slices of the given sizes, each starting at a multiple of `align` (as in the parameter store).
std::vector<GradSlice> aligned(const std::vector<uint64_t>& sizes, uint64_t align) {
  std::vector<GradSlice> s;
  uint64_t offset = 0;
  for (uint64_t b : sizes) {
    s.push_back({offset, b});
    offset += (b + align - 1) / align * align;
  }
  return s;
}

using Params = std::vector<size_t>;
using Ranges = std::vector<ByteRange>;

TEST(BucketPlan, EmptyTableHasNoBuckets) { EXPECT_TRUE(assign_buckets({}, {}, 1024).empty()); }

TEST(BucketPlan, FillsInReverseOrderUpToTheCap) {
  const auto params = packed(6, 400);
  const auto buckets = assign_buckets(params, {}, 1000);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (Params{5, 4}));
  EXPECT_EQ(buckets[1].params, (Params{3, 2}));
  EXPECT_EQ(buckets[2].params, (Params{1, 0}));
  for (const auto& b : buckets) EXPECT_EQ(b.bytes, 800u);
  // Produced back to front, each bucket is one contiguous range of the block.
  EXPECT_EQ(buckets[0].ranges, (Ranges{{1600, 800}}));
  EXPECT_EQ(buckets[1].ranges, (Ranges{{800, 800}}));
  EXPECT_EQ(buckets[2].ranges, (Ranges{{0, 800}}));
}

TEST(BucketPlan, ABucketThatReachesTheCapExactlyCloses) {
  const auto params = packed(5, 500);
  const auto buckets = assign_buckets(params, {}, 1000);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (Params{4, 3}));
  EXPECT_EQ(buckets[1].params, (Params{2, 1}));
  EXPECT_EQ(buckets[2].params, (Params{0}));
  EXPECT_EQ(buckets[2].bytes, 500u);
}

TEST(BucketPlan, AParameterLargerThanTheCapIsItsOwnBucket) {
  // Sizes by index: 100, 5000, 100, 100, 8000. Produced: 4, 3, 2, 1, 0.
  const auto params = aligned({100, 5000, 100, 100, 8000}, 4);
  const auto buckets = assign_buckets(params, {}, 1000);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].params, (Params{4}));  // the first produced, already past the cap
  EXPECT_EQ(buckets[0].bytes, 8000u);
  EXPECT_EQ(buckets[1].params, (Params{3, 2}));
  EXPECT_EQ(buckets[2].params, (Params{1}));  // would take {3, 2} past the cap
  EXPECT_EQ(buckets[2].bytes, 5000u);
  EXPECT_EQ(buckets[3].params, (Params{0}));
  for (const auto& b : buckets) EXPECT_EQ(b.ranges.size(), 1u);
}

TEST(BucketPlan, NoBucketExceedsTheCapUnlessItHoldsOneParameter) {
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(4 * static_cast<uint64_t>((i * 7919) % 997 + 1));
  const auto params = aligned(sizes, 64);
  const uint64_t cap = 1500;
  const auto buckets = assign_buckets(params, {}, cap);
  size_t seen = 0;
  uint64_t total = 0;
  size_t expect_next = params.size();
  for (const auto& b : buckets) {
    if (b.params.size() > 1) {
      EXPECT_LE(b.bytes, cap);
    }
    for (size_t p : b.params) EXPECT_EQ(p, --expect_next);  // production order is kept
    seen += b.params.size();
    total += b.bytes;
  }
  EXPECT_EQ(seen, params.size());
  EXPECT_EQ(total, std::accumulate(sizes.begin(), sizes.end(), uint64_t{0}));
  // Every bucket but the last was closed because the next parameter would not fit.
  for (size_t k = 0; k + 1 < buckets.size(); ++k) {
    const size_t next = buckets[k + 1].params.front();
    EXPECT_GT(buckets[k].bytes + params[next].bytes, cap) << "bucket " << k;
  }
}

TEST(BucketPlan, PaddingGapsSplitRangesUnlessSizesArePadded) {
  // 64-byte aligned slices of 40 bytes: 24 bytes of padding between neighbours.
  const auto unpadded = aligned({40, 40, 40}, 64);
  const auto buckets = assign_buckets(unpadded, {}, 1 << 20);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].ranges, (Ranges{{0, 40}, {64, 40}, {128, 40}}));
  // The same slices with their padding: one range.
  std::vector<GradSlice> padded = unpadded;
  for (auto& s : padded) s.bytes = 64;
  const auto merged = assign_buckets(padded, {}, 1 << 20);
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].ranges, (Ranges{{0, 192}}));
}

TEST(BucketPlan, AnOrderThatIsNotContiguousGivesSeveralRanges) {
  const auto params = packed(4, 400);
  const Params order{0, 2, 1, 3};
  const auto buckets = assign_buckets(params, order, 800);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].params, (Params{0, 2}));
  EXPECT_EQ(buckets[0].ranges, (Ranges{{0, 400}, {800, 400}}));
  EXPECT_EQ(buckets[1].params, (Params{1, 3}));
  EXPECT_EQ(buckets[1].ranges, (Ranges{{400, 400}, {1200, 400}}));
  // In forward order the same table gives one range per bucket, ascending.
  const Params forward{0, 1, 2, 3};
  const auto fwd = assign_buckets(params, forward, 800);
  ASSERT_EQ(fwd.size(), 2u);
  EXPECT_EQ(fwd[0].ranges, (Ranges{{0, 800}}));
  EXPECT_EQ(fwd[1].ranges, (Ranges{{800, 800}}));
}

TEST(BucketPlan, ZeroByteParametersAddNoRange) {
  std::vector<GradSlice> params{{0, 400}, {400, 0}, {400, 400}};
  const auto buckets = assign_buckets(params, {}, 1 << 20);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].params, (Params{2, 1, 0}));
  EXPECT_EQ(buckets[0].ranges, (Ranges{{0, 800}}));
}

TEST(BucketPlan, ReverseOrder) { EXPECT_EQ(reverse_order(4), (Params{3, 2, 1, 0})); }

using BucketPlanDeathTest = ::testing::Test;

TEST(BucketPlanDeathTest, RejectsAnOrderThatIsNotAPermutation) {
  const auto params = packed(3, 400);
  const Params repeated{0, 0, 1};
  EXPECT_DEATH(assign_buckets(params, repeated, 1000), "not a permutation");
  const Params short_order{0, 1};
  EXPECT_DEATH(assign_buckets(params, short_order, 1000), "lists 2 parameters");
}

TEST(BucketPlanDeathTest, RejectsOverlappingOrFractionalSlices) {
  std::vector<GradSlice> overlapping{{0, 400}, {396, 400}};
  EXPECT_DEATH(assign_buckets(overlapping, {}, 1000), "overlap");
  std::vector<GradSlice> fractional{{0, 6}};
  EXPECT_DEATH(assign_buckets(fractional, {}, 1000), "whole floats");
}

}  // namespace
}  // namespace ferry
