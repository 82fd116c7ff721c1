// Text and JSON renderings of a Topology for topo-probe. Column layout follows
// `nvidia-smi topo -m`; the tree hides root ports and downstream ports (they are the inside of a
// root complex or switch, Note [Which bridges are switches]).
#include "topology/report.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "common/bytes.h"
#include "topology/paths.h"

namespace ferry {

namespace {

std::string hex4(uint16_t v) { return fmt::format("0x{:04x}", v); }

// " Tesla T4", or "" when the name is only the vendor:device pair already printed.
std::string name_of(const PciEndpoint& d) {
  return d.name == fmt::format("{:04x}:{:04x}", d.vendor_id, d.device_id) ? "" : " " + d.name;
}

// A short word for PCI functions the tree only counts.
std::string kind_word(const PciNode& p) {
  if (p.vendor_id == kNvidiaVendor && p.class_id == 0x0680) return "NVSwitch";
  switch (p.class_id >> 8) {
    case 0x01:
      return "storage";
    case 0x0b:
    case 0x12:
      return "accelerator";
    case 0x0c:
      return "serial bus";
    default:
      return "other";
  }
}

std::string gbps_text(const LinkSpeed& s, double fallback) {
  if (s.gbps) return s.str();
  return fmt::format("unknown (using {:.2f} GB/s)", fallback);
}

nlohmann::json device_json(const PciEndpoint& d) {
  nlohmann::json j;
  j["index"] = d.index;
  j["pci"] = d.addr.str();
  j["vendor_id"] = hex4(d.vendor_id);
  j["device_id"] = hex4(d.device_id);
  j["name"] = d.name;
  j["numa"] = d.local_numa.front();
  j["root_complex"] = d.root_complex;
  j["switch"] = d.switches.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.switches.front());
  j["link_gbps"] = d.link.gbps ? nlohmann::json(*d.link.gbps) : nlohmann::json(nullptr);
  return j;
}

class TreePrinter {
 public:
  TreePrinter(const Topology& t, const LinkMap& links) : t_(t), links_(links) {
    for (const auto& g : t.gpus()) device_at_[g.node] = &g;
    for (const auto& n : t.nics()) device_at_[n.node] = &n;
    for (const auto& o : t.other_gpus()) device_at_[o.node] = &o;
  }

  std::string run() {
    for (const auto& rc : t_.root_complexes()) {
      const Link& l = links_.link(links_.root_complex_link(rc.index));
      std::string where =
          rc.locality.package >= 0
              ? fmt::format("package {}", t_.packages()[rc.locality.package].os_index)
              : std::string("machine");
      out_ += fmt::format("RC{} {}  {}, NUMA {}, CPUs {}  root-complex {:.2f} GB/s ({})\n",
                          rc.index, rc.label, where, format_index_list(rc.locality.numa),
                          cpus_text(rc.locality.cpus), l.gbps, l.basis);
      children(rc.node, 1);
    }
    for (const auto& l : links_.links()) {
      if (l.kind != LinkKind::kInterSocket) continue;
      out_ += fmt::format("{}: {:.2f} GB/s ({})\n", l.name, l.gbps, l.basis);
    }
    return out_;
  }

 private:
  static std::string cpus_text(const std::vector<int>& cpus) {
    return cpus.empty() ? "none" : format_index_list(cpus);
  }

  // Prints what is below `node` at `indent`, seeing through non-switch bridges.
  void children(int node, int indent) {
    std::map<std::string, int> others;
    walk(node, indent, others);
    if (others.empty()) return;
    std::string list;
    for (const auto& [word, count] : others) {
      list += fmt::format("{}{} {}", list.empty() ? "" : ", ", count, word);
    }
    out_ += fmt::format("{}(other PCI functions: {})\n", pad(indent), list);
  }

  void walk(int node, int indent, std::map<std::string, int>& others) {
    for (int c : t_.pci()[node].children) {
      const PciNode& p = t_.pci()[c];
      if (const int s = t_.switch_at(c); s >= 0) {
        const Switch& sw = t_.switches()[s];
        const Link& l = links_.link(links_.switch_uplink(s));
        out_ += fmt::format("{}SW{} {} [{:04x}:{:04x}] switch level {}, uplink {}\n", pad(indent),
                            sw.index, sw.addr.str(), sw.vendor_id, sw.device_id, sw.level,
                            gbps_text(sw.uplink, l.gbps));
        children(c, indent + 1);
      } else if (p.kind == PciKind::kBridge) {
        walk(c, indent, others);
      } else if (auto it = device_at_.find(c); it != device_at_.end()) {
        device(*it->second, indent);
      } else {
        ++others[kind_word(p)];
      }
    }
  }

  void device(const PciEndpoint& d, int indent) {
    std::string extra;
    double fallback = 0;
    switch (d.kind) {
      case DeviceKind::kNvidiaGpu:
        fallback = links_.link(links_.gpu_uplink(d.index)).gbps;
        break;
      case DeviceKind::kNic:
        fallback = links_.link(links_.nic_uplink(d.index)).gbps;
        extra = fmt::format(" ({}, {}{})", d.os_name, nic_kind_name(d.nic_kind),
                            d.rdma ? ", RDMA" : "");
        break;
      case DeviceKind::kOtherGpu:
        extra = " (not NVIDIA: not used)";
        break;
    }
    const std::string speed =
        d.kind == DeviceKind::kOtherGpu ? d.link.str() : gbps_text(d.link, fallback);
    out_ += fmt::format("{}{} {} [{:04x}:{:04x}]{}{}, link {}\n", pad(indent), d.label,
                        d.addr.str(), d.vendor_id, d.device_id, name_of(d), extra, speed);
  }

