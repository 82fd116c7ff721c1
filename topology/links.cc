// Builds the link list of a Topology (ids ordered by kind, then by GPU, NIC, switch, root
// complex and package pair) and the per-device routes to memory. Unknown speeds take the
// LinkOptions defaults here and nowhere else.
#include "topology/links.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

// The physical link above `node` (an endpoint or a switch upstream port) is reported by both of
// its ends. Prefer the lower end's report: some root ports report a slower or stale speed (AWS
// g4dn root ports say 2 GB/s under 15.75 GB/s GPUs); fall back to the upper port's report.
void set_speed(Link& link, const Topology& t, int node, double fallback) {
  const PciNode& p = t.pci()[node];
  const PciNode* above = p.parent >= 0 ? &t.pci()[p.parent] : nullptr;
  if (p.link.gbps) {
    link.gbps = *p.link.gbps;
    link.known = true;
    link.basis = p.link.str();
  } else if (above && above->kind == PciKind::kBridge && above->link.gbps) {
    link.gbps = *above->link.gbps;
    link.known = true;
    link.basis = above->link.str() + " (reported by the port above)";
  } else {
    link.gbps = fallback;
    link.known = false;
    link.basis = fmt::format("unknown, default {:.2f} GB/s", fallback);
  }
}

// Sum of the physical links right below a host bridge: one per root port (the functions below
// a root port share its link), plus integrated devices whose speed is known.
double root_complex_sum(const Topology& t, int host, double fallback, int* links) {
  double sum = 0;
  *links = 0;
  for (int c : t.pci()[host].children) {
    const PciNode& port = t.pci()[c];
    if (port.kind == PciKind::kBridge) {
      if (port.children.empty()) continue;
      double best = 0;
      for (int x : port.children) {
        Link probe;
        set_speed(probe, t, x, fallback);
        best = std::max(best, probe.gbps);
      }
      sum += best;
      ++*links;
    } else if (port.link.gbps) {
      sum += *port.link.gbps;
      ++*links;
    }
  }
  return *links > 0 ? sum : fallback;
}

void check_options(const LinkOptions& o) {
  const auto ok = plausible_link_gbps;
  if (!ok(o.default_pcie_gbps) || !ok(o.inter_socket_gbps) ||
      (o.root_complex_gbps && !ok(*o.root_complex_gbps))) {
    throw ConfigError(fmt::format("link bandwidth defaults must be in [{}, {}] GB/s",
                                  kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps),
                      "set default_pcie_gbps (topology.unknown_link_gbps), root_complex_gbps and "
                      "inter_socket_gbps within that range");
  }
}

}  // namespace

const char* link_kind_name(LinkKind kind) {
  switch (kind) {
    case LinkKind::kGpuUplink:
      return "gpu-uplink";
    case LinkKind::kNicUplink:
      return "nic-uplink";
    case LinkKind::kSwitchUplink:
      return "switch-uplink";
    case LinkKind::kRootComplex:
      return "root-complex";
    case LinkKind::kInterSocket:
      return "inter-socket";
  }
  return "link";
}

