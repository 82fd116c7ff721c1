// Validation of TopologyData and derivation of the consumer views (GPUs, NICs, root complexes,
// switches, NUMA locality). Nothing here touches hwloc: it works on the plain tree only.
#include "topology/model.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

constexpr size_t kMaxPciNodes = 1 << 16;
constexpr size_t kMaxNumaNodes = 4096;
constexpr size_t kMaxPackages = 1024;
constexpr int kMaxCpuIndex = 1 << 20;

DataError bad(const TopologyData& d, const std::string& what) {
  return DataError(fmt::format("topology '{}' ({}) is inconsistent: {}", d.name, d.source, what),
                   "regenerate the file (lstopo --of xml, or topo-probe --dump-model) or fix the "
                   "description");
}

bool sorted_unique(const std::vector<int>& v) {
  return std::adjacent_find(v.begin(), v.end(), [](int a, int b) { return a >= b; }) == v.end();
}

}  // namespace

bool is_display(uint16_t class_id) { return (class_id >> 8) == 0x03; }
bool is_network(uint16_t class_id) { return (class_id >> 8) == 0x02; }
bool is_nvidia_gpu(uint16_t vendor_id, uint16_t class_id) {
  return vendor_id == kNvidiaVendor && is_display(class_id);
}

const char* nic_kind_name(NicKind kind) {
  switch (kind) {
    case NicKind::kInfiniband:
      return "infiniband";
    case NicKind::kEthernet:
      return "ethernet";
    case NicKind::kOther:
      return "network";
  }
  return "network";
}

Topology::Topology(TopologyData data) : data_(std::move(data)) {
  validate();
  derive();
}

void Topology::validate() const {
  const auto& d = data_;
  if (d.packages.size() > kMaxPackages) throw bad(d, fmt::format("{} packages", d.packages.size()));
  if (d.numa_nodes.empty()) throw bad(d, "no NUMA node");
  if (d.numa_nodes.size() > kMaxNumaNodes) {
    throw bad(d, fmt::format("{} NUMA nodes", d.numa_nodes.size()));
  }
  if (d.pci.size() > kMaxPciNodes) throw bad(d, fmt::format("{} PCI nodes", d.pci.size()));
  if (d.inter_socket_gbps && !plausible_link_gbps(*d.inter_socket_gbps)) {
    throw bad(d, fmt::format("inter-socket bandwidth {:.3g} GB/s is outside [{}, {}] GB/s",
                             *d.inter_socket_gbps, kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps));
  }
  std::set<int> package_ids;
  for (const auto& p : d.packages) {
    if (p.os_index < 0 || !package_ids.insert(p.os_index).second) {
      throw bad(d, fmt::format("package os index {} repeated or negative", p.os_index));
    }
  }
  std::set<int> numa_ids, cpu_ids;
  bool any_cpus = false;
  for (const auto& n : d.numa_nodes) {
    if (n.os_index < 0 || !numa_ids.insert(n.os_index).second) {
      throw bad(d, fmt::format("NUMA node os index {} repeated or negative", n.os_index));
    }
    if (n.package < -1 || n.package >= static_cast<int>(d.packages.size())) {
      throw bad(d, fmt::format("NUMA node {} refers to package {}", n.os_index, n.package));
    }
    for (const auto& core : n.cores) {
      if (core.empty())
        throw bad(d, fmt::format("NUMA node {} has a core without PUs", n.os_index));
      for (int pu : core) {
        if (pu < 0 || pu > kMaxCpuIndex) throw bad(d, fmt::format("PU index {}", pu));
        if (!cpu_ids.insert(pu).second) {
          throw bad(d, fmt::format("PU {} belongs to two cores or NUMA nodes", pu));
        }
        any_cpus = true;
      }
    }
  }
  if (!any_cpus) throw bad(d, "no NUMA node has CPUs");
  std::set<PciAddress> addresses;
  for (size_t i = 0; i < d.pci.size(); ++i) {
    const auto& n = d.pci[i];
    const bool host = n.kind == PciKind::kHostBridge;
    if (host != (n.parent == -1)) {
      throw bad(d, fmt::format("PCI node {} ({}) {}", i, n.addr.str(),
                               host ? "is a host bridge with a parent" : "has no host bridge"));
    }
    if (!host) {
      if (n.parent < 0 || n.parent >= static_cast<int>(i)) {
        throw bad(d,
                  fmt::format("PCI node {} has parent {} (parents must come first)", i, n.parent));
      }
      if (d.pci[n.parent].kind == PciKind::kDevice) {
        throw bad(d, fmt::format("PCI {} sits below device {}", n.addr.str(),
                                 d.pci[n.parent].addr.str()));
      }
      if (!addresses.insert(n.addr).second) {
        throw bad(d, fmt::format("two PCI functions at {}", n.addr.str()));
      }
    } else {
      const auto& loc = n.locality;
      if (loc.package < -1 || loc.package >= static_cast<int>(d.packages.size())) {
        throw bad(d, fmt::format("host bridge {} refers to package {}", n.addr.str(), loc.package));
      }
      if (!sorted_unique(loc.numa) || !sorted_unique(loc.cpus)) {
        throw bad(d, fmt::format("host bridge {} locality lists are not sorted", n.addr.str()));
      }
      for (int numa : loc.numa) {
        if (!numa_ids.count(numa)) {
          throw bad(d, fmt::format("host bridge {} is local to NUMA node {}, which does not exist",
                                   n.addr.str(), numa));
        }
      }
      if (n.root_complex_gbps && !plausible_link_gbps(*n.root_complex_gbps)) {
        throw bad(d,
                  fmt::format("root complex bandwidth {:.3g} GB/s is outside [{}, {}] GB/s",
                              *n.root_complex_gbps, kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps));
      }
    }
    if (n.link.gbps && !plausible_link_gbps(*n.link.gbps)) {
      throw bad(d,
                fmt::format("PCI {} link speed {:.3g} GB/s is outside [{}, {}] GB/s", n.addr.str(),
                            *n.link.gbps, kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps));
    }
  }
}

