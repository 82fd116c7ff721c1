// Rings across nodes (Note [Rings across nodes] in sim/node_links.h): one channel per NIC, whose
// hop out of the node goes from the GPUs under that NIC's switch through the NIC and the network
// link; the simulator carries 2(R-1)/R of each bucket over every hop for a job of R ranks, split
// evenly over the channels, and counts that traffic on the NICs' links and the switch uplinks,
// under fifo and in the topology scheduler's chunks alike.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"
#include "sim/node_links.h"
#include "sim/node_sim.h"
#include "topology/load.h"

namespace ferry {
namespace {

Topology topology(const std::string& name) {
  return load_topology(std::string(FERRY_SOURCE_DIR) + "/configs/topologies/" + name + ".yaml");
}

bool has(const std::vector<int>& links, int l) {
  return std::find(links.begin(), links.end(), l) != links.end();
}

TEST(NodeRings, OneChannelPerNicLeavingThroughTheGpusUnderItsSwitch) {
  const Topology topo = topology("dgx1-like");
  const auto bindings = place_ranks(topo, 8);
  NodeLinks nl = node_links(topo, bindings, nullptr);
  const size_t node_links_count = nl.links.size();
  const std::vector<SimHop> ring = cross_node_rings(topo, bindings, nl, 12.5);
  ASSERT_EQ(topo.nics().size(), 4u);
  ASSERT_EQ(ring.size(), 4u * 8u) << "4 channels of 8 hops";
  ASSERT_EQ(nl.links.size(), node_links_count + 4) << "one network link per NIC";
  const LinkMap map(topo);
  for (int k = 0; k < 4; ++k) {
    const int wire = static_cast<int>(node_links_count) + k;
    EXPECT_EQ(nl.links[static_cast<size_t>(wire)].name, "network NIC" + std::to_string(k));
    EXPECT_EQ(nl.links[static_cast<size_t>(wire)].capacity.to_device_gbps, 12.5);
    EXPECT_EQ(nl.kinds[static_cast<size_t>(wire)], "network");
    int crossings = 0;
    for (int r = 0; r < 8; ++r) {
      const SimHop& h = ring[static_cast<size_t>(k * 8 + r)];
      if (!has(h.down, wire)) {
        // Inside the node: the node's own ring hop.
        EXPECT_EQ(h.up, nl.ring[static_cast<size_t>(r)].up) << k << "/" << r;
        EXPECT_TRUE(h.then_up.empty() && h.then_down.empty());
        continue;
      }
      ++crossings;
      // GPUs 2k and 2k+1 share NIC k's switch: out of GPU 2k, in to GPU 2k+1.
      EXPECT_EQ(r, 2 * k);
      EXPECT_TRUE(has(h.up, map.gpu_uplink(2 * k)));
      EXPECT_TRUE(has(h.down, map.nic_uplink(k)));
      EXPECT_TRUE(has(h.then_up, map.nic_uplink(k)));
      EXPECT_TRUE(has(h.then_down, map.gpu_uplink(2 * k + 1)));
      for (const auto* part : {&h.up, &h.down, &h.then_up, &h.then_down}) {
        for (int l : *part) {
          if (l == wire) continue;  // not a PCIe link
          EXPECT_NE(map.link(l).kind, LinkKind::kRootComplex) << "stays under the switch";
        }
      }
    }
    EXPECT_EQ(crossings, 1) << "channel " << k;
  }
}

TEST(NodeRings, AJobOfRRanksSendsTwoRMinusOneOverROfEachBucketPerHop) {
  const Topology topo = topology("dgx1-like");
  const auto bindings = place_ranks(topo, 8);
  NodeLinks nl = node_links(topo, bindings, nullptr);
  NodeSimInput in;
  in.ring = cross_node_rings(topo, bindings, nl, 12.5);
  in.links = nl.links;
  in.job_ranks = 16;                               // two nodes
  in.buckets = {SimBucket{uint64_t{1} << 30, 0}};  // ready after step 0, before the update
  for (int r = 0; r < 8; ++r) {
    SimRank rank;
    rank.name = "GPU" + std::to_string(r);
    rank.step_seconds = {0.001, 0.001};
    rank.path = nl.paths[static_cast<size_t>(r)];
    in.ranks.push_back(rank);
  }
  const double per_hop = 2.0 * 15 / 16 * static_cast<double>(uint64_t{1} << 30);
  const LinkMap map(topo);
  double seconds[2] = {0, 0};
  for (bool topology_scheduler : {false, true}) {
    SCOPED_TRACE(topology_scheduler ? "topology" : "fifo");
    in.topology_scheduler = topology_scheduler;  // arbitrated in chunks: the same bytes
    const NodeSimResult res = simulate_node(in);
    seconds[topology_scheduler] = res.step_seconds;
    EXPECT_DOUBLE_EQ(res.allreduce_bytes, per_hop);
    // Each NIC carries its channel's share out (towards the NIC) and in.
    for (int k = 0; k < 4; ++k) {
      const SimLinkStats& uplink = res.links[static_cast<size_t>(map.nic_uplink(k))];
      EXPECT_NEAR(uplink.to_device_bytes, per_hop / 4, 1.0) << k;
      EXPECT_NEAR(uplink.to_host_bytes, per_hop / 4, 1.0) << k;
      const SimLinkStats& wire = res.links[nl.links.size() - 4 + static_cast<size_t>(k)];
      EXPECT_NEAR(wire.to_device_bytes, per_hop / 4, 1.0) << k;
    }
    // Every switch uplink carries the four channels' hop from its last GPU to the next
    // switch's first, and their hop in from the previous switch.
    for (const Link& l : map.links()) {
      if (l.kind != LinkKind::kSwitchUplink) continue;
      EXPECT_NEAR(res.links[static_cast<size_t>(l.id)].to_host_bytes, per_hop, 1.0) << l.name;
      EXPECT_NEAR(res.links[static_cast<size_t>(l.id)].to_device_bytes, per_hop, 1.0) << l.name;
    }
    // The network links bound the step: a quarter of 1.875 GiB at 12.5 GB/s, at least.
    EXPECT_GE(res.step_seconds, per_hop / 4 / 12.5e9);
  }
  // Alone on the links, the all-reduce is no slower in chunks: a ring position's channels move
  // together, as they share its links under fifo (Note [All-reduce chunks on arbitrated links]
  // in sim/node_sim.h). One claim per hop serialised the channels and lost 1-2% of the
  // all-reduce's time on this server, whose root complexes (not arbitrated) are its bottleneck.
  EXPECT_NEAR(seconds[1], seconds[0], 1e-6 * seconds[0]);
}

TEST(NodeRings, NoNicOrNoNetworkRateIsAnError) {
  const Topology topo = topology("dgx1-like");
  const auto bindings = place_ranks(topo, 8);
  NodeLinks nl = node_links(topo, bindings, nullptr);
  EXPECT_THROW(cross_node_rings(topo, bindings, nl, 0.0), ConfigError);
}

}  // namespace
}  // namespace ferry
