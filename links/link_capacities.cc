// Capacities and arbitrated links from a LinkMap.
#include "links/link_capacities.h"

#include <algorithm>
#include <limits>

namespace ferry {

namespace {
double cap(const LinkCapacity& c, TransferDirection d) {
  return d == TransferDirection::kToHost ? c.to_host_gbps : c.to_device_gbps;
}
double bottleneck(const std::vector<LinkCapacity>& caps, const std::vector<int>& path,
                  TransferDirection d) {
  double b = std::numeric_limits<double>::infinity();
  for (int id : path) b = std::min(b, cap(caps.at(static_cast<size_t>(id)), d));
  return path.empty() ? 0 : b;
}
}  // namespace

std::vector<LinkCapacity> link_capacities(const LinkMap& map, double duplex_factor,
                                          double time_scale) {
  std::vector<LinkCapacity> out;
  out.reserve(map.links().size());
  for (const Link& l : map.links()) {
    const double g = l.gbps / time_scale;
    out.push_back(LinkCapacity{g, g, duplex_factor});
  }
  return out;
}

CopyPath copy_path(const LinkMap& map, const std::vector<LinkCapacity>& capacities, int gpu,
                   int numa) {
  CopyPath p;
  p.links = map.gpu_path(gpu, numa);
  p.to_host_gbps = bottleneck(capacities, p.links, TransferDirection::kToHost);
  p.to_device_gbps = bottleneck(capacities, p.links, TransferDirection::kToDevice);
  return p;
}

std::vector<int> arbitrated_links(const std::vector<LinkCapacity>& capacities,
                                  const std::vector<int>& path, TransferDirection direction) {
  const double b = bottleneck(capacities, path, direction);
  std::vector<int> out;
  for (int id : path)
    if (cap(capacities.at(static_cast<size_t>(id)), direction) <= b * 1.001) out.push_back(id);
  return out;
}

Flow arbitrated_flow(const std::vector<LinkCapacity>& capacities, const Flow& flow) {
  double b = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < flow.links.size(); ++i)
    b = std::min(b,
                 cap(capacities.at(static_cast<size_t>(flow.links[i])), link_direction(flow, i)));
  Flow out{{}, flow.direction, {}};
  for (size_t i = 0; i < flow.links.size(); ++i) {
    const TransferDirection d = link_direction(flow, i);
    if (!(b > 0.5 * cap(capacities.at(static_cast<size_t>(flow.links[i])), d))) continue;
    out.links.push_back(flow.links[i]);
    out.link_directions.push_back(d);
  }
  return out;
}

}  // namespace ferry
