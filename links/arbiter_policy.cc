// Greedy least-slack-first grant over link-direction tokens.
#include "links/arbiter_policy.h"

#include <algorithm>
#include <numeric>
#include <set>

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
    bool free = std::none_of(c.links.begin(), c.links.end(), [&](int link) {
      return taken.count(LinkDirection{link, c.direction}) > 0;
    });
    if (!free) continue;
    for (int link : c.links) taken.insert(LinkDirection{link, c.direction});
    granted.push_back(i);
  }
  return granted;
}

}  // namespace ferry