LinkMap::LinkMap(const Topology& t, const LinkOptions& options) : topology_name_(t.name()) {
  check_options(options);
  auto add = [&](LinkKind kind, std::string name) -> Link& {
    Link link;
    link.id = static_cast<int>(links_.size());
    link.kind = kind;
    link.name = std::move(name);
    links_.push_back(std::move(link));
    return links_.back();
  };
  // Functions of one PCI device (a dual-port NIC) share its link: key uplinks by domain:bus:dev.
  std::map<std::tuple<uint32_t, int, int>, int> device_link;
  auto uplink_of = [&](const PciEndpoint& d, LinkKind kind) -> Link& {
    const auto key = std::make_tuple(d.addr.domain, int{d.addr.bus}, int{d.addr.dev});
    if (auto it = device_link.find(key); it != device_link.end()) {
      links_[it->second].name += fmt::format(" +{}", d.label);
      return links_[it->second];
    }
    Link& l = add(kind, fmt::format("{} {} {}", link_kind_name(kind), d.label, d.addr.str()));
    set_speed(l, t, d.node, options.default_pcie_gbps);
    l.pci_node = d.node;
    l.index = d.index;
    device_link[key] = l.id;
    return l;
  };
  for (const auto& g : t.gpus()) {
    Link& l = uplink_of(g, LinkKind::kGpuUplink);
    l.gpus.push_back(g.index);
    gpu_uplinks_.push_back(l.id);
  }
  for (const auto& nic : t.nics()) {
    Link& l = uplink_of(nic, LinkKind::kNicUplink);
    l.nics.push_back(nic.index);
    nic_uplinks_.push_back(l.id);
  }
  for (const auto& sw : t.switches()) {
    Link& l =
        add(LinkKind::kSwitchUplink, fmt::format("switch-uplink SW{} {}", sw.index, sw.addr.str()));
    set_speed(l, t, sw.node, options.default_pcie_gbps);
    l.pci_node = sw.node;
    l.index = sw.index;
    l.gpus = sw.gpus;
    l.nics = sw.nics;
    switch_links_.push_back(l.id);
  }
  for (const auto& rc : t.root_complexes()) {
    Link& l = add(LinkKind::kRootComplex, fmt::format("root-complex RC{} {}", rc.index, rc.label));
    l.pci_node = rc.node;
    l.index = rc.index;
    l.gpus = rc.gpus;
    l.nics = rc.nics;
    if (rc.gbps) {
      l.gbps = *rc.gbps;
      l.known = true;
      l.basis = "declared";
    } else if (options.root_complex_gbps) {
      l.gbps = *options.root_complex_gbps;
      l.basis = fmt::format("unknown, default {:.2f} GB/s", l.gbps);
    } else {
      int below = 0;
      l.gbps = std::min(root_complex_sum(t, rc.node, options.default_pcie_gbps, &below),
                        kMaxPlausibleLinkGbps);
      l.basis = below == 0 ? fmt::format("unknown, default {:.2f} GB/s", l.gbps)
                           : fmt::format("unknown, sum of the {} link{} below it", below,
                                         below == 1 ? "" : "s");
    }
    rc_links_.push_back(l.id);
  }
  packages_ = static_cast<int>(t.packages().size());
  inter_socket_.assign(static_cast<size_t>(packages_) * packages_, -1);
  for (int a = 0; a < packages_; ++a) {
    for (int b = a + 1; b < packages_; ++b) {
      Link& l = add(LinkKind::kInterSocket,
                    fmt::format("inter-socket package {}-{}", t.packages()[a].os_index,
                                t.packages()[b].os_index));
      if (t.inter_socket_gbps()) {
        l.gbps = *t.inter_socket_gbps();
        l.known = true;
        l.basis = "declared";
      } else {
        l.gbps = options.inter_socket_gbps;
        l.basis = fmt::format("unknown, default {:.2f} GB/s", l.gbps);
      }
      l.package_a = a;
      l.package_b = b;
      for (const auto& g : t.gpus()) {
        const int p = t.root_complexes()[g.root_complex].locality.package;
        if (p == a || p == b) l.gpus.push_back(g.index);
      }
      for (const auto& nic : t.nics()) {
        const int p = t.root_complexes()[nic.root_complex].locality.package;
        if (p == a || p == b) l.nics.push_back(nic.index);
      }
      inter_socket_[a * packages_ + b] = inter_socket_[b * packages_ + a] = l.id;
    }
  }
  auto route = [&](const PciEndpoint& d, int uplink) {
    Route r;
    r.links.push_back(uplink);
    for (int s : d.switches) r.links.push_back(switch_links_[s]);
    r.links.push_back(rc_links_[d.root_complex]);
    r.local_numa = t.root_complexes()[d.root_complex].locality.numa;
    r.package = t.root_complexes()[d.root_complex].locality.package;
    return r;
  };
  for (const auto& g : t.gpus()) gpu_routes_.push_back(route(g, gpu_uplinks_[g.index]));
  for (const auto& nic : t.nics()) nic_routes_.push_back(route(nic, nic_uplinks_[nic.index]));
  for (const auto& m : t.numa_nodes()) numa_package_.emplace_back(m.os_index, m.package);
}

std::vector<int> LinkMap::route_to(const Route& route, int numa) const {
  auto it = std::find_if(numa_package_.begin(), numa_package_.end(),
                         [&](const auto& p) { return p.first == numa; });
  if (it == numa_package_.end()) {
    throw ConfigError(
        fmt::format("NUMA node {} does not exist in topology '{}'", numa, topology_name_),
        "route to a NUMA node listed by topo-probe");
  }
  std::vector<int> path = route.links;
  const bool local = std::binary_search(route.local_numa.begin(), route.local_numa.end(), numa);
  const int target_package = it->second;
  if (!local && route.package >= 0 && target_package >= 0 && target_package != route.package) {
    path.push_back(inter_socket_link(route.package, target_package));
  }
  return path;
}

std::vector<int> LinkMap::gpu_path(int gpu, int numa) const {
  if (gpu < 0 || gpu >= static_cast<int>(gpu_routes_.size())) {
    throw ConfigError(fmt::format("GPU {} does not exist: topology '{}' has {} NVIDIA GPUs", gpu,
                                  topology_name_, gpu_routes_.size()),
                      "use a GPU index below the GPU count");
  }
  return route_to(gpu_routes_[gpu], numa);
}

std::vector<int> LinkMap::nic_path(int nic, int numa) const {
  if (nic < 0 || nic >= static_cast<int>(nic_routes_.size())) {
    throw ConfigError(fmt::format("NIC {} does not exist: topology '{}' has {} NICs", nic,
                                  topology_name_, nic_routes_.size()),
                      "use a NIC index below the NIC count");
  }
  return route_to(nic_routes_[nic], numa);
}

double LinkMap::bottleneck_gbps(const std::vector<int>& path) const {
  if (path.empty()) return 0;
  double best = links_.at(path.front()).gbps;
  for (int id : path) best = std::min(best, links_.at(id).gbps);
  return best;
}

std::vector<int> LinkMap::shared(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  for (int id : a) {
    if (std::find(b.begin(), b.end(), id) != b.end()) out.push_back(id);
  }
  return out;
}

std::vector<std::vector<int>> LinkMap::gpu_groups(LinkKind kind) const {
  std::vector<std::vector<int>> groups;
  for (const auto& l : links_) {
    if (l.kind == kind && !l.gpus.empty()) groups.push_back(l.gpus);
  }
  return groups;
}

int LinkMap::gpu_uplink(int gpu) const { return gpu_routes_.at(gpu).links.front(); }
int LinkMap::nic_uplink(int nic) const { return nic_routes_.at(nic).links.front(); }
int LinkMap::switch_uplink(int sw) const { return switch_links_.at(sw); }
int LinkMap::root_complex_link(int rc) const { return rc_links_.at(rc); }

int LinkMap::inter_socket_link(int a, int b) const {
  if (a < 0 || b < 0 || a >= packages_ || b >= packages_) return -1;
  return inter_socket_[a * packages_ + b];
}

}  // namespace ferry
