// The synthetic YAML description (Note [Synthetic topology YAML]) expanded into TopologyData:
// packages, NUMA nodes with Linux-style CPU numbering, and a PCI tree with root ports, switch
// upstream/downstream ports and endpoints, numbered bus by bus. All sizes are bounded.
#include "topology/synthetic.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "topology/model_yaml.h"
#include "topology/yaml_reader.h"

namespace ferry {

namespace {

constexpr int64_t kMaxSockets = 64;
constexpr int64_t kMaxCount = 256;
constexpr int kMaxSwitchLevels = 6;
constexpr size_t kMaxNodes = 8192;
constexpr uintmax_t kMaxYamlBytes = 16ull << 20;

struct DeviceSpec {
  bool gpu = true;
  std::string name;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  NicKind nic_kind = NicKind::kInfiniband;
  LinkSpeed link;
};

class Builder {
 public:
  Builder(const yaml::Reader& r, const YAML::Node& root) : r_(r), root_(root) {}

  TopologyData build() {
    r_.check_keys(root_, {"name", "pcie", "inter_socket_gbps", "root_complex_gbps", "sockets"},
                  "the topology");
    d_.source = "yaml:" + r_.file();
    d_.name = root_["name"] ? r_.string(root_["name"], "'name'") : r_.file();
    default_link_ = root_["pcie"] ? link(root_["pcie"], "'pcie'") : gen3x16();
    d_.inter_socket_gbps = r_.opt_link_gbps(root_, "inter_socket_gbps");
    rc_gbps_ = r_.opt_link_gbps(root_, "root_complex_gbps");
    const YAML::Node sockets = root_["sockets"];
    if (!sockets.IsDefined() || !sockets.IsSequence() || sockets.size() == 0) {
      throw r_.error(sockets.IsDefined() ? sockets : root_, "'sockets' must be a non-empty list",
                     "describe at least one socket, e.g. sockets: [{cores: 8}]");
    }
    const std::vector<YAML::Node> expanded = expand(sockets, "socket", kMaxSockets);
    add_sockets(expanded);
    for (size_t s = 0; s < expanded.size(); ++s) {
      const YAML::Node rcs = expanded[s]["root_complexes"];
      if (!rcs.IsDefined() || rcs.IsNull()) continue;
      for (const YAML::Node& rc : expand(rcs, "root complex", kMaxCount)) {
        add_root_complex(rc, static_cast<int>(s));
      }
    }
    return std::move(d_);
  }

 private:
  static LinkSpeed gen3x16() { return LinkSpeed{pcie_link_gbps(3, 16), 3, 16}; }

  LinkSpeed link(const YAML::Node& n, std::string_view what) const {
    r_.check_keys(n, {"gen", "width", "gbps"}, what);
    LinkSpeed s;
    if (n["gbps"]) {
      if (n["gen"] || n["width"]) {
        throw r_.error(n, fmt::format("{}: give either gen and width, or gbps", what),
                       "remove gbps or gen/width");
      }
      s.gbps = r_.link_gbps(n["gbps"], "'gbps'");
      return s;
    }
    if (!n["gen"] || !n["width"]) {
      throw r_.error(n, fmt::format("{} needs gen and width", what), "write {gen: 3, width: 16}");
    }
    const int gen = static_cast<int>(r_.integer(n["gen"], "'gen'", 1, kPcieMaxGen));
    const int width = static_cast<int>(r_.integer(n["width"], "'width'", 1, 32));
    s.gbps = pcie_link_gbps(gen, width);
    if (!s.gbps) {
      throw r_.error(n["width"], fmt::format("PCIe width x{} does not exist", width),
                     "use a width of 1, 2, 4, 8, 12, 16 or 32");
    }
    s.gen = gen;
    s.width = width;
    return s;
  }

  // A list whose entries may carry `count`, expanded; the total is bounded.
  std::vector<YAML::Node> expand(const YAML::Node& list, std::string_view what,
                                 int64_t max_total) const {
    if (!list.IsSequence()) {
      throw r_.error(list, fmt::format("the {} list must be a list", what),
                     fmt::format("write one '- ' entry per {}", what));
    }
    std::vector<YAML::Node> out;
    for (const YAML::Node& item : list) {
      r_.expect_map(item, what);
      const int64_t count = r_.opt_integer(item, "count", 1, kMaxCount).value_or(1);
      if (static_cast<int64_t>(out.size()) + count > max_total) {
        throw r_.error(item, fmt::format("more than {} {}s", max_total, what),
                       "describe a smaller machine");
      }
      for (int64_t i = 0; i < count; ++i) out.push_back(item);
    }
    return out;
  }

