// Greedy least-slack-first grant over link-direction tokens.
#include "links/arbiter_policy.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

namespace ferry {

double chunk_latest_start(double deadline, uint64_t remaining_bytes, double bytes_per_s) {
  if (bytes_per_s <= 0) return deadline;
  return deadline - static_cast<double>(remaining_bytes) / bytes_per_s;
}

std::vector<size_t> grant(const std::vector<ChunkClaim>& waiting,
                          const std::vector<LinkDirection>& busy) {
  std::vector<size_t> order(waiting.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const ChunkClaim& x = waiting[a];
    const ChunkClaim& y = waiting[b];
    if (x.slack_s != y.slack_s) return x.slack_s < y.slack_s;
    return x.seq < y.seq;
  });
  std::set<LinkDirection> taken(busy.begin(), busy.end());
  std::vector<size_t> granted;
  for (size_t i : order) {
    const ChunkClaim& c = waiting[i];
    if (!c.link_directions.empty() && c.link_directions.size() != c.links.size())
      throw std::invalid_argument("a chunk claim gives link_directions, not one per link");
    std::vector<LinkDirection> wants;
    for (size_t k = 0; k < c.links.size(); ++k)
      wants.push_back({c.links[k], c.link_directions.empty() ? c.direction : c.link_directions[k]});
    const bool free = std::none_of(wants.begin(), wants.end(),
                                   [&](const LinkDirection& ld) { return taken.count(ld) > 0; });
    if (free) granted.push_back(i);
    if (free || c.reserve) taken.insert(wants.begin(), wants.end());
  }
  return granted;
}

}  // namespace ferry