// Note [Which bridges are switches]
// hwloc shows a PCIe switch as an upstream-port bridge whose children are its downstream-port
// bridges; the bridge right below a host bridge is a root port. Counting bridges from the host
// bridge (root port = 1), bridges alternate: root port (1), switch upstream (2), downstream (3),
// next switch upstream (4), downstream (5), as in the DGX-2's two switch levels. So a switch is a
// bridge at an even depth that has at least one bridge child; an even-depth bridge with only
// endpoints below it is a PCIe-to-PCI bridge (a BMC's VGA), not a switch. Physical links are the
// uplinks of endpoints and of switch upstream ports; the root port and downstream ports are the
// inside of a root complex or switch.
void Topology::derive() {
  auto& pci = data_.pci;
  const int n = static_cast<int>(pci.size());
  for (auto& node : pci) node.children.clear();
  for (int i = 0; i < n; ++i) {
    if (pci[i].parent >= 0) pci[pci[i].parent].children.push_back(i);
  }
  // Packages and NUMA cpus.
  for (auto& p : data_.packages) {
    p.numa.clear();
    p.cpus.clear();
  }
  for (auto& numa : data_.numa_nodes) {
    numa.cpus.clear();
    for (const auto& core : numa.cores) numa.cpus.insert(numa.cpus.end(), core.begin(), core.end());
    std::sort(numa.cpus.begin(), numa.cpus.end());
    if (numa.package >= 0) {
      auto& p = data_.packages[numa.package];
      p.numa.push_back(numa.os_index);
      p.cpus.insert(p.cpus.end(), numa.cpus.begin(), numa.cpus.end());
    }
  }
  for (auto& p : data_.packages) {
    std::sort(p.numa.begin(), p.numa.end());
    std::sort(p.cpus.begin(), p.cpus.end());
  }

  // Root complexes, in address order.
  std::vector<int> hosts;
  for (int i = 0; i < n; ++i) {
    if (pci[i].kind == PciKind::kHostBridge) hosts.push_back(i);
  }
  std::stable_sort(hosts.begin(), hosts.end(), [&](int a, int b) {
    return std::tie(pci[a].addr.domain, pci[a].addr.bus) <
           std::tie(pci[b].addr.domain, pci[b].addr.bus);
  });
  rc_of_node_.assign(n, -1);
  root_complexes_.clear();
  for (int h : hosts) {
    RootComplex rc;
    rc.index = static_cast<int>(root_complexes_.size());
    rc.node = h;
    rc.addr = pci[h].addr;
    rc.bus_last = pci[h].bus_last;
    rc.label =
        pci[h].implicit
            ? fmt::format("{:04x}:[{:02x}] (implicit)", rc.addr.domain, rc.addr.bus)
            : fmt::format("{:04x}:[{:02x}-{:02x}]", rc.addr.domain, rc.addr.bus, rc.bus_last);
    rc.locality = pci[h].locality;
    rc.gbps = pci[h].root_complex_gbps;
    rc_of_node_[h] = rc.index;
    root_complexes_.push_back(std::move(rc));
  }

  // Depths and switches, in tree order (parents come first).
  depth_.assign(n, 0);
  switch_of_node_.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    const auto& node = pci[i];
    if (node.parent < 0) continue;
    rc_of_node_[i] = rc_of_node_[node.parent];
    depth_[i] = depth_[node.parent] + (node.kind == PciKind::kBridge ? 1 : 0);
  }
  // Number switches in address order so indices do not depend on the file's child order.
  std::vector<int> switch_nodes;
  for (int i = 0; i < n; ++i) {
    const auto& node = pci[i];
    if (node.kind != PciKind::kBridge || depth_[i] % 2 != 0) continue;
    const bool has_bridge_child =
        std::any_of(node.children.begin(), node.children.end(),
                    [&](int c) { return pci[c].kind == PciKind::kBridge; });
    if (has_bridge_child) switch_nodes.push_back(i);
  }
  std::stable_sort(switch_nodes.begin(), switch_nodes.end(),
                   [&](int a, int b) { return pci[a].addr < pci[b].addr; });
  switches_.clear();
  for (int s : switch_nodes) {
    Switch sw;
    sw.index = static_cast<int>(switches_.size());
    sw.node = s;
    sw.addr = pci[s].addr;
    sw.vendor_id = pci[s].vendor_id;
    sw.device_id = pci[s].device_id;
    sw.root_complex = rc_of_node_[s];
    sw.uplink = pci[s].link;
    switch_of_node_[s] = sw.index;
    switches_.push_back(std::move(sw));
  }
  for (auto& sw : switches_) {
    for (int a = pci[sw.node].parent; a >= 0; a = pci[a].parent) {
      if (switch_of_node_[a] >= 0) {
        if (sw.parent < 0) sw.parent = switch_of_node_[a];
        ++sw.level;
      }
    }
  }

  // Devices, in address order.
  std::vector<int> gpu_nodes, nic_nodes, other_nodes;
  for (int i = 0; i < n; ++i) {
    const auto& node = pci[i];
    if (node.kind != PciKind::kDevice) continue;
    if (is_nvidia_gpu(node.vendor_id, node.class_id)) {
      gpu_nodes.push_back(i);
    } else if (is_display(node.class_id)) {
      other_nodes.push_back(i);
    } else if (is_network(node.class_id)) {
      nic_nodes.push_back(i);
    }
  }
  auto by_addr = [&](int a, int b) { return pci[a].addr < pci[b].addr; };
  std::sort(gpu_nodes.begin(), gpu_nodes.end(), by_addr);
  std::sort(nic_nodes.begin(), nic_nodes.end(), by_addr);
  std::sort(other_nodes.begin(), other_nodes.end(), by_addr);
  gpus_.clear();
  nics_.clear();
  other_gpus_.clear();
  for (int i : gpu_nodes) {
    gpus_.push_back(make_device(i, DeviceKind::kNvidiaGpu, static_cast<int>(gpus_.size())));
  }
  for (int i : nic_nodes) {
    nics_.push_back(make_device(i, DeviceKind::kNic, static_cast<int>(nics_.size())));
  }
  for (int i : other_nodes) {
    other_gpus_.push_back(
        make_device(i, DeviceKind::kOtherGpu, static_cast<int>(other_gpus_.size())));
  }
  for (const auto& g : gpus_) {
    root_complexes_[g.root_complex].gpus.push_back(g.index);
    for (int s : g.switches) switches_[s].gpus.push_back(g.index);
  }
  for (const auto& nic : nics_) {
    root_complexes_[nic.root_complex].nics.push_back(nic.index);
    for (int s : nic.switches) switches_[s].nics.push_back(nic.index);
  }
}

