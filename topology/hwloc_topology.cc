// hwloc discovery and conversion to TopologyData. The conversion walks hwloc's tree with an
// explicit stack and reads only attributes; it never asks hwloc for common ancestors.
#include "topology/hwloc_topology.h"

#include <hwloc.h>
#include <hwloc/export.h>

#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"
#include "topology/hwloc_check.h"

namespace ferry {

namespace {

constexpr uintmax_t kMaxXmlBytes = 64ull << 20;
constexpr int kMaxBitmapIndex = 1 << 20;

int to_int_index(unsigned value) {
  return value > static_cast<unsigned>(INT_MAX) ? -1 : static_cast<int>(value);
}

// Set bits of a bitmap, bounded (an infinite or corrupt bitmap must not loop forever).
std::vector<int> bits(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (!set) return out;
  for (int i = hwloc_bitmap_first(set); i >= 0 && i <= kMaxBitmapIndex;
       i = hwloc_bitmap_next(set, i)) {
    out.push_back(i);
  }
  return out;
}

const char* info(hwloc_obj_t obj, const char* name) {
  const char* v = hwloc_obj_get_info_by_name(obj, name);
  return v ? v : "";
}

LinkSpeed speed_of(float gbps) {
  LinkSpeed s;
  // 0 means unknown (hwloc 1.x exports, virtual functions); keep absurd values so that
  // validation rejects them with a message instead of silently believing them.
  if (std::isfinite(gbps) ? gbps > 0 : !std::isnan(gbps)) s.gbps = static_cast<double>(gbps);
  return s;
}

class Converter {
 public:
  explicit Converter(hwloc_topology_t topo) : topo_(topo) {}

  TopologyData run(const std::string& source) {
    TopologyData d;
    d.source = source;
    hwloc_obj_t root = hwloc_get_root_obj(topo_);
    d.name = info(root, "DMIProductName");
    if (d.name.empty()) d.name = info(root, "HostName");
    if (d.name.empty()) d.name = source;
    add_packages(d);
    add_numa_nodes(d);
    add_io(d, root);
    return d;
  }

