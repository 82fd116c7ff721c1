// Loading the topology, placing ranks and binding.
#include "trainer/session/placement.h"

#include <fmt/format.h>

#include "topology/binding.h"
#include "topology/hwloc_topology.h"
#include "topology/load.h"

namespace ferry {

Placement place_this_rank(const Config& config, const RankInfo& ranks) {
  Placement p;
  const bool live = config.topology.file.empty();
  std::optional<HwlocTopology> machine;
  Topology topology = [&] {
    if (live) {
      machine.emplace(HwlocTopology::live());
      return machine->model();
    }
    return load_topology(config.topology.file);
  }();
  p.source = live ? "live machine" : config.topology.file;
  PlacementOptions options;
  // A CPU-backend rank drives no GPU even where the topology has some.
  options.use_gpus = config.device.backend == Backend::kCuda;
  const auto bindings = place_ranks(topology, ranks.local_size, options);
  p.binding = bindings[static_cast<size_t>(ranks.local_rank)];
  p.table = format_bindings(bindings);
  if (config.topology.bind && machine) {
    bind_process(*machine, p.binding);
    p.bound = true;
  }
  return p;
}

}  // namespace ferry
