// From the DGX-1-like topology to the link-share model: a GPU's copy path crosses its own link,
// its switch's uplink and its root complex (and the inter-socket link for memory on the other
// socket); the scheduler arbitrates only the links one chunk can fill; scale and duplex apply.
#include "links/link_capacities.h"

#include <gtest/gtest.h>

#include "topology/load.h"

namespace ferry {
namespace {

constexpr auto kH = TransferDirection::kToHost;

LinkMap dgx1() {
  return LinkMap(
      load_topology(std::string(FERRY_SOURCE_DIR) + "/configs/topologies/dgx1-like.yaml"));
}

TEST(LinkCapacities, Dgx1PathsShareSwitchUplinksAndArbitrateWhatOneChunkFills) {
  const LinkMap map = dgx1();
  const auto caps = link_capacities(map, 0.85, 100);
  ASSERT_EQ(caps.size(), map.links().size());
  for (const Link& l : map.links()) {
    EXPECT_DOUBLE_EQ(caps[static_cast<size_t>(l.id)].to_host_gbps, l.gbps / 100);
    EXPECT_DOUBLE_EQ(caps[static_cast<size_t>(l.id)].duplex_factor, 0.85);
  }
  const CopyPath p0 = copy_path(map, caps, 0, 0);
  const CopyPath p1 = copy_path(map, caps, 1, 0);
  ASSERT_EQ(p0.links.size(), 3u);  // gpu-uplink, switch-uplink, root-complex
  EXPECT_EQ(map.link(p0.links[0]).kind, LinkKind::kGpuUplink);
  EXPECT_EQ(map.link(p0.links[1]).kind, LinkKind::kSwitchUplink);
  EXPECT_EQ(map.link(p0.links[2]).kind, LinkKind::kRootComplex);
  EXPECT_EQ(LinkMap::shared(p0.links, p1.links),
            (std::vector<int>{p0.links[1], p0.links[2]}));  // GPUs 0 and 1 share a switch
  EXPECT_NEAR(p0.to_host_gbps, 0.15754, 1e-4);
  // The root complex sums its two switches: one chunk cannot fill it, so it is not arbitrated.
  EXPECT_EQ(arbitrated_links(caps, p0.links, kH), (std::vector<int>{p0.links[0], p0.links[1]}));
  // Pinned memory on the other socket adds the inter-socket link.
  const CopyPath far = copy_path(map, caps, 0, 1);
  ASSERT_EQ(far.links.size(), 4u);
  EXPECT_EQ(map.link(far.links[3]).kind, LinkKind::kInterSocket);
}

TEST(LinkCapacities, AHopIsArbitratedWhereOneChunkTakesMoreThanHalfOfALink) {
  // GPU1 -> GPU2 on the DGX-1-like server: up GPU1's link, its switch's uplink and the root
  // complex, down the other switch's uplink and GPU2's link. The root complex (two switches
  // wide) is left to fair sharing; the x16 links are each the bottleneck.
  const LinkMap map = dgx1();
  auto caps = link_capacities(map);
  const std::vector<int> up = map.gpu_path(1, 0), down = map.gpu_path(2, 0);
  ASSERT_EQ(up.size(), 3u);
  ASSERT_EQ(map.link(up[2]).kind, LinkKind::kRootComplex);
  constexpr auto kD = TransferDirection::kToDevice;
  const Flow hop{{up[0], up[1], up[2], down[1], down[0]}, kH, {kH, kH, kH, kD, kD}};
  const Flow a = arbitrated_flow(caps, hop);
  EXPECT_EQ(a.links, (std::vector<int>{up[0], up[1], down[1], down[0]}));
  EXPECT_EQ(a.link_directions, (std::vector<TransferDirection>{kH, kH, kD, kD}));
  // A to-device side a little slower than the to-host side (v100-pcie3: 12 against 12.5 GB/s)
  // leaves the to-host links arbitrated: a copy beside the chunk there would halve it.
  for (int l : {down[0], down[1]}) caps[static_cast<size_t>(l)].to_device_gbps *= 12.0 / 12.5;
  EXPECT_EQ(arbitrated_flow(caps, hop).links, a.links);
  // A link less than twice the bottleneck's rate is arbitrated; one more is not.
  caps[static_cast<size_t>(up[2])].to_host_gbps =
      1.9 * caps[static_cast<size_t>(down[0])].to_device_gbps;
  EXPECT_EQ(arbitrated_flow(caps, hop).links,
            (std::vector<int>{up[0], up[1], up[2], down[1], down[0]}));
  // Behind a narrow link (the H100 node's inter-socket link, 19.2 GB/s against 49 to 55) the
  // chunk takes that link only: the GPUs' links stay free for their copies.
  caps = link_capacities(map);
  caps[static_cast<size_t>(up[2])].to_host_gbps =
      0.35 * caps[static_cast<size_t>(up[0])].to_host_gbps;
  EXPECT_EQ(arbitrated_flow(caps, hop).links, (std::vector<int>{up[2]}));
}

}  // namespace
}  // namespace ferry
