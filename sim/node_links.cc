// Capacities from the LinkMap and a profile; ring hops from the two GPUs' routes.
#include "sim/node_links.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::vector<int> minus(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  for (int x : a)
    if (!contains(b, x)) out.push_back(x);
  return out;
}

// The hop from a path `a` up to where it meets path `b`, then down `b`. Traffic between two
// devices under one switch turns around in that switch, between switches of one root complex in
// the root complex, which it then crosses (Note [Ring channels] in node_links.h).
SimHop hop_between(const LinkMap& map, const std::vector<int>& a, const std::vector<int>& b) {
  const std::vector<int> common = LinkMap::shared(a, b);
  SimHop hop;
  hop.up = minus(a, common);
  hop.down = minus(b, common);
  const bool under_one_switch = std::any_of(common.begin(), common.end(), [&](int l) {
    return map.link(l).kind == LinkKind::kSwitchUplink;
  });
  if (under_one_switch) return hop;
  for (int l : common)
    if (map.link(l).kind == LinkKind::kRootComplex) hop.up.push_back(l);
  return hop;
}

// The NICs a job's rings leave a node by: the RDMA-capable ones, all when none is.
std::vector<int> ring_nics(const Topology& topology) {
  std::vector<int> nics;
  for (const auto& nic : topology.nics())
    if (nic.rdma) nics.push_back(nic.index);
  if (nics.empty())
    for (const auto& nic : topology.nics()) nics.push_back(nic.index);
  return nics;
}

}  // namespace

int ring_channels(const Topology& topology) {
  return std::max<int>(1, static_cast<int>(ring_nics(topology).size()));
}

NodeLinks node_links(const Topology& topology, const std::vector<RankBinding>& bindings,
                     const HardwareProfile* profile, const LinkOptions& options,
                     double duplex_factor) {
  const LinkMap map(topology, options);
  NodeLinks out;
  for (const Link& l : map.links()) {
    NamedLink s;
    s.name = l.name;
    s.capacity = {l.gbps, l.gbps, profile ? 1.0 : duplex_factor};
    const bool pcie = l.kind == LinkKind::kGpuUplink || l.kind == LinkKind::kNicUplink ||
                      l.kind == LinkKind::kSwitchUplink;
    if (profile && pcie) {
      s.capacity.to_host_gbps = l.gbps * profile->efficiency(TransferDirection::kToHost);
      s.capacity.to_device_gbps = l.gbps * profile->efficiency(TransferDirection::kToDevice);
      s.capacity.duplex_factor =
          profile->duplex_given ? profile->gpu_link.duplex_factor : duplex_factor;
      if (l.kind == LinkKind::kGpuUplink) {
        s.capacity.to_host_gbps = std::min(s.capacity.to_host_gbps, profile->gpu_link.to_host_gbps);
        s.capacity.to_device_gbps =
            std::min(s.capacity.to_device_gbps, profile->gpu_link.to_device_gbps);
      }
    }
    out.links.push_back(std::move(s));
    out.kinds.push_back(link_kind_name(l.kind));
  }
  for (const RankBinding& b : bindings) {
    if (!b.gpu)
      throw ConfigError(
          fmt::format("rank {} drives no GPU: the simulator needs one per rank", b.local_rank),
          "use a topology with at least as many GPUs as ranks");
    out.gpus.push_back(*b.gpu);
    out.paths.push_back(map.gpu_path(*b.gpu, b.numa));
  }
  const size_t n = bindings.size();
  if (n > 1) {
    // Note [Ring channels]: as many channels as the job uses across nodes, each the node's ring.
    const int channels = ring_channels(topology);
    for (int c = 0; c < channels; ++c) {
      for (size_t r = 0; r < n; ++r) {
        const size_t q = (r + 1) % n;
        out.ring.push_back(
            hop_between(map, map.gpu_path(out.gpus[r], bindings[q].numa), out.paths[q]));
      }
    }
  }
  return out;
}

