// The `topology` link scheduler: hands each transfer's deadline to the rank's link arbiter (the
// link emulator of a CPU rank, the link gatekeeper of a GPU rank), whose copies then cross the
// node's links in chunks, one chunk per link per direction at a time across all local ranks,
// least deadline slack first (arbiter_policy.h). Invariant: every announcement is consumed by
// the copy that follows it or withdrawn after it. Note [Life of an offloaded activation]
// (trainer/exec/executor.h), step 5.
#pragma once

#include <memory>

#include "links/link_announcer.h"
#include "prefetch/link_scheduler.h"

namespace ferry {

class TopologyLinkScheduler : public LinkScheduler {
 public:
  explicit TopologyLinkScheduler(std::shared_ptr<TransferAnnouncer> arbiter)
      : arbiter_(std::move(arbiter)) {}
  std::string_view name() const override { return "topology"; }
  void before_copy(const TransferRequest& request, Stream&) override {
    arbiter_->announce(request);
  }
  void after_copy(const TransferRequest& request, Stream&) override {
    arbiter_->withdraw(request.direction);
  }

 private:
  std::shared_ptr<TransferAnnouncer> arbiter_;
};

}  // namespace ferry