PciEndpoint Topology::make_device(int node, DeviceKind kind, int index) const {
  const auto& pci = data_.pci;
  const PciNode& p = pci[node];
  PciEndpoint dev;
  dev.kind = kind;
  dev.index = index;
  dev.node = node;
  dev.addr = p.addr;
  dev.vendor_id = p.vendor_id;
  dev.device_id = p.device_id;
  dev.name = !p.name.empty() ? p.name : fmt::format("{:04x}:{:04x}", p.vendor_id, p.device_id);
  dev.link = p.link;
  dev.root_complex = rc_of_node_[node];
  for (int a = p.parent; a >= 0; a = pci[a].parent) {
    if (switch_of_node_[a] >= 0) dev.switches.push_back(switch_of_node_[a]);
  }
  switch (kind) {
    case DeviceKind::kNvidiaGpu:
      dev.label = fmt::format("GPU{}", index);
      for (const auto& os : p.os_devices) {
        if (os.rfind("nvml", 0) == 0 || os.rfind("cuda", 0) == 0) {
          dev.os_name = os;
          break;
        }
      }
      break;
    case DeviceKind::kOtherGpu:
      dev.label = fmt::format("other GPU {}", index);
      break;
    case DeviceKind::kNic:
      dev.label = fmt::format("NIC{}", index);
      dev.nic_kind = p.class_id == 0x0207   ? NicKind::kInfiniband
                     : p.class_id == 0x0200 ? NicKind::kEthernet
                                            : NicKind::kOther;
      dev.rdma = !p.rdma_device.empty();
      // Prefer the RDMA name NCCL shows (mlx5_0); fall back to the first OS name.
      dev.os_name = !p.rdma_device.empty() ? p.rdma_device
                    : p.os_devices.empty() ? p.addr.str()
                                           : p.os_devices.front();
      break;
  }

  // Local NUMA nodes: the CPU-bearing nodes where its host bridge attaches; failing that, those
  // of its package; failing that, every CPU-bearing node (locality unknown).
  const Locality& loc = pci[root_complexes_[dev.root_complex].node].locality;
  for (int os : loc.numa) {
    if (numa(os).has_cpus()) dev.local_numa.push_back(os);
  }
  if (dev.local_numa.empty() && loc.package >= 0) {
    for (const auto& m : data_.numa_nodes) {
      if (m.package == loc.package && m.has_cpus()) dev.local_numa.push_back(m.os_index);
    }
  }
  if (dev.local_numa.empty()) {
    for (const auto& m : data_.numa_nodes) {
      if (m.has_cpus()) dev.local_numa.push_back(m.os_index);
    }
  }
  std::sort(dev.local_numa.begin(), dev.local_numa.end());
  return dev;
}