  void add_sockets(const std::vector<YAML::Node>& sockets) {
    struct Shape {
      int64_t cores, threads, numa;
      uint64_t memory;
      int64_t mem_only;
      uint64_t mem_only_bytes;
    };
    std::vector<Shape> shapes;
    int64_t total_cores = 0;
    for (const YAML::Node& s : sockets) {
      r_.check_keys(s,
                    {"count", "cores", "threads_per_core", "numa_nodes", "memory",
                     "memory_only_numa_nodes", "root_complexes"},
                    "a socket");
      Shape sh;
      sh.cores = r_.opt_integer(s, "cores", 1, 4096).value_or(1);
      sh.threads = r_.opt_integer(s, "threads_per_core", 1, 8).value_or(1);
      sh.numa = r_.opt_integer(s, "numa_nodes", 1, 64).value_or(1);
      sh.memory = s["memory"] ? r_.bytes(s["memory"], "'memory'") : (64ull << 30);
      if (sh.cores % sh.numa != 0) {
        throw r_.error(
            s, fmt::format("{} cores do not split evenly over {} NUMA nodes", sh.cores, sh.numa),
            "make cores a multiple of numa_nodes");
      }
      sh.mem_only = 0;
      sh.mem_only_bytes = 16ull << 30;
      if (const YAML::Node m = s["memory_only_numa_nodes"]; m.IsDefined() && !m.IsNull()) {
        if (m.IsMap()) {
          r_.check_keys(m, {"count", "memory"}, "'memory_only_numa_nodes'");
          sh.mem_only = r_.opt_integer(m, "count", 0, 64).value_or(1);
          if (m["memory"]) sh.mem_only_bytes = r_.bytes(m["memory"], "'memory'");
        } else {
          sh.mem_only = r_.integer(m, "'memory_only_numa_nodes'", 0, 64);
        }
      }
      total_cores += sh.cores;
      shapes.push_back(sh);
    }
    if (total_cores * 8 > (1 << 20)) {
      throw r_.error(root_, "too many CPUs", "describe fewer cores");
    }
    int64_t core_base = 0;
    int numa_os = 0;
    for (size_t s = 0; s < shapes.size(); ++s) {
      const Shape& sh = shapes[s];
      d_.packages.push_back(Package{static_cast<int>(s), {}, {}});
      const int64_t cores_per_node = sh.cores / sh.numa;
      for (int64_t m = 0; m < sh.numa; ++m) {
        NumaNode node;
        node.os_index = numa_os++;
        node.package = static_cast<int>(s);
        node.memory_bytes = sh.memory / static_cast<uint64_t>(sh.numa);
        for (int64_t c = 0; c < cores_per_node; ++c) {
          const int64_t global_core = core_base + m * cores_per_node + c;
          std::vector<int> pus;
          for (int64_t t = 0; t < sh.threads; ++t) {
            pus.push_back(static_cast<int>(t * total_cores + global_core));
          }
          node.cores.push_back(std::move(pus));
        }
        d_.numa_nodes.push_back(std::move(node));
      }
      core_base += sh.cores;
    }
    // CPU-less nodes are numbered after every CPU node, as Linux does.
    for (size_t s = 0; s < shapes.size(); ++s) {
      for (int64_t m = 0; m < shapes[s].mem_only; ++m) {
        NumaNode node;
        node.os_index = numa_os++;
        node.package = static_cast<int>(s);
        node.memory_bytes = shapes[s].mem_only_bytes;
        d_.numa_nodes.push_back(std::move(node));
      }
    }
  }

