// The link a rank's plan assumes: its own path or its fair share of the server's links.
#include "trainer/plan/assumed_link.h"

#include "sim/node_links.h"
#include "trainer/plan/server.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/config/enums.h"

namespace ferry {

namespace {

std::string scheduler_name(const Config& config) {
  return std::string(to_string(config.topology.scheduler));
}

}  // namespace

bool contention_aware(const Config& config) {
  return config.memory.policy == MemoryPolicy::kAuto && scheduler_name(config) == "topology";
}

AssumedLink assumed_link(const Config& config, const NodeLinks& links, int rank,
                         std::optional<bool> aware) {
  const EffectiveBandwidth out = effective_bandwidth(links, rank, TransferDirection::kToHost);
  const EffectiveBandwidth in = effective_bandwidth(links, rank, TransferDirection::kToDevice);
  AssumedLink a;
  a.contention_aware = aware.value_or(contention_aware(config));
  if (a.contention_aware) {
    a.gbps = std::min(out.shared_gbps, in.shared_gbps);
    a.why = fmt::format("contention-aware ({}): {}; {}",
                        aware ? "asked for" : "auto under the topology scheduler", out.why, in.why);
  } else {
    a.gbps = std::min(out.own_gbps, in.own_gbps);
    a.why = fmt::format(
        "oblivious ({}): the GPU's own path, {:.2f} GB/s to host, {:.2f} GB/s to device{}",
        aware ? "asked for"
        : config.memory.policy == MemoryPolicy::kAuto
            ? "auto under fifo"
            : std::string(policy_name(config.memory.policy)),
        out.own_gbps, in.own_gbps,
        out.sharers > 1 ? fmt::format(" ({} is shared by {} ranks: {:.2f} GB/s each when all copy)",
                                      out.bottleneck, out.sharers, out.shared_gbps)
                        : "");
  }
  return a;
}

std::optional<AssumedLink> training_link(const Config& config, int local_ranks, int local_rank) {
  if (!contention_aware(config) || config.topology.file.empty()) return std::nullopt;
  const Server server = load_server(config, "", local_ranks, "");
  return assumed_link(config, server.links, local_rank);
}

}  // namespace ferry
