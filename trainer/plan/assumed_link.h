// The link bandwidth a rank's plan assumes for its copies, and why: its own path (oblivious) or
// its fair share when every rank of the server copies at once (contention-aware). Training,
// `trainer plan` and the simulator all ask here, so they assume the same link for a config.
#pragma once

#include <optional>
#include <string>

#include "trainer/config/config.h"

namespace ferry {

struct NodeLinks;  // sim/node_links.h: a server's links and the ranks' paths over them

// The link bandwidth the planner assumes for one rank's copies, and why.
struct AssumedLink {
  double gbps = 0;
  bool contention_aware = false;  // auto under the topology scheduler: its fair share
  std::string why;
};

// Whether a config plans against contended links: memory.policy auto with
// topology.scheduler topology (fifo is the oblivious baseline: the GPU's own link).
bool contention_aware(const Config& config);

// What `rank` may count on: the slower direction of its fair share when every rank copies at
// once (contention-aware), or of its own path (oblivious).
// `aware` overrides contention_aware(config).
AssumedLink assumed_link(const Config& config, const NodeLinks& links, int rank,
                         std::optional<bool> aware = std::nullopt);

// For a training rank on a described server (topology.file): the link its auto plan should
// assume when it plans contention-aware (its fair share with the other `local_ranks` ranks,
// placed as training places them), or nullopt when it plans oblivious. The session sets
// PlanOptions::cost.link_gbps from it (divided by the emulation's time scale on the CPU
// backend) and PlanOptions::keep_unhidden.
std::optional<AssumedLink> training_link(const Config& config, int local_ranks, int local_rank);

}  // namespace ferry
