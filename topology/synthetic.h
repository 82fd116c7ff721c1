// Topologies described in YAML, for servers this machine is not: a compact synthetic description
// or the model dump (Note [Synthetic topology YAML]). Invariant: a bad file raises ConfigError
// (file:line: what, with a hint) and never yields a partially built topology.
#pragma once

#include <string>

#include "topology/model.h"

namespace ferry {

// Note [Synthetic topology YAML]
// A compact synthetic description (configs/topologies/*.yaml) of sockets, NUMA nodes, root
// complexes, switch levels, GPUs and NICs, PCIe generation and width:
//   name: dgx1-like                  # optional
//   pcie: {gen: 3, width: 16}        # default link of every device and switch (default gen3 x16);
//                                    # {gbps: 12.5} states a bandwidth directly
//   inter_socket_gbps: 19.2          # optional, declared SMP link bandwidth
//   root_complex_gbps: 32            # optional, declared bandwidth of every root complex
//   sockets:
//     - count: 2                     # repeat this socket (every list entry takes `count`)
//       cores: 20                    # per socket; threads_per_core: 2
//       numa_nodes: 1                # CPU NUMA nodes per socket; cores split evenly
//       memory: 512GiB               # per socket, split evenly over its NUMA nodes
//       memory_only_numa_nodes: {count: 2, memory: 16GiB}   # CPU-less nodes (HBM, CXL)
//       root_complexes:
//         - numa: 0                  # attach to the socket's NUMA node 0 (default: the socket)
//           gbps: 64                 # optional, declared root complex bandwidth
//           domain: 0                # optional PCI domain (default 0)
//           gpus: 2                  # each on its own root port; or {count, name, vendor_id,
//                                    # device_id, pcie}
//           nics: {count: 1, kind: infiniband}   # kind: infiniband | ethernet; name, pcie
//           switches:
//             - count: 2
//               pcie: {gen: 3, width: 16}        # the switch's uplink, and default below it
//               gpus: 2
//               nics: 1
//               switches: [...]                  # a lower switch level
// Every root complex child sits on its own root port and every switch child on its own
// downstream port, so GPUs on one switch are PIX, on one switch tree PXB, on one root complex
// PHB. Bus numbers, NUMA os indices and CPU numbers are assigned in order, as Linux does.
//
// A model dump (topo-probe --dump-model) starts with `ferry_topology_model: 1` and lists
// packages, NUMA nodes (cores as CPU lists) and every PCI node with its parent index; any
// Topology round-trips through it. Both kinds load into the same Topology type as hwloc discovery.

// Loads a synthetic description or a model dump. Throws ConfigError.
Topology load_yaml(const std::string& path);
// The same from text; `name` stands for the file in messages.
Topology parse_yaml(const std::string& text, const std::string& name);

// The explicit model as YAML; load_yaml of it gives an equal model.
std::string dump_model_yaml(const Topology& topology);

}  // namespace ferry