  std::vector<DeviceSpec> devices(const YAML::Node& n, bool gpu, const LinkSpeed& inherited) {
    std::vector<DeviceSpec> out;
    if (!n.IsDefined() || n.IsNull()) return out;
    const char* what = gpu ? "'gpus'" : "'nics'";
    if (n.IsScalar()) {
      const int64_t count = r_.integer(n, what, 0, kMaxCount);
      for (int64_t i = 0; i < count; ++i) out.push_back(default_device(gpu, inherited));
      return out;
    }
    if (n.IsMap()) return device_group(n, gpu, inherited, what);
    if (n.IsSequence()) {
      for (const YAML::Node& item : n) {
        if (!item.IsMap()) {
          throw r_.error(item, fmt::format("entries of {} must be maps", what),
                         "write - {count: 2, name: ...}");
        }
        auto group = device_group(item, gpu, inherited, what);
        if (out.size() + group.size() > kMaxCount) {
          throw r_.error(item, fmt::format("more than {} devices in one {} list", kMaxCount, what),
                         "describe fewer devices");
        }
        out.insert(out.end(), group.begin(), group.end());
      }
      return out;
    }
    throw r_.error(n, fmt::format("{} must be a count, a map or a list", what),
                   fmt::format("write {}: 2", gpu ? "gpus" : "nics"));
  }

  DeviceSpec default_device(bool gpu, const LinkSpeed& inherited) const {
    DeviceSpec d;
    d.gpu = gpu;
    d.link = inherited;
    d.vendor_id = gpu ? kNvidiaVendor : 0x15b3;
    return d;
  }

  std::vector<DeviceSpec> device_group(const YAML::Node& n, bool gpu, const LinkSpeed& inherited,
                                       const char* what) {
    if (gpu) {
      r_.check_keys(n, {"count", "name", "vendor_id", "device_id", "pcie"}, what);
    } else {
      r_.check_keys(n, {"count", "name", "vendor_id", "device_id", "pcie", "kind"}, what);
    }
    DeviceSpec d = default_device(gpu, inherited);
    if (n["name"]) d.name = r_.string(n["name"], "'name'");
    if (n["pcie"]) d.link = link(n["pcie"], "'pcie'");
    if (!gpu && n["kind"]) {
      const std::string kind = r_.string(n["kind"], "'kind'");
      if (kind == "infiniband") {
        d.nic_kind = NicKind::kInfiniband;
      } else if (kind == "ethernet") {
        d.nic_kind = NicKind::kEthernet;
        d.vendor_id = 0x8086;
      } else {
        throw r_.error(n["kind"], fmt::format("NIC kind '{}' is unknown", kind),
                       "use infiniband or ethernet");
      }
    }
    if (auto v = r_.opt_integer(n, "vendor_id", 0, 0xffff)) d.vendor_id = static_cast<uint16_t>(*v);
    if (auto v = r_.opt_integer(n, "device_id", 0, 0xffff)) d.device_id = static_cast<uint16_t>(*v);
    const int64_t count = r_.opt_integer(n, "count", 0, kMaxCount).value_or(1);
    return std::vector<DeviceSpec>(static_cast<size_t>(count), d);
  }

  uint8_t alloc_bus(uint32_t domain, const YAML::Node& at) {
    int& next = next_bus_[domain];
    if (next > 255) {
      throw r_.error(at, fmt::format("more than 256 PCI buses in domain {:04x}", domain),
                     "describe fewer devices or give root complexes their own 'domain'");
    }
    return static_cast<uint8_t>(next++);
  }

  uint8_t last_bus(uint32_t domain) const { return static_cast<uint8_t>(next_bus_.at(domain) - 1); }

  int add_node(PciNode node, const YAML::Node& at) {
    if (d_.pci.size() >= kMaxNodes) {
      throw r_.error(at, fmt::format("more than {} PCI functions", kMaxNodes),
                     "describe a smaller machine");
    }
    d_.pci.push_back(std::move(node));
    return static_cast<int>(d_.pci.size()) - 1;
  }

  PciNode bridge(int parent, PciAddress addr, LinkSpeed speed) const {
    PciNode b;
    b.kind = PciKind::kBridge;
    b.parent = parent;
    b.addr = addr;
    b.class_id = 0x0604;
    b.link = speed;
    return b;
  }

