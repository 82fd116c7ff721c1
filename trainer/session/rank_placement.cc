// Loading the topology, placing ranks and binding.
#include "trainer/session/rank_placement.h"

#include <fmt/format.h>

#include "common/error.h"
#include "device/backend_traits.h"
#include "links/link_capacities.h"

#include "topology/binding.h"
#include "topology/bus_ids.h"
#include "topology/hwloc_topology.h"
#include "topology/links.h"
#include "topology/load.h"

namespace ferry {

namespace {

// Emulated links must have a speed the description states: a link of zero or unknown speed on
// any local rank's path would make the emulation (and the schedule) meaningless.
void check_emulated_links(const Config& config, const LinkMap& map,
                          const std::vector<RankBinding>& bindings) {
  for (const RankBinding& b : bindings) {
    if (!b.gpu) continue;
    for (int id : map.gpu_path(*b.gpu, b.numa)) {
      const Link& l = map.link(id);
      if (l.gbps <= 0) {
        throw ConfigError(
            fmt::format("topology.file: link '{}' on GPU{}'s path has zero speed ({})", l.name,
                        *b.gpu, config.topology.file),
            "give the link a positive speed (gen and width, or gbps) in the topology file");
      }
      if (l.basis.rfind("unknown, default", 0) == 0) {
        throw ConfigError(
            fmt::format("topology.file: link '{}' on GPU{}'s path has unknown speed ({}); the "
                        "emulation needs every speed stated",
                        l.name, *b.gpu, config.topology.file),
            "state the link's speed (gen and width, or gbps) in the topology file");
      }
    }
  }
}

}  // namespace

RankPlacement place_this_rank(const Config& config, const RankInfo& ranks) {
  RankPlacement p;
  const bool live = config.topology.file.empty();
  std::shared_ptr<HwlocTopology> machine;
  Topology topology = [&] {
    if (live) {
      machine = std::make_shared<HwlocTopology>(HwlocTopology::live());
      return machine->model();
    }
    try {
      return load_topology(config.topology.file);
    } catch (const Error& e) {
      // Name the key: the file is where the mistake is, but the key is what the user set.
      if (std::string_view(e.what()).rfind("topology.file", 0) == 0) throw;
      throw ConfigError(fmt::format("topology.file: {}", e.what()), e.hint());
    }
  }();
  p.source = live ? "live machine" : config.topology.file;
  PlacementOptions options;
  // On the live machine a CPU-backend rank drives no GPU, even where it has some; on a described
  // server it stands in for one, to emulate that GPU's link.
  const bool real_gpus = backend_traits(config.device.backend).real_gpus;
  options.use_gpus = real_gpus || (!live && !topology.gpus().empty());
  const bool emulate = !real_gpus && !live;
  if (config.topology.scheduler == LinkSchedulerKind::kTopology && !emulate && !real_gpus) {
    throw ConfigError(
        "topology.scheduler: topology needs topology.file (the server whose links the CPU ranks "
        "emulate) or device.backend=cuda",
        "use topology.scheduler=fifo, or set topology.file with device.backend=cpu");
  }
  // Note [A rank's GPU by PCI bus id]
  // On the live machine local rank r drives CUDA device r, and the topology's GPU at the same
  // PCI bus id gives its NUMA node and link path: hwloc lists every GPU in PCI order, while CUDA
  // may enumerate fastest first and CUDA_VISIBLE_DEVICES hides some, so hwloc's index is not an
  // ordinal.
  const bool match_cuda = live && real_gpus && !topology.gpus().empty();
  const std::vector<std::string> bus_ids =
      match_cuda ? cuda_pci_bus_ids() : std::vector<std::string>{};
  if (!bus_ids.empty()) {
    if (ranks.local_size > static_cast<int>(bus_ids.size())) {
      throw ConfigError(fmt::format("{} local ranks but CUDA shows only {} GPU(s)",
                                    ranks.local_size, bus_ids.size()),
                        "run at most one rank per visible GPU (see CUDA_VISIBLE_DEVICES)");
    }
    std::vector<PciAddress> addrs;
    for (const PciEndpoint& gpu : topology.gpus()) addrs.push_back(gpu.addr);
    const std::vector<int> of_cuda = topology_gpus_of_cuda(addrs, bus_ids);
    for (int r = 0; r < ranks.local_size; ++r) {
      if (of_cuda[static_cast<size_t>(r)] < 0) {
        throw ConfigError(
            fmt::format("CUDA device {} (PCI {}) is not among the {} GPU(s) hwloc shows", r,
                        bus_ids[static_cast<size_t>(r)], topology.gpus().size()),
            "check that hwloc sees PCI devices (its PCI plugin, HWLOC_PLUGINS_PATH), or set "
            "topology.file to the server's description");
      }
      options.gpus.push_back(of_cuda[static_cast<size_t>(r)]);
    }
    p.cuda_ordinal = ranks.local_rank;
  }
  const auto bindings = [&] {
    try {
      return place_ranks(topology, ranks.local_size, options);
    } catch (const ConfigError& e) {
      if (live) throw;
      throw ConfigError(fmt::format("topology.file: {}", e.what()), e.hint());
    }
  }();
  p.binding = bindings[static_cast<size_t>(ranks.local_rank)];
  p.table = format_bindings(bindings);
  if (p.binding.gpu) {
    LinkOptions links;
    links.default_pcie_gbps = config.topology.unknown_link_gbps;
    const LinkMap map(topology, links);
    const std::vector<int> path = map.gpu_path(*p.binding.gpu, p.binding.numa);
    if (emulate) check_emulated_links(config, map, bindings);
    p.link_ids = path;
    p.links = std::make_shared<const LinkMap>(map);
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

bool emulates_server_links(const Config& config) {
  return !backend_traits(config.device.backend).real_gpus && config.device.copy_gbps == 0 &&
         !config.topology.file.empty();
}

std::function<void(void*, uint64_t)> host_memory_placement(const RankPlacement& placement) {
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

std::vector<NamedLink> node_ledger_links(const Config& config, const RankPlacement& placement,
                                         bool emulated) {
  std::vector<NamedLink> links;
  if (!placement.links) return links;
  const std::vector<LinkCapacity> capacities =
      link_capacities(*placement.links, config.topology.duplex_factor,
                      emulated ? config.topology.emulation_scale : 1.0);
  for (const Link& l : placement.links->links())
    links.push_back(NamedLink{l.name, capacities[static_cast<size_t>(l.id)]});
  return links;
}

}  // namespace ferry
