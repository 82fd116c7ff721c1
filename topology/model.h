// The Topology model: packages, NUMA nodes and the PCI tree of one machine, whatever its source
// (Note [One model for every source]). Invariant: after construction every index is in range,
// parents precede children, and the derived views are consistent with the tree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "topology/pci.h"

// Note [One model for every source]
// Every source (live hwloc, hwloc XML, synthetic YAML, a dumped model) fills the same
// TopologyData, and Topology validates it once. The derived views: GPUs, NICs, root complexes,
// switches.

namespace ferry {

// A node of the PCI tree. Host bridges are roots (root complexes); bridges are root ports and
// switch ports; devices are endpoint functions (GPUs, NICs, storage, ...).
enum class PciKind { kHostBridge, kBridge, kDevice };

// Where a host bridge attaches on the CPU side: the nearest non-I/O ancestor in hwloc's tree
// (a Package, a NUMA Group under sub-NUMA clustering, or the Machine).
struct Locality {
  std::vector<int> numa;  // sorted os indices of the NUMA nodes in that ancestor's nodeset
  std::vector<int> cpus;  // sorted PU os indices of its cpuset
  int package = -1;       // index into Topology::packages(); -1 when above the packages
};

struct PciNode {
  PciKind kind = PciKind::kDevice;
  PciAddress addr;       // host bridges: domain and first bus behind them, dev/fn 0
  uint8_t bus_last = 0;  // bridges and host bridges: the subordinate (last) bus behind them
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  uint16_t class_id = 0;  // base class << 8 | subclass: 0x0302 3D controller, 0x0207 InfiniBand
  std::string name;       // model name when known ("Tesla V100-SXM2-16GB"); may be empty
  std::vector<std::string> os_devices;  // OS device names below it: "nvml0", "mlx5_0", "ib0"
  std::string rdma_device;              // its OpenFabrics (RDMA) OS device ("mlx5_0"), or empty
  LinkSpeed link;                       // its own PCIe link, towards its parent
  int parent = -1;                      // index into pci(); -1 exactly for host bridges
  std::vector<int> children;            // filled by Topology from `parent`
  // Host bridges only:
  Locality locality;
  std::optional<double> root_complex_gbps;  // declared bandwidth to memory; hwloc never knows it
  bool implicit = false;  // invented for I/O that hwloc reported without a host bridge
};

struct Package {
  int os_index = 0;
  // Derived by Topology:
  std::vector<int> numa;  // os indices of its NUMA nodes
  std::vector<int> cpus;  // PU os indices
};

struct NumaNode {
  int os_index = 0;
  uint64_t memory_bytes = 0;
  int package = -1;                     // index into packages(); -1 when not inside one
  std::vector<std::vector<int>> cores;  // PU os indices of each core; empty when CPU-less
  // Derived by Topology:
  std::vector<int> cpus;  // all PU os indices, sorted
  bool has_cpus() const { return !cpus.empty(); }
};

// The raw description that loaders fill. Topology validates it.
struct TopologyData {
  std::string name;    // "NVIDIA DGX-2H", "dgx1-like", hostname...
  std::string source;  // "live", "xml:FILE", "yaml:FILE"
  std::vector<Package> packages;
  std::vector<NumaNode> numa_nodes;
  std::vector<PciNode> pci;                 // parents before children
  std::optional<double> inter_socket_gbps;  // declared; hwloc never knows it
};

enum class DeviceKind { kNvidiaGpu, kOtherGpu, kNic };
// From the PCI class: 0x0207 InfiniBand, 0x0200 Ethernet, any other 0x02xx network.
enum class NicKind { kInfiniband, kEthernet, kOther };
const char* nic_kind_name(NicKind kind);  // "infiniband", "ethernet", "network"

// A GPU or NIC as consumers see it. GPUs are NVIDIA display-class functions (vendor 0x10de,
// class 0x03xx) and are indexed in PCI order (domain:bus:dev.fn), as CUDA_DEVICE_ORDER=PCI_BUS_ID.
struct PciEndpoint {
  DeviceKind kind = DeviceKind::kNvidiaGpu;
  NicKind nic_kind = NicKind::kOther;  // NICs only
  bool rdma = false;                   // NICs: has an RDMA (OpenFabrics) device, as NCCL wants
  int index = 0;                       // position in gpus(), nics() or other_gpus()
  int node = 0;                        // index into pci()
  PciAddress addr;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::string name;             // model name, or "10de:1db1" when unknown
  std::string label;            // "GPU3", "NIC0"; other GPUs "other GPU 1"
  std::string os_name;          // NICs: "mlx5_0" (RDMA) or "ib0"/"eth0"; GPUs: "" or "nvml3"
  int root_complex = 0;         // index into root_complexes()
  std::vector<int> switches;    // indices into switches(), nearest first; empty when none
  LinkSpeed link;               // its own PCIe link
  std::vector<int> local_numa;  // os indices of its CPU-bearing local NUMA nodes, never empty
};

// A host bridge, i.e. a PCIe root complex.
struct RootComplex {
  int index = 0;
  int node = 0;  // index into pci()
  PciAddress addr;
  uint8_t bus_last = 0;
  std::string label;  // "0000:[2b-3b]"
  Locality locality;
  std::optional<double> gbps;  // declared bandwidth to memory
  std::vector<int> gpus;       // GPU indices below it
  std::vector<int> nics;       // NIC indices below it
};

// A PCIe switch: its upstream-port bridge and the downstream ports below it. See
// Note [Which bridges are switches] in model.cc.
struct Switch {
  int index = 0;
  int node = 0;  // index into pci() of the upstream port
  PciAddress addr;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  int root_complex = 0;
  int parent = -1;        // enclosing switch, -1 for a switch on a root port
  int level = 1;          // 1 for a switch on a root port, 2 below that, ...
  LinkSpeed uplink;       // the upstream port's link
  std::vector<int> gpus;  // every GPU below it at any depth
  std::vector<int> nics;
};

class Topology {
 public:
  // Validates and derives. Throws DataError naming the first inconsistency.
  explicit Topology(TopologyData data);