std::vector<SimHop> cross_node_rings(const Topology& topology,
                                     const std::vector<RankBinding>& bindings, NodeLinks& links,
                                     double nic_gbps, const LinkOptions& options) {
  const LinkMap map(topology, options);
  const std::vector<int> nics = ring_nics(topology);
  if (nics.empty()) {
    throw ConfigError(
        fmt::format("--nodes: topology '{}' has no network adapter (NIC) to leave a node by",
                    topology.name()),
        "give a topology whose NICs sit in its PCIe tree (an hwloc export with I/O devices, or "
        "a synthetic YAML with nics), or simulate one node");
  }
  if (!(nic_gbps > 0)) {
    throw ConfigError("--nodes: the NICs' network rate is not known",
                      "give --hardware with a profile that states network.nic_gbps");
  }
  const size_t n = bindings.size();
  std::vector<SimHop> ring;
  for (int nic : nics) {
    const int wire = static_cast<int>(links.links.size());
    links.links.push_back({fmt::format("network NIC{}", nic), {nic_gbps, nic_gbps, 1.0}});
    links.kinds.push_back("network");
    // The ring neighbours (exit r, entry r+1) whose paths share the most links with the NIC's.
    size_t exit = 0;
    size_t best = 0;
    for (size_t r = 0; r < n; ++r) {
      const size_t q = (r + 1) % n;
      const size_t near = LinkMap::shared(map.gpu_path(links.gpus[r], bindings[r].numa),
                                          map.nic_path(nic, bindings[r].numa))
                              .size() +
                          LinkMap::shared(map.gpu_path(links.gpus[q], bindings[q].numa),
                                          map.nic_path(nic, bindings[q].numa))
                              .size();
      if (near > best) best = near, exit = r;
    }
    const size_t entry = (exit + 1) % n;
    for (size_t r = 0; r < n; ++r) {
      if (r != exit) {
        ring.push_back(n > 1 ? links.ring[r] : SimHop{});
        continue;
      }
      const int numa_out = bindings[exit].numa, numa_in = bindings[entry].numa;
      SimHop out =
          hop_between(map, map.gpu_path(links.gpus[exit], numa_out), map.nic_path(nic, numa_out));
      const SimHop in =
          hop_between(map, map.nic_path(nic, numa_in), map.gpu_path(links.gpus[entry], numa_in));
      out.down.push_back(wire);
      out.then_up = in.up;
      out.then_down = in.down;
      ring.push_back(std::move(out));
    }
  }
  return ring;
}

EffectiveBandwidth effective_bandwidth(const NodeLinks& nl, int rank, TransferDirection d) {
  std::vector<LinkCapacity> caps;
  for (const NamedLink& l : nl.links) caps.push_back(l.capacity);
  std::vector<Flow> flows;
  for (const auto& p : nl.paths) flows.push_back({p, d});
  const std::vector<double> rates = fair_rates(caps, flows);
  const auto cap = [&](int l) {
    const LinkCapacity& c = caps[static_cast<size_t>(l)];
    return d == TransferDirection::kToHost ? c.to_host_gbps : c.to_device_gbps;
  };
  EffectiveBandwidth e;
  const std::vector<int>& path = nl.paths.at(static_cast<size_t>(rank));
  e.own_gbps = std::numeric_limits<double>::infinity();
  int own_link = -1;
  for (int l : path) {
    if (cap(l) < e.own_gbps) {
      e.own_gbps = cap(l);
      own_link = l;
    }
  }
  e.shared_gbps = rates[static_cast<size_t>(rank)];
  // The bottleneck: the link on its path whose capacity split among its users is the least.
  double least = std::numeric_limits<double>::infinity();
  for (int l : path) {
    int users = 0;
    for (const auto& p : nl.paths) users += contains(p, l) ? 1 : 0;
    const double share = cap(l) / users;
    if (share < least - 1e-12) {
      least = share;
      e.bottleneck = nl.links[static_cast<size_t>(l)].name;
      e.sharers = users;
    }
  }
  const char* dir = d == TransferDirection::kToHost ? "to host" : "to device";
  if (path.empty()) {
    e.own_gbps = e.shared_gbps = 0;
    e.why = "no link";
  } else if (e.sharers <= 1 || e.shared_gbps >= e.own_gbps * (1 - 1e-9)) {
    e.why = fmt::format("{:.2f} GB/s {}: its own path, bottleneck {}", e.own_gbps, dir,
                        nl.links[static_cast<size_t>(own_link)].name);
  } else {
    e.why = fmt::format("{:.2f} GB/s {}: {} shared by {} ranks ({:.2f} GB/s alone)", e.shared_gbps,
                        dir, e.bottleneck, e.sharers, e.own_gbps);
  }
  return e;
}

}  // namespace ferry