int Topology::numa_position(int os_index) const {
  for (size_t i = 0; i < data_.numa_nodes.size(); ++i) {
    if (data_.numa_nodes[i].os_index == os_index) return static_cast<int>(i);
  }
  return -1;
}

const NumaNode& Topology::numa(int os_index) const {
  const int pos = numa_position(os_index);
  if (pos < 0) {
    std::vector<int> ids;
    for (const auto& m : data_.numa_nodes) ids.push_back(m.os_index);
    std::sort(ids.begin(), ids.end());
    throw ConfigError(
        fmt::format("NUMA node {} does not exist in topology '{}'", os_index, data_.name),
        fmt::format("use one of NUMA nodes {}", format_index_list(ids)));
  }
  return data_.numa_nodes[pos];
}

int Topology::local_numa(int gpu) const {
  if (gpu < 0 || gpu >= static_cast<int>(gpus_.size())) {
    throw ConfigError(fmt::format("GPU {} does not exist: topology '{}' has {} NVIDIA GPUs", gpu,
                                  data_.name, gpus_.size()),
                      "use a GPU index below the GPU count");
  }
  return gpus_[gpu].local_numa.front();
}

int Topology::find(const PciAddress& addr) const {
  for (size_t i = 0; i < data_.pci.size(); ++i) {
    if (data_.pci[i].kind != PciKind::kHostBridge && data_.pci[i].addr == addr) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace ferry