  void add_endpoint(int parent, PciAddress addr, const DeviceSpec& spec, const YAML::Node& at) {
    PciNode n;
    n.kind = PciKind::kDevice;
    n.parent = parent;
    n.addr = addr;
    n.vendor_id = spec.vendor_id;
    n.device_id = spec.device_id;
    n.link = spec.link;
    n.name = spec.name;
    if (spec.gpu) {
      n.class_id = 0x0302;
      if (n.name.empty()) n.name = "synthetic GPU";
    } else if (spec.nic_kind == NicKind::kInfiniband) {
      n.class_id = 0x0207;
      n.rdma_device = fmt::format("mlx5_{}", rdma_count_++);
      n.os_devices = {n.rdma_device, fmt::format("ib{}", ib_count_++)};
      if (n.name.empty()) n.name = "synthetic InfiniBand HCA";
    } else {
      n.class_id = 0x0200;
      n.os_devices = {fmt::format("eth{}", eth_count_++)};
      if (n.name.empty()) n.name = "synthetic Ethernet NIC";
    }
    add_node(std::move(n), at);
  }

  // The children of a root complex or a switch, in order: GPUs, NICs, switches. `make_port` makes
  // the port bridge for child k and returns {its index, its secondary bus}.
  using MakePort = std::function<std::pair<int, uint8_t>(const LinkSpeed&)>;

  void add_children(const YAML::Node& spec, const LinkSpeed& inherited, uint32_t domain, int level,
                    const MakePort& make_port) {
    std::vector<DeviceSpec> devs = devices(spec["gpus"], true, inherited);
    auto nics = devices(spec["nics"], false, inherited);
    devs.insert(devs.end(), nics.begin(), nics.end());
    for (const DeviceSpec& dev : devs) {
      auto [port, bus] = make_port(dev.link);
      add_endpoint(port, PciAddress{domain, bus, 0, 0}, dev, spec);
      d_.pci[port].bus_last = last_bus(domain);
    }
    const YAML::Node switches = spec["switches"];
    if (!switches.IsDefined() || switches.IsNull()) return;
    if (level >= kMaxSwitchLevels) {
      throw r_.error(switches, fmt::format("more than {} switch levels", kMaxSwitchLevels),
                     "nest fewer switches");
    }
    for (const YAML::Node& sw : expand(switches, "switch", kMaxCount)) {
      r_.check_keys(sw,
                    {"count", "pcie", "vendor_id", "device_id", "name", "gpus", "nics", "switches"},
                    "a switch");
      const LinkSpeed uplink = sw["pcie"] ? link(sw["pcie"], "'pcie'") : inherited;
      auto [port, bus] = make_port(uplink);
      PciNode up = bridge(port, PciAddress{domain, bus, 0, 0}, uplink);
      if (auto v = r_.opt_integer(sw, "vendor_id", 0, 0xffff))
        up.vendor_id = static_cast<uint16_t>(*v);
      if (auto v = r_.opt_integer(sw, "device_id", 0, 0xffff))
        up.device_id = static_cast<uint16_t>(*v);
      up.name = sw["name"] ? r_.string(sw["name"], "'name'") : "synthetic PCIe switch";
      const int up_index = add_node(std::move(up), sw);
      const uint8_t internal = alloc_bus(domain, sw);
      int next_port = 0;
      add_children(sw, uplink, domain, level + 1, [&](const LinkSpeed& speed) {
        if (next_port > 31) {
          throw r_.error(sw, "a switch has more than 32 downstream ports",
                         "put fewer devices on one switch");
        }
        PciNode dp = bridge(
            up_index, PciAddress{domain, internal, static_cast<uint8_t>(next_port++), 0}, speed);
        const int dp_index = add_node(std::move(dp), sw);
        return std::pair<int, uint8_t>(dp_index, alloc_bus(domain, sw));
      });
      d_.pci[up_index].bus_last = last_bus(domain);
      d_.pci[port].bus_last = last_bus(domain);
    }
  }

