// PCI addresses, the PCIe bandwidth table, CPU index lists and the path class order.
#include "topology/pci.h"

#include <gtest/gtest.h>

#include "topology/paths.h"

namespace ferry {
namespace {

TEST(PciAddress, FormatsAndParsesWithDomain) {
  const PciAddress a{0x35, 0x04, 0x00, 0x0};
  EXPECT_EQ(a.str(), "0035:04:00.0");
  EXPECT_EQ(PciAddress::parse("0035:04:00.0"), a);
  EXPECT_EQ(PciAddress::parse("3b:1f.7"), (PciAddress{0, 0x3b, 0x1f, 7}));
  EXPECT_EQ(PciAddress::parse("10000:00:00.0")->domain, 0x10000u);
}

TEST(PciAddress, RejectsMalformed) {
  EXPECT_FALSE(PciAddress::parse(""));
  EXPECT_FALSE(PciAddress::parse("0000:3b:00"));
  EXPECT_FALSE(PciAddress::parse("0000:3b:20.0"));  // device 32
  EXPECT_FALSE(PciAddress::parse("0000:3b:00.8"));  // function 8
  EXPECT_FALSE(PciAddress::parse("0000:100:00.0"));
  EXPECT_FALSE(PciAddress::parse("zz:00.0"));
  EXPECT_FALSE(PciAddress::parse("123456789:00:00.0"));
}

TEST(PciAddress, OrdersByDomainFirst) {
  // Bus 03 of domain 0035 comes after bus 05 of domain 0004 (POWER9: one domain per bridge).
  EXPECT_LT(*PciAddress::parse("0004:05:00.0"), *PciAddress::parse("0035:03:00.0"));
  EXPECT_LT(*PciAddress::parse("0000:4d:00.0"), *PciAddress::parse("0000:4d:00.1"));
}

TEST(PcieBandwidth, MatchesTheDocumentedTable) {
  EXPECT_DOUBLE_EQ(*pcie_lane_gbps(1), 0.25);
  EXPECT_DOUBLE_EQ(*pcie_lane_gbps(2), 0.5);
  EXPECT_NEAR(*pcie_lane_gbps(3), 0.985, 0.001);
  EXPECT_NEAR(*pcie_lane_gbps(4), 1.969, 0.001);
  EXPECT_NEAR(*pcie_lane_gbps(5), 3.938, 0.001);
  EXPECT_NEAR(*pcie_lane_gbps(6), 7.563, 0.001);
  // hwloc's linkspeed of a gen3 x16 GPU in the DGX-2 export is 15.753846.
  EXPECT_NEAR(*pcie_link_gbps(3, 16), 15.753846, 1e-5);
  EXPECT_NEAR(*pcie_link_gbps(5, 16), 63.015, 0.001);
  EXPECT_FALSE(pcie_lane_gbps(0));
  EXPECT_FALSE(pcie_lane_gbps(7));
  EXPECT_FALSE(pcie_link_gbps(3, 3));
}

TEST(LinkSpeed, UnknownIsExplicit) {
  LinkSpeed s;
  EXPECT_FALSE(s.known());
  EXPECT_EQ(s.str(), "unknown");
  s = LinkSpeed{pcie_link_gbps(4, 8), 4, 8};
  EXPECT_EQ(s.str(), "15.75 GB/s (gen4 x8)");
}

TEST(IndexList, RoundTrips) {
  EXPECT_EQ(format_index_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_index_list({}), "");
  EXPECT_EQ(parse_index_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_index_list("5,1,1"), (std::vector<int>{1, 5}));
  EXPECT_FALSE(parse_index_list("3-1"));
  EXPECT_FALSE(parse_index_list("1,,2"));
  EXPECT_FALSE(parse_index_list("0-99999999"));           // above the default maximum value
  EXPECT_FALSE(parse_index_list("0-1000", 1 << 20, 10));  // too many entries
}

TEST(PathClass, IsOrderedFromClosestToFarthest) {
  EXPECT_LT(PathClass::kPix, PathClass::kPxb);
  EXPECT_LT(PathClass::kPxb, PathClass::kPhb);
  EXPECT_LT(PathClass::kPhb, PathClass::kNode);
  EXPECT_LT(PathClass::kNode, PathClass::kSys);
  for (auto c :
       {PathClass::kPix, PathClass::kPxb, PathClass::kPhb, PathClass::kNode, PathClass::kSys}) {
    EXPECT_EQ(parse_path_class(path_class_name(c)), c);
  }
  EXPECT_FALSE(parse_path_class("NV2"));
}

}  // namespace
}  // namespace ferry