  const std::string& name() const { return data_.name; }
  const std::string& source() const { return data_.source; }
  const std::vector<Package>& packages() const { return data_.packages; }
  const std::vector<NumaNode>& numa_nodes() const { return data_.numa_nodes; }
  const std::vector<PciNode>& pci() const { return data_.pci; }
  std::optional<double> inter_socket_gbps() const { return data_.inter_socket_gbps; }
  const TopologyData& data() const { return data_; }

  const std::vector<PciEndpoint>& gpus() const { return gpus_; }  // NVIDIA only, PCI order
  const std::vector<PciEndpoint>& nics() const { return nics_; }
  const std::vector<PciEndpoint>& other_gpus() const { return other_gpus_; }  // not ours
  const std::vector<RootComplex>& root_complexes() const { return root_complexes_; }
  const std::vector<Switch>& switches() const { return switches_; }

  // The NUMA node with this os index; throws ConfigError when there is none.
  const NumaNode& numa(int os_index) const;
  // Position of a NUMA node in numa_nodes(), -1 when absent.
  int numa_position(int os_index) const;
  // The NUMA node whose memory a GPU's pinned host buffers should use: the first of its
  // local_numa. Never a CPU-less node. Throws ConfigError when `gpu` is out of range.
  int local_numa(int gpu) const;
  // Index into pci() of the node with this address, -1 when absent.
  int find(const PciAddress& addr) const;
  // PCI bridges on the path from `node` up to its host bridge, counting `node` itself when it
  // is a bridge: a root port has 1, a GPU on a root port 1, a host bridge 0.
  int bridge_depth(int node) const { return depth_[node]; }
  // Root complex index of any PCI node.
  int root_complex_of(int node) const { return rc_of_node_[node]; }
  // Switch index when `node` is a switch's upstream port, else -1.
  int switch_at(int node) const { return switch_of_node_[node]; }

 private:
  void validate() const;
  void derive();
  PciEndpoint make_device(int node, DeviceKind kind, int index) const;

  TopologyData data_;
  std::vector<int> depth_;       // per pci node
  std::vector<int> rc_of_node_;  // per pci node: root complex index
  std::vector<PciEndpoint> gpus_, nics_, other_gpus_;
  std::vector<RootComplex> root_complexes_;
  std::vector<Switch> switches_;
  std::vector<int> switch_of_node_;  // per pci node: switch index, -1 when not a switch
};

// Device classification used by every loader (exposed for tests).
bool is_nvidia_gpu(uint16_t vendor_id, uint16_t class_id);
bool is_display(uint16_t class_id);  // class 0x03xx
bool is_network(uint16_t class_id);  // class 0x02xx

inline constexpr uint16_t kNvidiaVendor = 0x10de;

}  // namespace ferry
