// The node simulator's model-state traffic (Note [Model state on the node] in sim/node_sim.h): a
// reduce-scatter and an all-gather each send (R-1)/R of their bytes over every hop, half an
// all-reduce; an all-gather opens the step and the step that needs it waits; a copy held by a
// bucket starts when the bucket's collective ends; a bucket held by an upload starts when it
// lands; with one rank the held copy goes after its issue_after step; bad dependencies throw.
#include <gtest/gtest.h>

#include <stdexcept>
#include <utility>

#include "sim/node_sim.h"

namespace ferry {
namespace {

// `n` GPUs, each alone on its own link (10 GB/s each way); the ring's hop r goes up GPU r's link
// and down GPU r+1's. Each rank runs `steps`.
NodeSimInput ring_of(int n, std::vector<double> steps) {
  NodeSimInput in;
  for (int r = 0; r < n; ++r) {
    in.links.push_back({"G" + std::to_string(r), {10, 10, 1.0}});
    in.ranks.push_back(SimRank{"GPU" + std::to_string(r), steps, {}, {}, {r}});
  }
  for (int r = 0; r < n; ++r) in.ring.push_back({{r}, {(r + 1) % n}});
  return in;
}

constexpr uint64_t kGB = 1'000'000'000ull;

TEST(NodeSimModelState, ReduceScatterAndAllGatherEachSendHalfAnAllReduce) {
  // 4 ranks, 4 GB: an all-reduce sends 2 * 3/4 * 4 = 6 GB per rank over its hop (0.6 s at
  // 10 GB/s); a reduce-scatter and an all-gather 3 GB each (0.3 s).
  NodeSimInput all_reduce = ring_of(4, {1e-6, 1e-6, 1e-6});
  all_reduce.buckets = {{4 * kGB, 1}};
  const NodeSimResult ar = simulate_node(all_reduce);
  NodeSimInput sharded = ring_of(4, {1e-6, 1e-6, 1e-6});
  sharded.buckets = {{4 * kGB, -1, SimCollective::kAllGather, 1},
                     {4 * kGB, 1, SimCollective::kReduceScatter, -1}};
  const NodeSimResult zero = simulate_node(sharded);
  EXPECT_DOUBLE_EQ(ar.allreduce_bytes, 6e9);
  EXPECT_DOUBLE_EQ(ar.reduce_scatter_bytes + ar.all_gather_bytes, 0);
  EXPECT_DOUBLE_EQ(zero.reduce_scatter_bytes, 3e9);
  EXPECT_DOUBLE_EQ(zero.all_gather_bytes, 3e9);
  EXPECT_DOUBLE_EQ(zero.allreduce_bytes, 0);
  EXPECT_NEAR(ar.step_seconds, 0.6, 1e-3);
  EXPECT_NEAR(zero.step_seconds, 0.6, 1e-3);  // 0.3 s before step 1, 0.3 s before the update
  // The all-gather opens the step: step 1 waits 0.3 s for it, the update 0.3 s for the rest.
  EXPECT_NEAR(zero.stall_seconds, 0.6, 1e-3);
  for (const SimLinkStats& l : zero.links) EXPECT_NEAR(l.to_host_bytes, 6e9, 1);
}

TEST(NodeSimModelState, TheStepThatNeedsAnAllGatherWaitsForItAndNoOtherDoes) {
  // The all-gather (1 GB per hop for 2 ranks, 0.1 s) is needed by step 2 only: step 1 (0.5 s)
  // runs meanwhile, and nothing stalls.
  NodeSimInput in = ring_of(2, {1e-6, 0.5, 1e-6, 1e-6});
  in.buckets = {{2 * kGB, -1, SimCollective::kAllGather, 2}};
  const NodeSimResult r = simulate_node(in);
  EXPECT_NEAR(r.step_seconds, 0.5, 1e-3);
  EXPECT_NEAR(r.stall_seconds, 0, 1e-9);
  in.buckets[0].needed_before = 1;
  const NodeSimResult early = simulate_node(in);
  EXPECT_NEAR(early.step_seconds, 0.6, 1e-3);
  EXPECT_NEAR(early.stall_seconds, 0.1, 1e-3);
}

TEST(NodeSimModelState, AHeldCopyStartsWhenItsBucketsCollectiveEnds) {
  // 2 ranks; the 2 GB all-reduce (2 GB per hop, 0.2 s) ends, then each rank's 1 GB gradient copy
  // to host (0.1 s alone) goes, from 0.2 s to 0.3 s. Issued with the bucket instead, it shares
  // the link's to-host side with the hop (5 GB/s each) and lands at 0.2 s.
  NodeSimInput in = ring_of(2, {1e-6, 1e-6, 1e-6});
  in.buckets = {{2 * kGB, 1}};
  in.trace = true;
  for (SimRank& r : in.ranks) {
    r.transfers = {{true, kGB, 1, 2}};
    r.transfer_after_bucket = {0};
  }
  // GPU0's copy to host: [begin, end] of its span.
  const auto copy_span = [](const NodeSimResult& r) {
    for (const SimSpan& s : r.spans)
      if (s.track == 1) return std::make_pair(s.begin, s.end);
    ADD_FAILURE() << "no copy span";
    return std::make_pair(-1.0, -1.0);
  };
  const NodeSimResult held = simulate_node(in);
  EXPECT_NEAR(held.step_seconds, 0.3, 1e-3);
  EXPECT_NEAR(copy_span(held).first, 0.2, 1e-3);
  EXPECT_NEAR(copy_span(held).second, 0.3, 1e-3);
  for (SimRank& r : in.ranks) r.transfer_after_bucket.clear();
  const NodeSimResult free = simulate_node(in);
  EXPECT_NEAR(copy_span(free).first, 0, 1e-3);
  EXPECT_NEAR(copy_span(free).second, 0.2, 1e-3);
  // Under topology the copy also waits for its bucket.
  for (SimRank& r : in.ranks) r.transfer_after_bucket = {0};
  in.topology_scheduler = true;
  EXPECT_NEAR(simulate_node(in).step_seconds, 0.3, 2e-3);
}

TEST(NodeSimModelState, AnAllGatherWaitsForEachRanksUpload) {
  // Each rank uploads its updated parameters over a host link of its own (10 GB/s), then the
  // all-gather (2 GB: 1 GB per hop, 0.1 s) runs before step 1. GPU1's upload is 3 GB (0.3 s), so
  // the all-gather starts at 0.3 s on both ranks and step 1 starts at 0.4 s; unheld, the
  // all-gather runs beside the uploads and step 1 starts when they land, at 0.3 s.
  NodeSimInput in = ring_of(2, {1e-6, 1e-6, 1e-6});
  for (int r = 0; r < 2; ++r) {
    in.links.push_back({"H" + std::to_string(r), {10, 10, 1.0}});
    in.ranks[static_cast<size_t>(r)].path = {2 + r};
  }
  in.buckets = {{2 * kGB, -1, SimCollective::kAllGather, 1}};
  in.ranks[0].transfers = {{false, kGB, -1, 1}};
  in.ranks[1].transfers = {{false, 3 * kGB, -1, 1}};
  for (SimRank& r : in.ranks) r.bucket_after_transfer = {0};
  const NodeSimResult r = simulate_node(in);
  EXPECT_NEAR(r.step_seconds, 0.4, 1e-3);
  EXPECT_NEAR(r.ranks[0].stall_seconds, 0.4, 1e-3);
  for (SimRank& x : in.ranks) x.bucket_after_transfer.clear();
  EXPECT_NEAR(simulate_node(in).step_seconds, 0.3, 1e-3);  // upload and all-gather at once
}

TEST(NodeSimModelState, WithOneRankAHeldCopyGoesAfterItsStep) {
  NodeSimInput in = ring_of(1, {0.5, 0.5, 1e-6});
  in.ring.clear();
  in.buckets = {{kGB, 0}};
  in.ranks[0].transfers = {{true, kGB, 0, 2}};  // after step 0: 0.1 s under step 1
  in.ranks[0].transfer_after_bucket = {0};
  const NodeSimResult r = simulate_node(in);
  EXPECT_NEAR(r.step_seconds, 1.0, 1e-3);
  EXPECT_NEAR(r.ranks[0].copy_bytes, 1e9, 1);
  EXPECT_DOUBLE_EQ(r.allreduce_bytes, 0);
}

TEST(NodeSimModelState, DependenciesNamingNothingAreRefused) {
  NodeSimInput in = ring_of(2, {1e-6, 1e-6});
  in.buckets = {{kGB, 0}};
  in.ranks[0].transfers = {{true, kGB, 0, 1}};
  in.ranks[0].transfer_after_bucket = {0, 0};  // two entries for one transfer
  EXPECT_THROW(simulate_node(in), std::invalid_argument);
  in.ranks[0].transfer_after_bucket = {1};  // no bucket 1
  EXPECT_THROW(simulate_node(in), std::invalid_argument);
  in.ranks[0].transfer_after_bucket = {-1};
  in.ranks[0].bucket_after_transfer = {3};  // no transfer 3
  EXPECT_THROW(simulate_node(in), std::invalid_argument);
  in.ranks[0].bucket_after_transfer = {0, 0};  // two entries for one bucket
  EXPECT_THROW(simulate_node(in), std::invalid_argument);
  in.ranks[0].bucket_after_transfer = {0};
  EXPECT_NO_THROW(simulate_node(in));
}

}  // namespace
}  // namespace ferry
