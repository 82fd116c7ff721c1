// Where this rank runs: the topology (topology.file, or the live machine), the GPU and NUMA node
// it binds to, the bindings table of every local rank, and — on the live machine with
// topology.bind — the binding itself (threads and memory to the rank's NUMA node).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/ranks.h"
#include "links/fair_rates.h"
#include "topology/hwloc_topology.h"
#include "topology/links.h"
#include "topology/placement.h"
#include "trainer/config/config.h"

namespace ferry {

struct RankPlacement {
  RankBinding binding;  // this rank's
  std::string table;    // every local rank's, for the start-up banner
  std::string source;   // "live machine" or the file
  bool bound = false;   // threads and memory were bound
  // The bottleneck of the path between this rank's GPU and its NUMA node's memory (GB/s), 0
  // when the rank drives no GPU. A CPU-backend rank placed on a described server (topology.file)
  // emulates this link for its copies.
  double link_gbps = 0;
  std::string link_path;      // the links of that path, for the banner
  std::vector<int> link_ids;  // that path as ids into `links`
  // Every link of the topology (the node's shared link ledger); null when the rank drives no GPU.
  std::shared_ptr<const LinkMap> links;
  // The CUDA ordinal of binding.gpu, matched by PCI bus id between hwloc and CUDA (live machine,
  // cuda backend); nullopt elsewhere, where the GPU index stands for the ordinal.
  std::optional<int> cuda_ordinal;
  // The live machine, kept to bind pinned host blocks (topology.bind); null on a described
  // server or with topology.bind false.
  std::shared_ptr<const HwlocTopology> live;
};

// Places the local ranks of `ranks` on the topology and binds this process when asked and
// possible. GPU ranks (cuda), and CPU ranks emulating a described server (topology.file), each
// take a GPU. Call before creating the device, so its threads inherit the binding.
RankPlacement place_this_rank(const Config& config, const RankInfo& ranks);

// True when `config`'s CPU ranks stand in for the GPUs of its topology.file, their copies
// crossing that server's links slowed by topology.emulation_scale (device.copy_gbps unset).
bool emulates_server_links(const Config& config);

// The links of this rank's node as its node's link ledger holds them (placement.links, each with
// its capacity: topology.duplex_factor, and stretched by topology.emulation_scale when `emulated`,
// the CPU emulation's). Every rank computes them from its own node's topology, and the ledger's
// name from them (LinkLedger::node_name): nothing of another node goes into either, so the ranks
// of each node meet in their own node's ledger. Empty when the rank drives no GPU.
std::vector<NamedLink> node_ledger_links(const Config& config, const RankPlacement& placement,
                                         bool emulated);

// DeviceOptions::place_host_memory for this rank: on the live machine with topology.bind, binds
// each pinned host block to the rank's NUMA node (the GPU's) before its first touch, where the
// OS can bind memory areas (Note [Pinned pages on a NUMA node] in device/host_pages.h); empty
// otherwise.
std::function<void(void*, uint64_t)> host_memory_placement(const RankPlacement& placement);

}  // namespace ferry
