// What topo-probe prints: nvidia-smi's GPU/NIC matrix with CPU and NUMA affinity and legend,
// the tree grouped by root complex and switch with link bandwidths, and the JSON document.
// Invariant: every output is a pure function of the Topology and LinkMap (no hwloc, no I/O).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "topology/links.h"
#include "topology/model.h"

namespace ferry {

// The matrix over GPUs then NICs (rows GPU0.., NIC0..), "CPU Affinity" and "NUMA Affinity"
// columns for GPU rows, the legend and the NIC legend. Starts with "No NVIDIA GPU found." when
// there is none, and lists other vendors' GPUs as not used.
std::string format_matrix(const Topology& topology);

// The machine summary, then one block per root complex: its switches (nested by level), GPUs,
// NICs and other GPUs with each link's bandwidth; other PCI functions are counted; then the
// inter-socket links.
std::string format_tree(const Topology& topology, const LinkMap& links);

// {"gpus": [{"index", "pci", "vendor_id", "device_id", "name", "numa", "root_complex", "switch",
//  "link_gbps"}], "nics": [... same keys plus "kind", "os_name" and "rdma"],
//  "matrix": class_matrix(), "groups": {"root_complex": [[0,1],...], "switch": [[0,1],...]}}
// vendor_id/device_id are "0x10de" strings; numa is the local NUMA os index; root_complex and
// switch are indices (switch is the nearest one, null when none); link_gbps is null when
// unknown. Groups list, per root complex and per switch (any level), the GPUs below it.
nlohmann::json to_json(const Topology& topology, const LinkMap& links);

}  // namespace ferry
