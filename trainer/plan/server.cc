// Loading a described server and placing ranks on it.
#include "trainer/plan/server.h"

#include <fmt/format.h>

#include "common/error.h"
#include "topology/load.h"

namespace ferry {

Server load_server(const Config& config, const std::string& topology_file, int gpus,
                   const std::string& hardware) {
  const std::string file = topology_file.empty() ? config.topology.file : topology_file;
  if (file.empty())
    throw ConfigError("topology.file: the simulator needs a described server",
                      "set topology.file or pass --topology FILE (see configs/topologies/)");
  Server s{load_topology(file), {}, {}, {}};
  const int have = static_cast<int>(s.topology.gpus().size());
  if (have == 0)
    throw ConfigError(fmt::format("--topology: '{}' has no NVIDIA GPU to simulate", file),
                      "use a topology with GPUs (see configs/topologies/)");
  if (gpus < 0 || gpus > have)
    throw ConfigError(fmt::format("--gpus: {} GPUs asked, but '{}' has {}", gpus, file, have),
                      fmt::format("use --gpus 1 to {}", have));
  if (!hardware.empty()) s.profile = load_hardware_profile(hardware);
  PlacementOptions po;
  po.use_gpus = true;
  s.bindings = place_ranks(s.topology, gpus == 0 ? have : gpus, po);
  LinkOptions lo;
  lo.default_pcie_gbps = config.topology.unknown_link_gbps;
  s.links = node_links(s.topology, s.bindings, s.profile ? &*s.profile : nullptr, lo,
                       config.topology.duplex_factor);
  return s;
}

}  // namespace ferry
