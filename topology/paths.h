// Path classes between PCI devices in nvidia-smi's words, ordered from closest to farthest
// (PIX < PXB < PHB < NODE < SYS). The common ancestor is found by walking the model's own tree,
// never hwloc's objects (hwloc_get_common_ancestor_obj crashes on some I/O objects in 2.9).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topology/model.h"

namespace ferry {

// Note [Path classes]
//   PIX  the lowest common ancestor (LCA) is a PCI bridge with at most one bridge between it
//        and each device (two GPUs on one switch, or functions of one card)
//   PXB  the LCA is a PCI bridge deeper than that (GPUs on different switches of a switch tree)
//   PHB  the LCA is the host bridge (same root complex, e.g. two root ports of one CPU)
//   NODE different host bridges whose NUMA localities intersect (same NUMA node or socket)
//   SYS  different host bridges on different NUMA nodes (crosses the SMP interconnect or, under
//        sub-NUMA clustering, the socket's mesh between NUMA domains)
// NCCL prints PHB where this says NODE. NVLink is not part of these classes.
enum class PathClass : unsigned char { kPix = 0, kPxb, kPhb, kNode, kSys };

const char* path_class_name(PathClass c);  // "PIX", ...
std::optional<PathClass> parse_path_class(std::string_view name);
// The nvidia-smi legend line for a class ("Connection traversing at most a single PCIe bridge").
const char* path_class_legend(PathClass c);

// Class of the path between two PCI nodes (indices into topology.pci()); nullopt when a == b.
std::optional<PathClass> path_class(const Topology& topology, int node_a, int node_b);

// Class between two distinct GPUs (indices into gpus()). Throws ConfigError on a bad index or
// when gpu_a == gpu_b.
PathClass gpu_pair_class(const Topology& topology, int gpu_a, int gpu_b);
// Class between a GPU and a NIC (indices into gpus() and nics()).
PathClass gpu_nic_class(const Topology& topology, int gpu, int nic);

// nvidia-smi's matrix over the GPUs then the NICs, in that order: "X" on the diagonal, class
// names elsewhere. Square, size gpus().size() + nics().size().
std::vector<std::vector<std::string>> class_matrix(const Topology& topology);

}  // namespace ferry