 private:
  void add_packages(TopologyData& d) {
    const int n = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_PACKAGE);
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t p = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_PACKAGE, i);
      Package pkg;
      // Packages without an os index (some XML exports) are numbered by position.
      pkg.os_index = p->os_index == HWLOC_UNKNOWN_INDEX ? i : to_int_index(p->os_index);
      package_index_[p] = static_cast<int>(d.packages.size());
      package_objs_.push_back(p);
      d.packages.push_back(pkg);
    }
  }

  // The package an object belongs to: a Package ancestor, else the only package its cpuset
  // touches (butte's NUMA nodes and host bridges sit in a Group above their Package).
  int package_of(hwloc_obj_t obj) const {
    for (hwloc_obj_t a = obj; a; a = a->parent) {
      auto it = package_index_.find(a);
      if (it != package_index_.end()) return it->second;
    }
    if (!obj->cpuset || hwloc_bitmap_iszero(obj->cpuset)) return -1;
    int found = -1;
    for (size_t i = 0; i < package_objs_.size(); ++i) {
      if (package_objs_[i]->cpuset &&
          hwloc_bitmap_intersects(obj->cpuset, package_objs_[i]->cpuset)) {
        if (found >= 0) return -1;
        found = static_cast<int>(i);
      }
    }
    return found;
  }

  void add_numa_nodes(TopologyData& d) {
    // PUs grouped by core, in logical order.
    std::map<hwloc_obj_t, std::vector<int>> core_pus;
    std::vector<hwloc_obj_t> core_order;
    const int npu = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_PU);
    for (int i = 0; i < npu; ++i) {
      hwloc_obj_t pu = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_PU, i);
      hwloc_obj_t core = pu;
      for (hwloc_obj_t a = pu->parent; a; a = a->parent) {
        if (a->type == HWLOC_OBJ_CORE) {
          core = a;
          break;
        }
      }
      if (!core_pus.count(core)) core_order.push_back(core);
      core_pus[core].push_back(to_int_index(pu->os_index));
    }
    const int nn = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_NUMANODE);
    std::vector<hwloc_obj_t> numa_objs;
    for (int i = 0; i < nn; ++i) {
      hwloc_obj_t m = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, i);
      NumaNode node;
      node.os_index = to_int_index(m->os_index);
      node.memory_bytes = m->attr ? m->attr->numanode.local_memory : 0;
      node.package = package_of(m);
      d.numa_nodes.push_back(node);
      numa_objs.push_back(m);
    }
    // Each core goes to the first NUMA node whose cpuset holds its first PU.
    for (hwloc_obj_t core : core_order) {
      const auto& pus = core_pus[core];
      if (pus.empty() || pus.front() < 0) continue;
      for (size_t i = 0; i < numa_objs.size(); ++i) {
        if (numa_objs[i]->cpuset && hwloc_bitmap_isset(numa_objs[i]->cpuset, pus.front())) {
          d.numa_nodes[i].cores.push_back(pus);
          break;
        }
      }
    }
  }

  Locality locality_of(hwloc_obj_t obj) const {
    Locality loc;
    loc.numa = bits(obj->nodeset);
    loc.cpus = bits(obj->cpuset);
    loc.package = package_of(obj);
    return loc;
  }

  // Every I/O subtree hanging off a non-I/O object becomes a root complex.
  void add_io(TopologyData& d, hwloc_obj_t root) {
    std::vector<hwloc_obj_t> stack{root};
    while (!stack.empty()) {
      hwloc_obj_t obj = stack.back();
      stack.pop_back();
      for (hwloc_obj_t io = obj->io_first_child; io; io = io->next_sibling) {
        if (io->type == HWLOC_OBJ_OS_DEVICE) continue;  // a disk attached to the machine
        const bool host =
            io->type == HWLOC_OBJ_BRIDGE && io->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
        int parent = -1;
        if (!host) {
          // I/O without a host bridge above it: invent one attached here.
          PciNode hb;
          hb.kind = PciKind::kHostBridge;
          hb.implicit = true;
          hb.addr = pci_address(io);
          hb.addr.dev = hb.addr.fn = 0;
          hb.bus_last = hb.addr.bus;
          hb.locality = locality_of(obj);
          parent = static_cast<int>(d.pci.size());
          d.pci.push_back(std::move(hb));
        }
        add_io_subtree(d, io, parent, obj);
      }
      // Children in reverse so the stack visits them in order.
      std::vector<hwloc_obj_t> kids;
      for (hwloc_obj_t c = obj->first_child; c; c = c->next_sibling) kids.push_back(c);
      for (hwloc_obj_t c = obj->memory_first_child; c; c = c->next_sibling) kids.push_back(c);
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack.push_back(*it);
    }
  }

  static PciAddress pci_address(hwloc_obj_t io) {
    PciAddress a;
    if (io->type == HWLOC_OBJ_PCI_DEVICE) {
      const auto& p = io->attr->pcidev;
      a = {p.domain, p.bus, static_cast<uint8_t>(p.dev & 31), static_cast<uint8_t>(p.func & 7)};
    } else if (io->type == HWLOC_OBJ_BRIDGE) {
      const auto& b = io->attr->bridge;
      if (b.upstream_type == HWLOC_OBJ_BRIDGE_PCI) {
        const auto& p = b.upstream.pci;
        a = {p.domain, p.bus, static_cast<uint8_t>(p.dev & 31), static_cast<uint8_t>(p.func & 7)};
      } else {
        a = {b.downstream.pci.domain, b.downstream.pci.secondary_bus, 0, 0};
      }
    }
    return a;
  }

  void add_io_subtree(TopologyData& d, hwloc_obj_t top, int top_parent, hwloc_obj_t attach) {
    std::vector<std::pair<hwloc_obj_t, int>> stack{{top, top_parent}};
    while (!stack.empty()) {
      auto [obj, parent] = stack.back();
      stack.pop_back();
      if (obj->type == HWLOC_OBJ_OS_DEVICE) {
        if (parent >= 0) add_os_device(d.pci[parent], obj);
        continue;
      }
      if (obj->type != HWLOC_OBJ_BRIDGE && obj->type != HWLOC_OBJ_PCI_DEVICE) continue;
      PciNode node;
      node.addr = pci_address(obj);
      if (obj->type == HWLOC_OBJ_BRIDGE) {
        const auto& b = obj->attr->bridge;
        const bool host = b.upstream_type == HWLOC_OBJ_BRIDGE_HOST && parent < 0;
        node.kind = host ? PciKind::kHostBridge : PciKind::kBridge;
        if (b.downstream_type == HWLOC_OBJ_BRIDGE_PCI)
          node.bus_last = b.downstream.pci.subordinate_bus;
        if (b.upstream_type == HWLOC_OBJ_BRIDGE_PCI) {
          node.vendor_id = b.upstream.pci.vendor_id;
          node.device_id = b.upstream.pci.device_id;
          node.class_id = b.upstream.pci.class_id;
          node.link = speed_of(b.upstream.pci.linkspeed);
        }
        if (host) node.locality = locality_of(attach);
      } else {
        const auto& p = obj->attr->pcidev;
        node.kind = PciKind::kDevice;
        node.vendor_id = p.vendor_id;
        node.device_id = p.device_id;
        node.class_id = p.class_id;
        node.link = speed_of(p.linkspeed);
        node.name = info(obj, "PCIDevice");
      }
      if (node.kind != PciKind::kHostBridge && parent < 0) continue;  // cannot happen: guarded
      node.parent = node.kind == PciKind::kHostBridge ? -1 : parent;
      const int index = static_cast<int>(d.pci.size());
      d.pci.push_back(std::move(node));
      std::vector<hwloc_obj_t> kids;
      for (hwloc_obj_t c = obj->io_first_child; c; c = c->next_sibling) kids.push_back(c);
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack.emplace_back(*it, index);
    }
  }

  static void add_os_device(PciNode& node, hwloc_obj_t os) {
    if (!os->name) return;
    node.os_devices.emplace_back(os->name);
    if (os->attr && os->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS &&
        node.rdma_device.empty()) {
      node.rdma_device = os->name;
    }
    // The GPU model reported by NVML/CUDA/OpenCL beats the PCI database name.
    const char* model = info(os, "GPUModel");
    if (*model) node.name = model;
  }

  hwloc_topology_t topo_;
  std::map<hwloc_obj_t, int> package_index_;
  std::vector<hwloc_obj_t> package_objs_;
};

