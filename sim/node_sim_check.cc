// The node simulator's input checks: every link, transfer and bucket an input names exists.
// Invariant: simulate_node reads no index these checks did not pass.
#include <stdexcept>

#include <fmt/format.h>

#include "sim/node_sim.h"

namespace ferry {

void check_indices(const NodeSimInput& in) {
  const size_t n_links = in.links.size();
  const size_t n_buckets = in.buckets.size();
  const auto bad_link = [&](int l) { return l < 0 || static_cast<size_t>(l) >= n_links; };
  for (const SimRank& r : in.ranks) {
    for (int l : r.path)
      if (bad_link(l))
        throw std::invalid_argument(
            fmt::format("{}: path names link {} of {}", r.name, l, n_links));
    const size_t nt = r.transfers.size();
    const auto& tab = r.transfer_after_bucket;
    const auto& bat = r.bucket_after_transfer;
    if ((!tab.empty() && tab.size() != nt) || (!bat.empty() && bat.size() != n_buckets))
      throw std::invalid_argument(fmt::format(
          "{}: {} transfer_after_bucket for {} transfers, {} bucket_after_transfer for {} buckets",
          r.name, tab.size(), nt, bat.size(), n_buckets));
    for (int b : tab)
      if (b >= static_cast<int>(n_buckets))
        throw std::invalid_argument(
            fmt::format("{}: a transfer waits for bucket {} of {}", r.name, b, n_buckets));
    for (int t : bat)
      if (t >= static_cast<int>(nt))
        throw std::invalid_argument(
            fmt::format("{}: a bucket waits for transfer {} of {}", r.name, t, nt));
  }
  for (const SimHop& h : in.ring) {
    for (const auto* part : {&h.up, &h.down, &h.then_up, &h.then_down})
      for (int l : *part)
        if (bad_link(l))
          throw std::invalid_argument(fmt::format("ring hop names link {} of {}", l, n_links));
  }
}

}  // namespace ferry
