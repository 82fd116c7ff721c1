// Note [Parameters gathered for the next forward]: which all-gather pieces a step reads (a piece is
// the same float range of every rank's shard), which host weight pieces it reads, and the order
// they are issued in: the next forward's first layers' pieces first.
#include "trainer/optim/gather_order.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

using Reads = std::vector<std::vector<std::pair<int64_t, int64_t>>>;
using Pieces = std::vector<std::vector<size_t>>;

TEST(GatherOrder, AStepReadsThePiecesHoldingItsFloatsInEveryShard) {
  const GatherPieces g{/*shard=*/100, /*piece=*/30, /*ranks=*/2};  // pieces 0..3 of 30,30,30,10
  ASSERT_EQ(g.count(), 4u);
  const Reads reads{{{0, 10}},     // shard 0, piece 0
                    {{25, 35}},    // crosses pieces 0 and 1
                    {{95, 105}},   // shard 0's last piece (3) and shard 1's first (0)
                    {{160, 161}},  // shard 1, piece 2
                    {},            // a step that reads no parameter
                    {{0, 200}}};   // everything
  EXPECT_EQ(pieces_read(g, reads), (Pieces{{0}, {0, 1}, {0, 3}, {2}, {}, {0, 1, 2, 3}}));
}

// The host optimizer's weight copies (Note [Host copies on the links]): pieces cut at parameter
// boundaries, here [10, 40), [40, 45), [45, 100) of the block (this rank's floats).
TEST(GatherOrder, AStepReadsTheWeightPiecesHoldingItsFloats) {
  const std::vector<int64_t> bounds{10, 40, 45, 100};
  const Reads reads{{{10, 40}},             // exactly piece 0
                    {{39, 41}},             // the last float of 0, the first of 1
                    {{0, 10}},              // before this rank's floats: no piece
                    {{44, 46}, {99, 120}},  // 1 and 2, and 2 again up to the range's end
                    {{100, 200}},           // past the end
                    {{0, 1000}}};           // everything
  EXPECT_EQ(pieces_read(bounds, reads), (Pieces{{0}, {0, 1}, {}, {1, 2}, {}, {0, 1, 2}}));
  EXPECT_EQ(pieces_read(std::vector<int64_t>{}, reads), Pieces(reads.size())) << "no pieces";
}

TEST(GatherOrder, PiecesGoInTheOrderTheForwardFirstReadsThem) {
  // The first layers' parameters lie at the start of the block: shard 0's first pieces.
  EXPECT_EQ(gather_order(4, Pieces{{0}, {0, 1}, {2}, {3}}), (std::vector<size_t>{0, 1, 2, 3}));
  // A later layer's parameters in shard 1's piece 0 do not delay piece 0; a piece read first by
  // a later step goes after, one no step reads goes last.
  EXPECT_EQ(gather_order(4, Pieces{{2}, {}, {0}, {3}}), (std::vector<size_t>{2, 0, 3, 1}));
}

}  // namespace
}  // namespace ferry
