// CUDA ordinals matched to the topology's GPUs by PCI bus id (issue 16: ranks took hwloc's index
// as their CUDA ordinal, so under CUDA_VISIBLE_DEVICES or CUDA's fastest-first order a rank got
// another GPU's NUMA node and link path). Strings as cudaDeviceGetPCIBusId writes them; no GPU.
#include "topology/bus_ids.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ferry {
namespace {

// Four GPUs in hwloc's PCI order.
std::vector<PciAddress> four_gpus() {
  return {*PciAddress::parse("0000:1a:00.0"), *PciAddress::parse("0000:3b:00.0"),
          *PciAddress::parse("0000:88:00.0"), *PciAddress::parse("0000:b1:00.0")};
}

TEST(TopologyGpusOfCuda, PciBusIdOrderIsTheIdentity) {
  EXPECT_EQ(topology_gpus_of_cuda(four_gpus(),
                                  {"0000:1A:00.0", "0000:3B:00.0", "0000:88:00.0", "0000:B1:00.0"}),
            (std::vector<int>{0, 1, 2, 3}));
}

TEST(TopologyGpusOfCuda, CudasOwnOrderIsFollowed) {
  // CUDA_DEVICE_ORDER=FASTEST_FIRST (the default) may enumerate in another order.
  EXPECT_EQ(topology_gpus_of_cuda(four_gpus(),
                                  {"0000:88:00.0", "0000:1A:00.0", "0000:B1:00.0", "0000:3B:00.0"}),
            (std::vector<int>{2, 0, 3, 1}));
}

TEST(TopologyGpusOfCuda, VisibleDevicesSubsetMapsOrdinalZeroToTheRightGpu) {
  // CUDA_VISIBLE_DEVICES=2,3: CUDA's ordinal 0 is hwloc's third GPU, not its first.
  EXPECT_EQ(topology_gpus_of_cuda(four_gpus(), {"0000:88:00.0", "0000:B1:00.0"}),
            (std::vector<int>{2, 3}));
}

TEST(TopologyGpusOfCuda, EightDigitDomainsAndCaseAreTheSameAddress) {
  EXPECT_EQ(topology_gpus_of_cuda(four_gpus(), {"00000000:b1:00.0", "00000000:3B:00.0"}),
            (std::vector<int>{3, 1}));
}

TEST(TopologyGpusOfCuda, AGpuTheTopologyLacksOrAMalformedIdIsMinusOne) {
  std::vector<PciAddress> gpus = four_gpus();
  gpus.push_back(*PciAddress::parse("0001:1a:00.0"));  // same bus in another domain
  EXPECT_EQ(
      topology_gpus_of_cuda(gpus, {"0000:1a:00.1", "0002:1a:00.0", "garbage", "", "0001:1A:00.0"}),
      (std::vector<int>{-1, -1, -1, -1, 4}));
  EXPECT_EQ(topology_gpus_of_cuda({}, {"0000:1a:00.0"}), (std::vector<int>{-1}));
  EXPECT_TRUE(topology_gpus_of_cuda(four_gpus(), {}).empty());
}

}  // namespace
}  // namespace ferry
