// The `topology` link scheduler: gives each transfer's copy a scheduled deadline, which travels
// with the copy to the rank's link arbiter (the link emulator of a CPU rank, the link gatekeeper
// of a GPU rank), whose copies then cross the node's links in chunks, one chunk per link per
// direction at a time across all local ranks, least deadline slack first (arbiter_policy.h).
// Invariant: every offload and prefetch it sees is scheduled, with the deadline the plan gave
// it. Note [Life of an offloaded activation] (trainer/exec/executor.h), step 5.
#pragma once

#include "prefetch/link_scheduler.h"

namespace ferry {

class TopologyLinkScheduler : public LinkScheduler {
 public:
  std::string_view name() const override { return "topology"; }
  void before_copy(const TransferRequest&, Stream&) override {}
  void after_copy(const TransferRequest&, Stream&) override {}
  CopyDeadline deadline(const TransferRequest& request) const override {
    return CopyDeadline{true, request.deadline_s};
  }
};

}  // namespace ferry