DataError xml_error(const std::string& name, const std::string& what, const std::string& hint) {
  return DataError(fmt::format("cannot load hwloc XML '{}': {}", name, what), hint);
}

// The text of `version` in `<topology version="3.0">` ("3.0"), or "" when the element or the
// attribute is absent (hwloc 1.x files have no version attribute).
std::string xml_version(const std::string& xml) {
  const size_t open = xml.find("<topology");
  if (open == std::string::npos || open > 4096) return "";
  const size_t close = xml.find('>', open);
  if (close == std::string::npos) return "";
  const std::string attrs = xml.substr(open, close - open);
  for (size_t at = attrs.find("version"); at != std::string::npos;
       at = attrs.find("version", at + 7)) {
    size_t i = at + 7;
    while (i < attrs.size() && attrs[i] == ' ') ++i;
    if (i >= attrs.size() || attrs[i] != '=') continue;
    ++i;
    while (i < attrs.size() && attrs[i] == ' ') ++i;
    if (i < attrs.size() && (attrs[i] == '"' || attrs[i] == '\'')) ++i;
    std::string version;
    while (i < attrs.size() && version.size() < 16 &&
           (std::isdigit(static_cast<unsigned char>(attrs[i])) || attrs[i] == '.')) {
      version += attrs[i++];
    }
    return version;
  }
  return "";
}

// hwloc 2.9 imports XML versions 1.x and 2.x only; say so before hwloc fails tersely.
void check_xml_version(const std::string& xml, const std::string& name) {
  const std::string version = xml_version(xml);
  const size_t digits = version.find_first_not_of("0123456789");
  const std::string major = version.substr(0, digits);
  if (!major.empty() && (major.size() > 6 || std::stoi(major) > 2)) {
    throw xml_error(name,
                    fmt::format("XML version {} is newer than this hwloc ({}) can import (it "
                                "reads 1.x and 2.x)",
                                version, hwloc_version()),
                    "export the machine with hwloc 2.x (lstopo --of xml) or pass an XML from an "
                    "hwloc 2.x release tag");
  }
}

}  // namespace