  void add_root_complex(const YAML::Node& rc, int socket) {
    r_.check_keys(rc, {"count", "numa", "gbps", "domain", "pcie", "gpus", "nics", "switches"},
                  "a root complex");
    PciNode hb;
    hb.kind = PciKind::kHostBridge;
    const uint32_t domain =
        static_cast<uint32_t>(r_.opt_integer(rc, "domain", 0, 0xffff).value_or(0));
    hb.addr = PciAddress{domain, alloc_bus(domain, rc), 0, 0};
    hb.root_complex_gbps = rc["gbps"] ? r_.opt_link_gbps(rc, "gbps") : rc_gbps_;
    const Package& pkg = d_.packages[socket];
    std::vector<int> socket_numa;
    for (const auto& m : d_.numa_nodes) {
      if (m.package == socket) socket_numa.push_back(m.os_index);
    }
    if (auto numa = r_.opt_integer(rc, "numa", 0, 63)) {
      int seen = 0;
      const NumaNode* chosen = nullptr;
      for (const auto& m : d_.numa_nodes) {
        if (m.package == socket && !m.cores.empty() && seen++ == *numa) chosen = &m;
      }
      if (!chosen) {
        throw r_.error(rc["numa"],
                       fmt::format("socket {} has no NUMA node {}", pkg.os_index, *numa),
                       "count NUMA nodes from 0 within the socket");
      }
      hb.locality.numa = {chosen->os_index};
      for (const auto& core : chosen->cores) {
        hb.locality.cpus.insert(hb.locality.cpus.end(), core.begin(), core.end());
      }
    } else {
      hb.locality.numa = socket_numa;
      for (const auto& m : d_.numa_nodes) {
        if (m.package != socket) continue;
        for (const auto& core : m.cores) {
          hb.locality.cpus.insert(hb.locality.cpus.end(), core.begin(), core.end());
        }
      }
    }
    std::sort(hb.locality.numa.begin(), hb.locality.numa.end());
    std::sort(hb.locality.cpus.begin(), hb.locality.cpus.end());
    hb.locality.package = socket;
    const uint8_t host_bus = hb.addr.bus;
    const int hb_index = add_node(std::move(hb), rc);
    const LinkSpeed inherited = rc["pcie"] ? link(rc["pcie"], "'pcie'") : default_link_;
    int next_port = 1;
    add_children(rc, inherited, domain, 0, [&](const LinkSpeed& speed) {
      if (next_port > 31) {
        throw r_.error(rc, "a root complex has more than 31 root ports",
                       "put devices behind switches or split the root complex");
      }
      PciNode rp = bridge(
          hb_index, PciAddress{domain, host_bus, static_cast<uint8_t>(next_port++), 0}, speed);
      const int rp_index = add_node(std::move(rp), rc);
      return std::pair<int, uint8_t>(rp_index, alloc_bus(domain, rc));
    });
    d_.pci[hb_index].bus_last = last_bus(domain);
  }

  const yaml::Reader& r_;
  const YAML::Node root_;
  TopologyData d_;
  LinkSpeed default_link_;
  std::optional<double> rc_gbps_;
  std::map<uint32_t, int> next_bus_;
  int rdma_count_ = 0, ib_count_ = 0, eth_count_ = 0;
};

std::string read_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw ConfigError(
        fmt::format("topology file '{}' does not exist", path),
        "check the path (topology.file, trainer's --topology or topo-probe's --synthetic); "
        "example descriptions are in configs/topologies/");
  }
  if (!fs::is_regular_file(status)) {
    throw ConfigError(fmt::format("topology file '{}' is not a regular file", path),
                      "pass a YAML file");
  }
  const auto size = fs::file_size(path, ec);
  if (ec || size > kMaxYamlBytes) {
    throw ConfigError(fmt::format("topology file '{}' is too large or unreadable", path),
                      "pass a YAML topology description");
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in.good() && !in.eof()) {
    throw ConfigError(fmt::format("cannot read topology file '{}'", path),
                      "check the file's permissions");
  }
  return buffer.str();
}

}  // namespace

Topology parse_yaml(const std::string& text, const std::string& name) {
  const yaml::Reader reader(name);
  const YAML::Node root = yaml::parse(text, name);
  if (!root.IsMap()) {
    throw reader.error(root, "a topology description must be a map with 'sockets'",
                       "see configs/topologies/ for examples");
  }
  try {
    TopologyData data = root["ferry_topology_model"] ? read_model_yaml(reader, root)
                                                     : Builder(reader, root).build();
    try {
      return Topology(std::move(data));
    } catch (const DataError& e) {
      throw ConfigError(fmt::format("{}: {}", name, e.what()), e.hint());
    }
  } catch (const YAML::Exception& e) {
    // A shape the readers did not anticipate (yaml-cpp's own checks): still a typed error.
    throw ConfigError(fmt::format("{}:{}: {}", name, e.mark.line + 1, e.msg),
                      "see configs/topologies/ for the expected layout");
  }
}

Topology load_yaml(const std::string& path) { return parse_yaml(read_file(path), path); }

}  // namespace ferry
