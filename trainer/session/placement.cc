// Loading the topology, placing ranks and binding.
#include "trainer/session/placement.h"

#include <fmt/format.h>

#include "common/error.h"

#include "topology/binding.h"
#include "topology/hwloc_topology.h"
#include "topology/links.h"
#include "topology/load.h"

namespace ferry {

Placement place_this_rank(const Config& config, const RankInfo& ranks) {
  Placement p;
  const bool live = config.topology.file.empty();
  std::shared_ptr<HwlocTopology> machine;
  Topology topology = [&] {
    if (live) {
      machine = std::make_shared<HwlocTopology>(HwlocTopology::live());
      return machine->model();
    }
    return load_topology(config.topology.file);
  }();
  p.source = live ? "live machine" : config.topology.file;
  PlacementOptions options;
  // On the live machine a CPU-backend rank drives no GPU, even where it has some; on a described
  // server it stands in for one, to emulate that GPU's link.
  options.use_gpus = config.device.backend == Backend::kCuda || (!live && !topology.gpus().empty());
  const auto bindings = place_ranks(topology, ranks.local_size, options);
  p.binding = bindings[static_cast<size_t>(ranks.local_rank)];
  p.table = format_bindings(bindings);
  if (p.binding.gpu) {
    LinkOptions links;
    links.default_pcie_gbps = config.topology.unknown_link_gbps;
    const LinkMap map(topology, links);
    const std::vector<int> path = map.gpu_path(*p.binding.gpu, p.binding.numa);
    p.link_gbps = map.bottleneck_gbps(path);
    for (int id : path) {
      p.link_path += (p.link_path.empty() ? "" : " -> ") + map.link(id).name +
                     fmt::format(" ({:.2f} GB/s)", map.link(id).gbps);
    }
  }
  if (config.topology.bind && machine) {
    bind_process(*machine, p.binding);
    p.bound = true;
  }
  if (config.topology.bind) p.live = std::move(machine);
  return p;
}

std::function<void(void*, uint64_t)> host_memory_placement(const Placement& placement) {
  if (!placement.live || placement.binding.numa < 0) return {};
  return [live = placement.live, numa = placement.binding.numa](void* addr, uint64_t bytes) {
    try {
      bind_memory(*live, addr, static_cast<size_t>(bytes), numa);  // false: the OS cannot bind
    } catch (const LibraryError&) {
      // The machine refuses memory binding (some containers): the pages stay first-touch, as
      // they would without a placement. A node that does not exist is a ConfigError and passes.
    }
  };
}

}  // namespace ferry
