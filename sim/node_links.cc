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

}  // namespace

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
    for (size_t r = 0; r < n; ++r) {
      const size_t q = (r + 1) % n;
      const std::vector<int> a = map.gpu_path(out.gpus[r], bindings[q].numa);
      const std::vector<int>& b = out.paths[q];
      const std::vector<int> common = LinkMap::shared(a, b);
      SimHop hop;
      hop.up = minus(a, common);
      hop.down = minus(b, common);
      // Peer traffic between switches of one root complex turns around in it.
      for (int l : common)
        if (map.link(l).kind == LinkKind::kRootComplex) hop.up.push_back(l);
      out.ring.push_back(std::move(hop));
    }
  }
  return out;
}

EffectiveBandwidth effective_bandwidth(const NodeLinks& nl, int rank, TransferDirection d) {
  std::vector<LinkCapacity> caps;
  for (const NamedLink& l : nl.links) caps.push_back(l.capacity);
  std::vector<Flow> flows;
  for (const auto& p : nl.paths) flows.push_back({p, d});
  const std::vector<double> rates = fair_share_rates(caps, flows);
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
