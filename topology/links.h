// The links host<->device traffic crosses, with bandwidths, for the link scheduler.
// Invariant: every Link has gbps > 0 (unknown speeds take a LinkOptions default and say so), and
// link ids are dense, deterministic for a given model and options, and ordered by kind.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topology/model.h"

// Note [Which links a topology has]
// Each GPU's and NIC's own uplink, each switch's uplink, each root complex, and each
// inter-socket link.

namespace ferry {

enum class LinkKind {
  kGpuUplink,     // a GPU's own PCIe link
  kNicUplink,     // a NIC's own PCIe link (shared by the functions of a multi-port NIC)
  kSwitchUplink,  // a switch's upstream link (towards the root port or an upper switch)
  kRootComplex,   // a host bridge to the memory controllers of its socket
  kInterSocket,   // the SMP interconnect between two packages (QPI/UPI/xGMI), one per pair
};
const char* link_kind_name(LinkKind kind);  // "gpu-uplink", "nic-uplink", "switch-uplink",
                                            // "root-complex", "inter-socket"

// Defaults for speeds no source states. See Note [PCIe bandwidth table] in pci.h.
struct LinkOptions {
  double default_pcie_gbps = 15.754;  // a PCIe link of unknown speed: gen3 x16
  // A root complex whose bandwidth is not declared: this value when set, else the sum of the
  // links right below it, so that by default a root complex is never the bottleneck.
  std::optional<double> root_complex_gbps;
  double inter_socket_gbps = 19.2;  // undeclared: one QPI link at 9.6 GT/s, per direction
};

struct Link {
  int id = 0;  // index into LinkMap::links()
  LinkKind kind = LinkKind::kGpuUplink;
  std::string name;    // "gpu-uplink GPU0 0000:34:00.0", "inter-socket package 0-1"
  double gbps = 0;     // per direction, > 0
  bool known = false;  // false when gbps is a default or derived figure
  std::string basis;   // where gbps came from: "15.75 GB/s", "gen3 x16", "default", ...
  int pci_node = -1;   // the node whose uplink this is (host bridge for a root complex), or -1
  int index = -1;      // first GPU or NIC, switch or root complex index; -1 for inter-socket
  int package_a = -1, package_b = -1;  // inter-socket only, package indices, a < b
  std::vector<int> gpus;  // GPUs that can put traffic on it: below it, or on either package
  std::vector<int> nics;
};

// All links of a Topology and the route of each device to each NUMA node's memory. Holds copies,
// not references: it may outlive the Topology it was built from.
class LinkMap {
 public:
  explicit LinkMap(const Topology& topology, const LinkOptions& options = {});

  const std::vector<Link>& links() const { return links_; }
  const Link& link(int id) const { return links_.at(id); }

  // Links a transfer between a GPU and the memory of NUMA node `numa` (os index) crosses, GPU
  // side first: gpu-uplink, switch-uplinks (nearest switch first), root-complex, and an
  // inter-socket link when the node is on another package than the root complex. Crossing NUMA
  // nodes inside one package is not modelled as a link. Throws ConfigError on a bad index.
  std::vector<int> gpu_path(int gpu, int numa) const;
  std::vector<int> nic_path(int nic, int numa) const;

  // The smallest bandwidth along a path (GB/s); 0 for an empty path.
  double bottleneck_gbps(const std::vector<int>& path) const;
  // Links both paths cross, in the order of `a`.
  static std::vector<int> shared(const std::vector<int>& a, const std::vector<int>& b);

  // For every link of `kind` with at least one GPU, the GPUs that share it, in link order.
  std::vector<std::vector<int>> gpu_groups(LinkKind kind) const;

  int gpu_uplink(int gpu) const;
  int nic_uplink(int nic) const;
  int switch_uplink(int sw) const;
  int root_complex_link(int rc) const;
  // The link between two packages (indices), -1 when a == b or either is out of range.
  int inter_socket_link(int package_a, int package_b) const;

 private:
  struct Route {
    std::vector<int> links;  // device uplink .. root complex
    std::vector<int> local_numa;
    int package = -1;
  };
  std::vector<int> route_to(const Route& route, int numa) const;

  std::vector<Link> links_;
  std::vector<Route> gpu_routes_, nic_routes_;
  std::vector<int> gpu_uplinks_, nic_uplinks_, switch_links_, rc_links_;
  std::vector<std::pair<int, int>> numa_package_;  // (os index, package index)
  int packages_ = 0;
  std::vector<int> inter_socket_;  // packages_ x packages_, -1 on the diagonal
  std::string topology_name_;
};

}  // namespace ferry
