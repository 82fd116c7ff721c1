// The links of a server as the simulator and the contention-aware planner see them: every link
// of the topology with a capacity per direction (a hardware profile's measured share of the raw
// PCIe rate, its duplex factor), each rank's host<->device copy path, and the ring all-reduce
// hops between consecutive ranks over PCIe. Invariant: every path and hop names links of
// `links`, and every capacity is > 0.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/hardware_profile.h"
#include "sim/node_sim.h"
#include "topology/links.h"
#include "topology/placement.h"

namespace ferry {

struct NodeLinks {
  std::vector<NamedLink> links;         // one per LinkMap link, same ids
  std::vector<std::string> kinds;       // link_kind_name of each
  std::vector<std::vector<int>> paths;  // per rank: GPU -> its NUMA node's memory
  std::vector<SimHop> ring;             // hop r: rank r's GPU to rank r+1's, over PCIe
  std::vector<int> gpus;                // per rank
};

// Builds the links for `bindings` (each with a GPU). With a profile, PCIe links run at their raw
// rate times the profile's efficiency per direction with its duplex factor (the GPU's own link
// at the profile's measured rate when that is lower); root complexes and inter-socket links
// keep their rate, full duplex. Without one, every link carries its rate both ways.
// `duplex_factor` (topology.duplex_factor) applies where no profile states one: every link
// without a profile, the PCIe links of a profile without link.duplex_factor.
NodeLinks node_links(const Topology& topology, const std::vector<RankBinding>& bindings,
                     const HardwareProfile* profile, const LinkOptions& options = {},
                     double duplex_factor = 1.0);

// The bandwidth a rank can count on for its copies in one direction.
struct EffectiveBandwidth {
  double own_gbps = 0;     // its path alone (the bottleneck link's capacity)
  double shared_gbps = 0;  // its max-min fair share when every rank copies at once
  std::string bottleneck;  // the link that sets shared_gbps
  int sharers = 1;         // ranks whose copies cross that link
  std::string why;         // one line for `trainer plan`
};
EffectiveBandwidth effective_bandwidth(const NodeLinks& links, int rank, TransferDirection d);

}  // namespace ferry
