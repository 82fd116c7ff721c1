// How concurrent copies share links: max-min fair rates (progressive filling) of flows over links
// with a separate capacity per direction. Pure, no I/O. Invariant: on every link and direction
// the rates of the flows crossing it sum to at most its (duplex-reduced) capacity.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "prefetch/transfer_direction.h"

namespace ferry {

// One link's capacity in GB/s per direction.
struct LinkCapacity {
  double to_host_gbps = 0;
  double to_device_gbps = 0;
  // In (0, 1]: per-direction capacity multiplier while both directions of the link carry a flow.
  double duplex_factor = 1.0;
};

// A link as the ledger and the simulator know it: a name for reports and its capacity.
struct NamedLink {
  std::string name;
  LinkCapacity capacity;
};

// A copy in flight: the links it crosses (indices into the capacities) and its direction. A flow
// that changes direction on its way (an all-reduce hop from one GPU up to a switch and down to
// another) gives one direction per link in `link_directions`; empty: `direction` on every link.
struct Flow {
  std::vector<int> links;
  TransferDirection direction = TransferDirection::kToHost;
  std::vector<TransferDirection> link_directions;  // empty, or one per entry of `links`
};

// The direction `flow` crosses its i-th link in.
inline TransferDirection link_direction(const Flow& flow, std::size_t i) {
  return flow.link_directions.empty() ? flow.direction : flow.link_directions[i];
}

// Max-min fair (progressive filling) rate in GB/s of each flow given per-link per-direction
// capacities: every flow's rate is limited by some saturated link-direction on its path on which
// it has the largest rate. A flow crossing no link is unconstrained (+infinity); a link listed
// twice in one flow in one direction counts once. Throws std::out_of_range on a link index
// outside `links`, std::invalid_argument when link_directions is neither empty nor one per link.
std::vector<double> fair_rates(const std::vector<LinkCapacity>& links,
                               const std::vector<Flow>& flows);

// The capacity of `link` in `direction` given whether the other direction is busy.
double direction_capacity(const LinkCapacity& link, TransferDirection direction,
                          bool other_direction_busy);

}  // namespace ferry
