// From the topology's links to the link-share model: each link's capacity per direction (with the
// duplex factor, and divided by an emulation time scale), and the links of a rank's path that the
// topology scheduler arbitrates. Invariant: capacities are indexed by LinkMap link id.
#pragma once

#include <vector>

#include "links/fair_rates.h"
#include "topology/links.h"

namespace ferry {

// Every link of `map` as a LinkCapacity: gbps / time_scale in each direction, duplex_factor.
std::vector<LinkCapacity> link_capacities(const LinkMap& map, double duplex_factor = 1.0,
                                          double time_scale = 1.0);

// The host<->device path of `gpu` with its pinned memory on NUMA node `numa` (LinkMap::gpu_path:
// GPU link, switch uplinks, root complex, inter-socket link when the memory is on the other
// socket) and its bottleneck in each direction.
struct CopyPath {
  std::vector<int> links;
  double to_host_gbps = 0;
  double to_device_gbps = 0;
};
CopyPath copy_path(const LinkMap& map, const std::vector<LinkCapacity>& capacities, int gpu,
                   int numa);

// The links of `path` whose tokens a chunk takes: those one chunk alone can fill (capacity in
// that direction at most the path's bottleneck, within 0.1%). Wider links (a root complex that
// sums its ports) are left to fair sharing, so arbitration never idles them.
std::vector<int> arbitrated_links(const std::vector<LinkCapacity>& capacities,
                                  const std::vector<int>& path, TransferDirection direction);

// The same for a flow that turns around (an all-reduce hop: Flow::link_directions): the
// link-directions of which one chunk alone, at the flow's bottleneck rate, takes more than half,
// with their directions, in the flow's order. A fair share beside another chunk would slow it
// there; on a link it takes half of or less, a copy beside it costs it nothing and the token
// would only idle the rest (a GPU's link behind a narrow inter-socket link, a root complex).
// For a copy's path of equal links and a root complex twice as wide this is arbitrated_links.
Flow arbitrated_flow(const std::vector<LinkCapacity>& capacities, const Flow& flow);

}  // namespace ferry
