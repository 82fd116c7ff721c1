// Progressive filling: raise every unfrozen flow's rate together until some link-direction
// saturates, freeze the flows crossing it, repeat until every flow is frozen.
#include "links/fair_rates.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace ferry {

double direction_capacity(const LinkCapacity& link, TransferDirection direction,
                          bool other_direction_busy) {
  double c = direction == TransferDirection::kToHost ? link.to_host_gbps : link.to_device_gbps;
  if (other_direction_busy) c *= link.duplex_factor;
  return std::max(c, 0.0);
}

std::vector<double> fair_rates(const std::vector<LinkCapacity>& links,
                               const std::vector<Flow>& flows) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const size_t n_links = links.size();
  // Resources: link * 2 + direction. Each flow's distinct resources.
  auto resource = [](int link, TransferDirection d) {
    return static_cast<size_t>(link) * 2 + (d == TransferDirection::kToDevice ? 1 : 0);
  };
  std::vector<std::vector<size_t>> uses(flows.size());
  std::vector<bool> busy(n_links * 2, false);
  for (size_t f = 0; f < flows.size(); ++f) {
    const Flow& flow = flows[f];
    if (!flow.link_directions.empty() && flow.link_directions.size() != flow.links.size())
      throw std::invalid_argument("fair_rates: flow " + std::to_string(f) + " has " +
                                  std::to_string(flow.link_directions.size()) +
                                  " link directions for " + std::to_string(flow.links.size()) +
                                  " links");
    for (size_t i = 0; i < flow.links.size(); ++i) {
      const int link = flow.links[i];
      if (link < 0 || static_cast<size_t>(link) >= n_links)
        throw std::out_of_range("fair_rates: link index " + std::to_string(link) + " outside " +
                                std::to_string(n_links) + " links");
      size_t r = resource(link, link_direction(flow, i));
      if (std::find(uses[f].begin(), uses[f].end(), r) == uses[f].end()) uses[f].push_back(r);
      busy[r] = true;
    }
  }
  std::vector<double> capacity(n_links * 2, 0.0);
  for (size_t l = 0; l < n_links; ++l) {
    bool both = busy[l * 2] && busy[l * 2 + 1];
    capacity[l * 2] = direction_capacity(links[l], TransferDirection::kToHost, both);
    capacity[l * 2 + 1] = direction_capacity(links[l], TransferDirection::kToDevice, both);
  }

  std::vector<double> rate(flows.size(), 0.0);
  std::vector<bool> frozen(flows.size(), false);
  size_t unfrozen = 0;
  for (size_t f = 0; f < flows.size(); ++f) {
    if (uses[f].empty()) {
      rate[f] = kInf;
      frozen[f] = true;
    } else {
      ++unfrozen;
    }
  }
  std::vector<double> used(n_links * 2, 0.0);
  std::vector<size_t> count(n_links * 2, 0);
  while (unfrozen > 0) {
    std::fill(count.begin(), count.end(), 0);
    for (size_t f = 0; f < flows.size(); ++f)
      if (!frozen[f])
        for (size_t r : uses[f]) ++count[r];
    std::vector<double> headroom(count.size(), kInf);
    double step = kInf;
    for (size_t r = 0; r < count.size(); ++r) {
      if (count[r] == 0) continue;
      headroom[r] = std::max(0.0, capacity[r] - used[r]) / static_cast<double>(count[r]);
      step = std::min(step, headroom[r]);
    }
    for (size_t f = 0; f < flows.size(); ++f) {
      if (frozen[f]) continue;
      rate[f] += step;
      for (size_t r : uses[f]) used[r] += step;
    }
    // The resources that set the step are saturated now (a relative tolerance for rounding);
    // at least one always is, so every round freezes at least one flow.
    std::vector<bool> saturated(count.size(), false);
    for (size_t r = 0; r < count.size(); ++r)
      if (count[r] > 0 && headroom[r] <= step + 1e-12 * std::max(1.0, step)) saturated[r] = true;
    for (size_t f = 0; f < flows.size(); ++f) {
      if (frozen[f]) continue;
      if (std::any_of(uses[f].begin(), uses[f].end(), [&](size_t r) { return saturated[r]; })) {
        frozen[f] = true;
        --unfrozen;
      }
    }
  }
  return rate;
}

}  // namespace ferry