std::string hwloc_version() {
  // The release this program was built against (Debian ships headers and library together);
  // hwloc_get_api_version() would give the API level, 2.8.0 for hwloc 2.9.
  return HWLOC_VERSION;
}

HwlocTopology HwlocTopology::live() {
  hwloc_topology_t topo = nullptr;
  HWLOC_CHECK(hwloc_topology_init(&topo));
  try {
    HWLOC_CHECK(hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT));
    HWLOC_CHECK(hwloc_topology_load(topo));
  } catch (...) {
    hwloc_topology_destroy(topo);
    throw;
  }
  return HwlocTopology(topo, true, "live");
}

HwlocTopology HwlocTopology::from_xml(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw xml_error(path, "no such file", "check the path given to --xml");
  }
  if (!fs::is_regular_file(status)) {
    throw xml_error(path, "not a regular file", "pass an XML file written by lstopo --of xml");
  }
  const auto size = fs::file_size(path, ec);
  if (ec || size > kMaxXmlBytes) {
    throw xml_error(path, ec ? ec.message() : fmt::format("file of {} bytes is too large", size),
                    "pass an XML file written by lstopo --of xml");
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in.good() && !in.eof()) {
    throw xml_error(path, "cannot read the file", "check the file's permissions");
  }
  HwlocTopology t = from_xml_buffer(buffer.str(), path);
  t.source_ = "xml:" + path;
  return t;
}

HwlocTopology HwlocTopology::from_xml_buffer(const std::string& xml, const std::string& name) {
  if (xml.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw xml_error(name, "the file is empty", "pass an XML file written by lstopo --of xml");
  }
  if (xml.size() > kMaxXmlBytes) {
    throw xml_error(name, "too large", "pass an XML file written by lstopo --of xml");
  }
  check_xml_version(xml, name);
  hwloc_topology_t topo = nullptr;
  HWLOC_CHECK(hwloc_topology_init(&topo));
  try {
    HWLOC_CHECK(hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT));
    // The size includes the terminating NUL, as hwloc_topology_export_xmlbuffer reports it.
    if (hwloc_topology_set_xmlbuffer(topo, xml.c_str(), static_cast<int>(xml.size() + 1)) < 0) {
      throw xml_error(name, "not a valid hwloc XML topology (malformed or truncated XML)",
                      "export it again with lstopo --of xml");
    }
    if (hwloc_topology_load(topo) < 0) {
      throw xml_error(name, "hwloc rejected its content (inconsistent or unsupported topology)",
                      "export it again with lstopo --of xml from hwloc 1.x or 2.x");
    }
  } catch (...) {
    hwloc_topology_destroy(topo);
    throw;
  }
  return HwlocTopology(topo, false, "xml:" + name);
}

HwlocTopology::HwlocTopology(HwlocTopology&& other) noexcept
    : topo_(other.topo_), live_(other.live_), source_(std::move(other.source_)) {
  other.topo_ = nullptr;
}

HwlocTopology& HwlocTopology::operator=(HwlocTopology&& other) noexcept {
  if (this != &other) {
    if (topo_) hwloc_topology_destroy(topo_);
    topo_ = other.topo_;
    live_ = other.live_;
    source_ = std::move(other.source_);
    other.topo_ = nullptr;
  }
  return *this;
}

HwlocTopology::~HwlocTopology() {
  if (topo_) hwloc_topology_destroy(topo_);
}

Topology HwlocTopology::model() const { return Topology(Converter(topo_).run(source_)); }

void HwlocTopology::export_xml(const std::string& path) const {
  HWLOC_CHECK(hwloc_topology_export_xml(topo_, path.c_str(), 0));
}

Topology discover_live() { return HwlocTopology::live().model(); }
Topology load_xml(const std::string& path) { return HwlocTopology::from_xml(path).model(); }

}  // namespace ferry
