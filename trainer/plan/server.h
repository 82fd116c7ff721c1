// A described server to plan for (topology.file or --topology): its topology, the ranks placed on
// it as training places them, their links, and optionally a hardware profile's rates.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/hardware_profile.h"
#include "sim/node_links.h"
#include "topology/model.h"
#include "topology/placement.h"
#include "trainer/config/config.h"

namespace ferry {

// A server to plan for: its topology, the ranks placed on it, their links, and the profile.
struct Server {
  Topology topology;
  std::vector<RankBinding> bindings;
  NodeLinks links;
  std::optional<HardwareProfile> profile;
};

// Loads `topology_file` (or config.topology.file) and places `gpus` ranks on it (0: one per
// GPU). Throws ConfigError for a missing topology, a topology without GPUs, more ranks than
// GPUs, or an unknown profile.
Server load_server(const Config& config, const std::string& topology_file, int gpus,
                   const std::string& hardware);

}  // namespace ferry
