// What the topology scheduler tells a rank's link arbiter (the CPU link emulator or the GPU link
// gatekeeper): the transfer whose copy is enqueued next in a direction, so that copy carries its
// deadline. Invariant: an announcement is consumed by the next copy of its direction and size,
// or withdrawn once that copy is enqueued.
#pragma once

#include <cstdint>
#include <vector>

#include "prefetch/link_scheduler.h"

namespace ferry {

// A rank's copy path through the node's link ledger, as its link arbiter sees it.
struct LinkPathOptions {
  int rank = 0;           // for the ledger's records and error messages
  std::vector<int> path;  // the ledger's link ids this rank's copies cross (GPU side first)
  // The links of `path` whose tokens a chunk takes: those one chunk can fill (capacity at most
  // the path's bottleneck). A wider link (a root complex summing its ports) is shared by the
  // fluid model alone, so arbitration never leaves it idle. Empty: the whole path.
  std::vector<int> arbitrated;
  uint64_t chunk_bytes = 4ull << 20;  // topology.chunk_mb
};

class TransferAnnouncer {
 public:
  virtual ~TransferAnnouncer() = default;
  // Before the transfer's copy is enqueued, on the enqueuing thread.
  virtual void announce(const TransferRequest& request) = 0;
  // After it is enqueued: drops the announcement if no copy consumed it.
  virtual void withdraw(TransferDirection direction) = 0;
};

}  // namespace ferry
