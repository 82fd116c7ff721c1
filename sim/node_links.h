// The links of a server as the simulator and the contention-aware planner see them: every link
// of the topology with a capacity per direction (a hardware profile's measured share of the raw
// PCIe rate, its duplex factor), each rank's host<->device copy path, and the ring all-reduce
// hops between consecutive ranks over PCIe. Invariant: every path and hop names links of
// `links`, and every capacity is > 0.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/hardware_profile.h"
#include "sim/node_sim.h"
#include "topology/links.h"
#include "topology/placement.h"

namespace ferry {

struct NodeLinks {
  std::vector<NamedLink> links;         // one per LinkMap link, same ids
  std::vector<std::string> kinds;       // link_kind_name of each
  std::vector<std::vector<int>> paths;  // per rank: GPU -> its NUMA node's memory
  std::vector<SimHop> ring;  // hop c*n+r: rank r's GPU to rank r+1's in channel c, over PCIe
  std::vector<int> gpus;     // per rank
};

// Builds the links for `bindings` (each with a GPU). With a profile, PCIe links run at their raw
// rate times the profile's efficiency per direction with its duplex factor (the GPU's own link
// at the profile's measured rate when that is lower); root complexes and inter-socket links
// keep their rate, full duplex. Without one, every link carries its rate both ways.
// `duplex_factor` (topology.duplex_factor) applies where no profile states one: every link
// without a profile, the PCIe links of a profile without link.duplex_factor.
NodeLinks node_links(const Topology& topology, const std::vector<RankBinding>& bindings,
                     const HardwareProfile* profile, const LinkOptions& options = {},
                     double duplex_factor = 1.0);

// Note [Ring channels]
// NCCL runs several channels (rings) inside a node too, over NVLink or PCIe, not only one per
// NIC across nodes. The simulator gives a job the same channel count on one node as on many
// (one per NIC the rings leave by, at least one); on one node every channel is the node's ring,
// and a second node only turns one hop of each channel out through a NIC. Peer traffic between
// two GPUs under one switch turns around in that switch, inside the node and across it alike:
// the node's own ring used to charge the root complex there too (kept for old README figures)
// while the hop out of the node did not, so two nodes predicted a shorter step than one for the
// same per-GPU work (issue 27 item 5).
int ring_channels(const Topology& topology);

// Note [Rings across nodes]
// A job over several identical nodes all-reduces as NCCL does across nodes: one ring through
// every GPU of the job per channel, one channel per network adapter (NIC), so that each channel
// leaves a node through its own NIC. Within a node a channel's hops are the node's ring hops;
// one hop leaves the node: from the channel's exit GPU up its PCIe path and down to the NIC,
// over the network link at the NIC's rate, and on the next node from that node's same NIC up
// and down to the channel's entry GPU. The nodes being identical, the simulator runs one node
// and lays that hop's far half on this node's links (the traffic entering this node through
// the NIC from the previous node is the same). A channel's exit and entry GPUs are the pair of
// ring neighbours that share most of their paths with the NIC (on a DGX-1, the two GPUs under
// the NIC's switch), so the hop crossing the node stays under one switch where it can.
//
// The ring hops of a job over `nodes` nodes laid out as `links` (one node's links, from
// node_links): channel c's hops are c*n .. c*n+n-1. Appends one network link per NIC used
// ("network NIC<k>", `nic_gbps` GB/s each way) to `links`. Uses the RDMA-capable NICs (all NICs
// when none is). ConfigError when the topology has no NIC, or `nic_gbps` is not > 0.
std::vector<SimHop> cross_node_rings(const Topology& topology,
                                     const std::vector<RankBinding>& bindings, NodeLinks& links,
                                     double nic_gbps, const LinkOptions& options = {});

// The bandwidth a rank can count on for its copies in one direction.
struct EffectiveBandwidth {
  double own_gbps = 0;     // its path alone (the bottleneck link's capacity)
  double shared_gbps = 0;  // its max-min fair share when every rank copies at once
  std::string bottleneck;  // the link that sets shared_gbps
  int sharers = 1;         // ranks whose copies cross that link
  std::string why;         // one line for `trainer plan`
};
EffectiveBandwidth effective_bandwidth(const NodeLinks& links, int rank, TransferDirection d);

}  // namespace ferry
