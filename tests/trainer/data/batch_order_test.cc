// BatchOrder without threads or a dataset: the epoch order, how global batches split over ranks
// (Note [Partial global batch]), the next position across epochs, and the per-batch sides.
#include "trainer/data/batch_order.h"

#include <algorithm>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(EpochOrder, PermutationPerSeedAndEpoch) {
  const std::vector<int64_t> a = epoch_order(1000, true, 5, 0);
  EXPECT_EQ(a, epoch_order(1000, true, 5, 0));
  EXPECT_NE(a, epoch_order(1000, true, 5, 1));
  EXPECT_NE(a, epoch_order(1000, true, 6, 0));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, epoch_order(1000, false, 5, 0));  // a permutation of the identity
  EXPECT_NE(a, sorted);
  // Not a near-identity: few fixed points (about 1 expected).
  int fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += a[i] == i;
  EXPECT_LT(fixed, 10);
}

TEST(BatchOrder, BatchesPerEpochKeepOrDropThePartialBatch) {
  EXPECT_EQ(BatchOrder(30, 4, 2, 0, false).per_epoch(), 4);  // 8 + 8 + 8 + 6
  EXPECT_EQ(BatchOrder(30, 4, 2, 0, true).per_epoch(), 3);
  EXPECT_EQ(BatchOrder(32, 4, 2, 1, true).per_epoch(), 4);
  EXPECT_EQ(BatchOrder(7, 4, 2, 0, true).per_epoch(), 0);
}

TEST(BatchOrder, FullBatchesCutInRankOrder) {
  for (int rank = 0; rank < 3; ++rank) {
    const BatchOrder order(60, 5, 3, rank, false);
    const SliceRange r = order.rank_slice(2);  // global batch 2: order[30, 45)
    EXPECT_EQ(r.begin, 30 + 5 * rank);
    EXPECT_EQ(r.count, 5);
    EXPECT_EQ(order.global_slice(2).begin, 30);
    EXPECT_EQ(order.global_slice(2).count, 15);
  }
}

TEST(BatchOrder, PartialBatchSplitsAsEvenlyAsPossible) {
  // 4 ranks x 5 = 20 per global batch; 27 samples leave 7 in the last: 2, 2, 2, 1.
  const std::vector<int64_t> counts{2, 2, 2, 1}, begins{20, 22, 24, 26};
  for (int rank = 0; rank < 4; ++rank) {
    const SliceRange r = BatchOrder(27, 5, 4, rank, false).rank_slice(1);
    EXPECT_EQ(r.count, counts[rank]) << "rank " << rank;
    EXPECT_EQ(r.begin, begins[rank]) << "rank " << rank;
  }
  // Fewer samples than ranks: the last ranks get none, and the slices still tile the batch.
  int64_t next = 8;
  for (int rank = 0; rank < 4; ++rank) {
    const SliceRange r = BatchOrder(10, 2, 4, rank, false).rank_slice(1);
    EXPECT_EQ(r.begin, next);
    EXPECT_EQ(r.count, rank < 2 ? 1 : 0);
    next += r.count;
  }
  EXPECT_EQ(next, 10);
}

TEST(BatchOrder, NextAndAfterCrossEpochs) {
  const BatchOrder order(30, 4, 2, 0, false);  // 4 batches an epoch
  EXPECT_EQ(order.next(LoaderPosition{0, 2}), (LoaderPosition{0, 3}));
  EXPECT_EQ(order.next(LoaderPosition{0, 3}), (LoaderPosition{1, 0}));
  EXPECT_EQ(order.after(0), (LoaderPosition{0, 0}));
  EXPECT_EQ(order.after(9), (LoaderPosition{2, 1}));
  LoaderPosition p;
  for (int i = 0; i < 9; ++i) p = order.next(p);
  EXPECT_EQ(p, order.after(9));
}

TEST(BatchSide, DrawnFromScalesBySeedAndPosition) {
  EXPECT_EQ(batch_side({}, 3, LoaderPosition{1, 2}), 0);
  const std::vector<int64_t> scales{16, 24, 32};
  std::set<int64_t> seen;
  bool seed_matters = false;
  for (int64_t b = 0; b < 64; ++b) {
    const int64_t side = batch_side(scales, 3, LoaderPosition{0, b});
    EXPECT_EQ(side, batch_side(scales, 3, LoaderPosition{0, b}));
    EXPECT_NE(std::find(scales.begin(), scales.end(), side), scales.end());
    seen.insert(side);
    seed_matters |= side != batch_side(scales, 4, LoaderPosition{0, b});
  }
  EXPECT_EQ(seen.size(), scales.size());  // every side comes up in 64 draws
  EXPECT_TRUE(seed_matters);
}

}  // namespace
}  // namespace ferry
