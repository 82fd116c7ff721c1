// PCI vocabulary of the topology model: bus addresses (domain:bus:dev.fn), link speeds and the
// PCIe per-generation bandwidth table. An unknown link speed stays unknown (nullopt) here; only
// the link map (links.h) substitutes a configured default, so nothing ever divides by zero.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// A PCI function address. Bus numbers repeat across domains (POWER9 has one domain per host
// bridge), so devices are keyed by all four fields. Ordered as nvidia-smi orders GPUs.
struct PciAddress {
  uint32_t domain = 0;
  uint8_t bus = 0;
  uint8_t dev = 0;  // 0..31
  uint8_t fn = 0;   // 0..7

  // "0000:3b:00.0".
  std::string str() const;
  // Parses "0000:3b:00.0" or "3b:00.0" (domain 0); nullopt when malformed or out of range.
  static std::optional<PciAddress> parse(std::string_view text);

  auto operator<=>(const PciAddress&) const = default;
};

// Note [PCIe bandwidth table]
// Effective bandwidth of one lane in one direction, in GB/s (1e9 bytes/s), after line encoding:
//   gen1  2.5 GT/s, 8b/10b     -> 0.250       gen4 16 GT/s, 128b/130b -> 1.969
//   gen2  5.0 GT/s, 8b/10b     -> 0.500       gen5 32 GT/s, 128b/130b -> 3.938
//   gen3  8.0 GT/s, 128b/130b  -> 0.985       gen6 64 GT/s, FLIT 242/256 -> 7.563
// A link's bandwidth is lane rate x width (gen3 x16 = 15.754 GB/s). hwloc computes its
// `linkspeed` attribute the same way, so values read from hwloc are already in these units.
// Protocol overhead (TLP headers, flow control) is not subtracted: real copies reach ~80-90%.
inline constexpr int kPcieMaxGen = 6;

// Per-lane GB/s of a PCIe generation (1..6); nullopt for any other value.
std::optional<double> pcie_lane_gbps(int gen);
// gen x width in GB/s; nullopt when gen is unknown or width is not one of 1,2,4,8,12,16,32.
std::optional<double> pcie_link_gbps(int gen, int width);

// The speed of one PCIe link as it was reported or described. Every field may be unknown:
// hwloc 1.x exports (and some bridges) report 0, which is stored as nullopt.
struct LinkSpeed {
  std::optional<double> gbps;  // per direction, GB/s
  std::optional<int> gen;      // known only from a synthetic description
  std::optional<int> width;

  bool known() const { return gbps.has_value(); }
  // "15.75 GB/s (gen3 x16)", "15.75 GB/s", "unknown".
  std::string str() const;
};

// The largest link speed accepted from any file: above gen6 x32 (242 GB/s) with headroom.
inline constexpr double kMaxPlausibleLinkGbps = 1024.0;
// The smallest: 10 MB/s, below PCIe gen1 x1 (0.25 GB/s) with headroom. Slower links are beyond
// what the emulator and the simulator are tested with: a copy over a 1e-6 GB/s link outlasts any
// timeout, and one over 1e-300 GB/s takes longer than a double can count.
inline constexpr double kMinPlausibleLinkGbps = 0.01;
// Whether `gbps` is a link rate in [kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps].
inline bool plausible_link_gbps(double gbps) {
  return gbps >= kMinPlausibleLinkGbps && gbps <= kMaxPlausibleLinkGbps;
}

// "0-3,8,10-11" for a sorted list of indices; "" for an empty list.
std::string format_index_list(const std::vector<int>& sorted);
// Parses "0-3,8" into a sorted, duplicate-free list; nullopt when malformed, when a value exceeds
// `max_value`, or when the list would hold more than `max_count` entries.
std::optional<std::vector<int>> parse_index_list(std::string_view text, int max_value = 1 << 20,
                                                 size_t max_count = 1 << 16);

}  // namespace ferry
