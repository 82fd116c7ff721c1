// Note [Parameters gathered for the next forward] in gather_order.h.
#include "trainer/optim/gather_order.h"

#include <algorithm>
#include <limits>

namespace ferry {

std::vector<std::vector<size_t>> pieces_read(
    const GatherPieces& g, const std::vector<std::vector<std::pair<int64_t, int64_t>>>& reads) {
  std::vector<std::vector<size_t>> out(reads.size());
  for (size_t s = 0; s < reads.size(); ++s) {
    for (const auto& [begin, end] : reads[s]) {
      for (int64_t f = begin; f < end;) {
        const int64_t rank = f / g.shard, in_shard = f - rank * g.shard;
        if (rank >= g.ranks) break;
        const int64_t k = in_shard / g.piece;
        out[s].push_back(static_cast<size_t>(k));
        // The next float in another piece: this piece's end in this shard.
        f = rank * g.shard + std::min(g.shard, (k + 1) * g.piece);
      }
    }
    std::sort(out[s].begin(), out[s].end());
    out[s].erase(std::unique(out[s].begin(), out[s].end()), out[s].end());
  }
  return out;
}

std::vector<std::vector<size_t>> pieces_read(
    const std::vector<int64_t>& bounds,
    const std::vector<std::vector<std::pair<int64_t, int64_t>>>& reads) {
  std::vector<std::vector<size_t>> out(reads.size());
  if (bounds.size() < 2) return out;
  for (size_t s = 0; s < reads.size(); ++s) {
    for (const auto& [begin, end] : reads[s]) {
      const int64_t b = std::max(begin, bounds.front()), e = std::min(end, bounds.back());
      if (b >= e) continue;
      // The piece holding b, then every piece up to the one holding e - 1.
      auto k = static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), b) -
                                   bounds.begin() - 1);
      for (; k + 1 < bounds.size() && bounds[k] < e; ++k) out[s].push_back(k);
    }
    std::sort(out[s].begin(), out[s].end());
    out[s].erase(std::unique(out[s].begin(), out[s].end()), out[s].end());
  }
  return out;
}

std::vector<size_t> gather_order(size_t pieces, const std::vector<std::vector<size_t>>& read) {
  std::vector<size_t> first(pieces, std::numeric_limits<size_t>::max());
  for (size_t s = 0; s < read.size(); ++s) {
    for (size_t k : read[s]) first[k] = std::min(first[k], s);
  }
  std::vector<size_t> order(pieces);
  for (size_t k = 0; k < pieces; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return first[a] < first[b]; });
  return order;
}

}  // namespace ferry
