// What the topology scheduler tells a rank's link arbiter (the CPU link emulator or the GPU link
// gatekeeper): the transfer whose copy is enqueued next in a direction, so that copy carries its
// deadline. Invariant: an announcement is consumed by the next copy of its direction and size,
// or withdrawn once that copy is enqueued.
#pragma once

#include "prefetch/link_scheduler.h"

namespace ferry {

class TransferAnnouncer {
 public:
  virtual ~TransferAnnouncer() = default;
  // Before the transfer's copy is enqueued, on the enqueuing thread.
  virtual void announce(const TransferRequest& request) = 0;
  // After it is enqueued: drops the announcement if no copy consumed it.
  virtual void withdraw(TransferDirection direction) = 0;
};

}  // namespace ferry