  static std::string pad(int indent) { return std::string(2 * indent, ' '); }

  const Topology& t_;
  const LinkMap& links_;
  std::map<int, const PciEndpoint*> device_at_;
  std::string out_;
};

}  // namespace

std::string format_matrix(const Topology& t) {
  std::string out;
  if (t.gpus().empty()) out += "No NVIDIA GPU found.\n";
  for (const auto& o : t.other_gpus()) {
    out += fmt::format("Not used: {} {} [{:04x}:{:04x}] {} (not an NVIDIA GPU), NUMA {}\n", o.label,
                       o.addr.str(), o.vendor_id, o.device_id, o.name,
                       format_index_list(o.local_numa));
  }
  const auto matrix = class_matrix(t);
  if (!matrix.empty()) {
    std::vector<std::string> labels;
    for (const auto& g : t.gpus()) labels.push_back(g.label);
    for (const auto& n : t.nics()) labels.push_back(n.label);
    size_t width = 6;
    for (const auto& l : labels) width = std::max(width, l.size() + 2);
    if (!out.empty()) out += "\n";
    out += std::string(width, ' ');
    for (const auto& l : labels) out += fmt::format("{:<{}}", l, width);
    size_t cpu_width = 16;
    for (const auto& g : t.gpus()) {
      cpu_width =
          std::max(cpu_width,
                   format_index_list(t.root_complexes()[g.root_complex].locality.cpus).size() + 2);
    }
    out += fmt::format("{:<{}}{}\n", "CPU Affinity", cpu_width, "NUMA Affinity");
    for (size_t i = 0; i < matrix.size(); ++i) {
      out += fmt::format("{:<{}}", labels[i], width);
      for (const auto& cell : matrix[i]) {
        out += fmt::format("{:<{}}", cell == "X" ? " X" : cell, width);
      }
      if (i < t.gpus().size()) {
        const PciEndpoint& g = t.gpus()[i];
        const auto& cpus = t.root_complexes()[g.root_complex].locality.cpus;
        out += fmt::format("{:<{}}{}", cpus.empty() ? "N/A" : format_index_list(cpus), cpu_width,
                           format_index_list(g.local_numa));
      }
      while (!out.empty() && out.back() == ' ') out.pop_back();
      out += "\n";
    }
    out += "\nLegend:\n\n  X    = Self\n";
    for (PathClass c :
         {PathClass::kSys, PathClass::kNode, PathClass::kPhb, PathClass::kPxb, PathClass::kPix}) {
      out += fmt::format("  {:<4} = {}\n", path_class_name(c), path_class_legend(c));
    }
    out += "  (PCIe only: NVLink connections are not shown)\n";
    if (!t.nics().empty()) {
      out += "\nNIC Legend:\n\n";
      for (const auto& n : t.nics()) {
        out += fmt::format("  {}: {} ({}, {}{})\n", n.label, n.os_name, n.addr.str(),
                           nic_kind_name(n.nic_kind), n.rdma ? ", RDMA" : "");
      }
    }
  }
  return out;
}

std::string format_tree(const Topology& t, const LinkMap& links) {
  size_t memory_only = 0;
  for (const auto& m : t.numa_nodes()) memory_only += m.has_cpus() ? 0 : 1;
  std::string out = fmt::format(
      "Machine '{}' ({}): {} package{}, {} NUMA node{}{}, {} NVIDIA GPU{}, {} NIC{}\n", t.name(),
      t.source(), t.packages().size(), t.packages().size() == 1 ? "" : "s", t.numa_nodes().size(),
      t.numa_nodes().size() == 1 ? "" : "s",
      memory_only ? fmt::format(" ({} without CPUs)", memory_only) : std::string(), t.gpus().size(),
      t.gpus().size() == 1 ? "" : "s", t.nics().size(), t.nics().size() == 1 ? "" : "s");
  for (const auto& m : t.numa_nodes()) {
    const std::string pkg = m.package >= 0
                                ? fmt::format("package {}", t.packages()[m.package].os_index)
                                : std::string("no package");
    out += fmt::format("  NUMA {}: {}, {}, CPUs {}\n", m.os_index, format_bytes(m.memory_bytes),
                       pkg, m.has_cpus() ? format_index_list(m.cpus) : "none (memory only)");
  }
  out += TreePrinter(t, links).run();
  return out;
}

nlohmann::json to_json(const Topology& t, const LinkMap& links) {
  nlohmann::json j;
  j["gpus"] = nlohmann::json::array();
  for (const auto& g : t.gpus()) j["gpus"].push_back(device_json(g));
  j["nics"] = nlohmann::json::array();
  for (const auto& n : t.nics()) {
    nlohmann::json nic = device_json(n);
    nic["kind"] = nic_kind_name(n.nic_kind);
    nic["os_name"] = n.os_name;
    nic["rdma"] = n.rdma;
    j["nics"].push_back(std::move(nic));
  }
  j["matrix"] = class_matrix(t);
  j["groups"]["root_complex"] = links.gpu_groups(LinkKind::kRootComplex);
  j["groups"]["switch"] = links.gpu_groups(LinkKind::kSwitchUplink);
  return j;
}

}  // namespace ferry
