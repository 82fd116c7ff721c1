// Dump and load of the explicit topology model in YAML: every package, NUMA node (cores as CPU
// lists) and PCI node (with its parent index) written out, so that any Topology, from hwloc or
// a synthetic description, can be saved and emulated elsewhere.
#include "topology/model_yaml.h"

#include <cmath>

#include <fmt/format.h>

#include "topology/synthetic.h"

namespace ferry {

namespace {

const char* kind_name(PciKind k) {
  switch (k) {
    case PciKind::kHostBridge:
      return "host_bridge";
    case PciKind::kBridge:
      return "bridge";
    case PciKind::kDevice:
      return "device";
  }
  return "device";
}

std::string hex(unsigned v, int digits) { return fmt::format("0x{:0{}x}", v, digits); }

std::vector<int> index_list(const yaml::Reader& r, const YAML::Node& n, std::string_view what) {
  const std::string text = r.string(n, what, 1 << 20);
  auto list = parse_index_list(text, 1 << 20);
  if (!list) {
    throw r.error(n, fmt::format("{} '{}' is not a list like 0-3,8", what, text.substr(0, 40)),
                  "write comma-separated indices and ranges");
  }
  return *list;
}

LinkSpeed read_link(const yaml::Reader& r, const YAML::Node& n) {
  LinkSpeed s;
  s.gbps = r.opt_link_gbps(n, "link_gbps");
  if (auto g = r.opt_integer(n, "link_gen", 1, kPcieMaxGen)) s.gen = static_cast<int>(*g);
  if (auto w = r.opt_integer(n, "link_width", 1, 32)) s.width = static_cast<int>(*w);
  return s;
}

}  // namespace

std::string dump_model_yaml(const Topology& t) {
  YAML::Emitter out;
  out.SetDoublePrecision(17);
  out << YAML::Comment(fmt::format("ferry topology model of '{}' ({}); load with --synthetic",
                                   t.name(), t.source()));
  out << YAML::BeginMap;
  out << YAML::Key << "ferry_topology_model" << YAML::Value << kModelYamlVersion;
  out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << t.name();
  if (t.inter_socket_gbps()) {
    out << YAML::Key << "inter_socket_gbps" << YAML::Value << *t.inter_socket_gbps();
  }
  out << YAML::Key << "packages" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const auto& p : t.packages()) out << p.os_index;
  out << YAML::EndSeq;
  out << YAML::Key << "numa_nodes" << YAML::Value << YAML::BeginSeq;
  for (const auto& m : t.numa_nodes()) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "os_index" << YAML::Value << m.os_index;
    out << YAML::Key << "package" << YAML::Value << m.package;
    out << YAML::Key << "memory" << YAML::Value << m.memory_bytes;
    out << YAML::Key << "cores" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& core : m.cores) out << YAML::DoubleQuoted << format_index_list(core);
    out << YAML::EndSeq << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "pci" << YAML::Value << YAML::BeginSeq;
  for (const auto& n : t.pci()) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "kind" << YAML::Value << kind_name(n.kind);
    if (n.parent >= 0) out << YAML::Key << "parent" << YAML::Value << n.parent;
    out << YAML::Key << "addr" << YAML::Value << n.addr.str();
    if (n.kind != PciKind::kDevice) {
      out << YAML::Key << "bus_last" << YAML::Value << hex(n.bus_last, 2);
    }
    if (n.kind != PciKind::kHostBridge) {
      out << YAML::Key << "vendor_id" << YAML::Value << hex(n.vendor_id, 4);
      out << YAML::Key << "device_id" << YAML::Value << hex(n.device_id, 4);
      out << YAML::Key << "class_id" << YAML::Value << hex(n.class_id, 4);
    }
    if (!n.name.empty()) out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << n.name;
    if (n.link.gbps) out << YAML::Key << "link_gbps" << YAML::Value << *n.link.gbps;
    if (n.link.gen) out << YAML::Key << "link_gen" << YAML::Value << *n.link.gen;
    if (n.link.width) out << YAML::Key << "link_width" << YAML::Value << *n.link.width;
    if (!n.os_devices.empty()) {
      out << YAML::Key << "os_devices" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (const auto& os : n.os_devices) out << YAML::DoubleQuoted << os;
      out << YAML::EndSeq;
    }
    if (!n.rdma_device.empty()) {
      out << YAML::Key << "rdma_device" << YAML::Value << YAML::DoubleQuoted << n.rdma_device;
    }
    if (n.kind == PciKind::kHostBridge) {
      out << YAML::Key << "numa" << YAML::Value << YAML::DoubleQuoted
          << format_index_list(n.locality.numa);
      out << YAML::Key << "cpus" << YAML::Value << YAML::DoubleQuoted
          << format_index_list(n.locality.cpus);
      out << YAML::Key << "package" << YAML::Value << n.locality.package;
      if (n.root_complex_gbps) {
        out << YAML::Key << "root_complex_gbps" << YAML::Value << *n.root_complex_gbps;
      }
      if (n.implicit) out << YAML::Key << "implicit" << YAML::Value << true;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

TopologyData read_model_yaml(const yaml::Reader& r, const YAML::Node& root) {
  r.check_keys(
      root, {"ferry_topology_model", "name", "inter_socket_gbps", "packages", "numa_nodes", "pci"},
      "the model");
  const int64_t version =
      r.integer(root["ferry_topology_model"], "'ferry_topology_model'", 1, 1000);
  if (version != kModelYamlVersion) {
    throw r.error(root["ferry_topology_model"],
                  fmt::format("model format version {} is not supported (this build reads {})",
                              version, kModelYamlVersion),
                  "dump the model again with this build's topo-probe --dump-model");
  }
  TopologyData d;
  d.source = "yaml:" + r.file();
  d.name = root["name"] ? r.string(root["name"], "'name'") : r.file();
  d.inter_socket_gbps = r.opt_link_gbps(root, "inter_socket_gbps");
  auto list = [&](const char* key, size_t max) {
    const YAML::Node n = root[key];
    if (!n.IsDefined() || !n.IsSequence()) {
      throw r.error(n.IsDefined() ? n : root, fmt::format("'{}' must be a list", key),
                    "dump the model again with topo-probe --dump-model");
    }
    if (n.size() > max) {
      throw r.error(n, fmt::format("'{}' has more than {} entries", key, max),
                    "describe a smaller machine");
    }
    return n;
  };
  for (const YAML::Node& p : list("packages", 1024)) {
    d.packages.push_back(
        Package{static_cast<int>(r.integer(p, "package os index", 0, 1 << 20)), {}, {}});
  }
  const int npkg = static_cast<int>(d.packages.size());
  for (const YAML::Node& m : list("numa_nodes", 4096)) {
    r.check_keys(m, {"os_index", "package", "memory", "cores"}, "a NUMA node");
    NumaNode node;
    node.os_index = static_cast<int>(r.integer(m["os_index"], "'os_index'", 0, 1 << 20));
    node.package = static_cast<int>(r.opt_integer(m, "package", -1, npkg - 1).value_or(-1));
    node.memory_bytes = m["memory"] ? r.bytes(m["memory"], "'memory'") : 0;
    if (const YAML::Node cores = m["cores"]; cores.IsDefined()) {
      if (!cores.IsSequence() || cores.size() > (1 << 16)) {
        throw r.error(cores, "'cores' must be a list of CPU lists", "write cores: [\"0,40\", ...]");
      }
      for (const YAML::Node& c : cores) node.cores.push_back(index_list(r, c, "a core"));
    }
    d.numa_nodes.push_back(std::move(node));
  }
  const YAML::Node pci = list("pci", 1 << 16);
  for (const YAML::Node& n : pci) {
    r.check_keys(n,
                 {"kind", "parent", "addr", "bus_last", "vendor_id", "device_id", "class_id",
                  "name", "link_gbps", "link_gen", "link_width", "os_devices", "rdma_device",
                  "numa", "cpus", "package", "root_complex_gbps", "implicit"},
                 "a PCI node");
    PciNode node;
    const std::string kind = n["kind"] ? r.string(n["kind"], "'kind'") : "";
    if (kind == "host_bridge") {
      node.kind = PciKind::kHostBridge;
    } else if (kind == "bridge") {
      node.kind = PciKind::kBridge;
    } else if (kind == "device") {
      node.kind = PciKind::kDevice;
    } else {
      throw r.error(n, fmt::format("PCI node kind '{}' is unknown", kind),
                    "use host_bridge, bridge or device");
    }
    const int64_t here = static_cast<int64_t>(d.pci.size());
    node.parent = static_cast<int>(r.opt_integer(n, "parent", -1, here - 1).value_or(-1));
    const std::string addr = n["addr"] ? r.string(n["addr"], "'addr'") : "";
    const auto parsed = PciAddress::parse(addr);
    if (!parsed) {
      throw r.error(n, fmt::format("PCI address '{}' is malformed", addr.substr(0, 40)),
                    "write domain:bus:dev.fn, e.g. 0000:3b:00.0");
    }
    node.addr = *parsed;
    node.bus_last = static_cast<uint8_t>(r.opt_integer(n, "bus_last", 0, 255).value_or(0));
    node.vendor_id = static_cast<uint16_t>(r.opt_integer(n, "vendor_id", 0, 0xffff).value_or(0));
    node.device_id = static_cast<uint16_t>(r.opt_integer(n, "device_id", 0, 0xffff).value_or(0));
    node.class_id = static_cast<uint16_t>(r.opt_integer(n, "class_id", 0, 0xffff).value_or(0));
    if (n["name"]) node.name = r.string(n["name"], "'name'");
    node.link = read_link(r, n);
    if (const YAML::Node os = n["os_devices"]; os.IsDefined()) {
      if (!os.IsSequence() || os.size() > 64) {
        throw r.error(os, "'os_devices' must be a short list of names", "write [\"mlx5_0\"]");
      }
      for (const YAML::Node& o : os) node.os_devices.push_back(r.string(o, "an OS device"));
    }
    if (n["rdma_device"]) node.rdma_device = r.string(n["rdma_device"], "'rdma_device'");
    if (node.kind == PciKind::kHostBridge) {
      if (n["numa"]) node.locality.numa = index_list(r, n["numa"], "'numa'");
      if (n["cpus"]) node.locality.cpus = index_list(r, n["cpus"], "'cpus'");
      node.locality.package =
          static_cast<int>(r.opt_integer(n, "package", -1, npkg - 1).value_or(-1));
      node.root_complex_gbps = r.opt_link_gbps(n, "root_complex_gbps");
      if (n["implicit"]) node.implicit = r.boolean(n["implicit"], "'implicit'");
    }
    d.pci.push_back(std::move(node));
  }
  return d;
}

}  // namespace ferry
