// When each offload or prefetch may start (Note [Asking the link scheduler]). `fifo` issues every
// copy at once in request order: the copy streams alone serialise them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "device/copy_deadline.h"
#include "device/stream.h"
#include "prefetch/transfer_direction.h"

namespace ferry {

// Note [Asking the link scheduler]
// When each offload or prefetch may start. The transfer engine asks its LinkScheduler around
// every copy it issues; the scheduler may order the copy stream after other work (a link
// token, another rank's transfer) before the copy and release what it took after it, and gives
// the deadline that travels with the copy to the device's copy arbiter (device/copy_deadline.h).
// `fifo` issues every copy at once in request order: the copy streams alone serialise them.

// What a copy carries: an activation (an offload or prefetch of the plan) or the host
// optimizer's model state (gradients down, updated weights up: Note [Host copies on the links]
// in trainer/optim/model_state_step.h). Both cross the same links under the same scheduler.
enum class TransferPurpose { kActivation, kOptimizer };

struct TransferRequest {
  TransferDirection direction = TransferDirection::kToHost;
  std::string tensor;
  uint64_t bytes = 0;
  int deadline_step = -1;  // the step that waits for it (release or first use)
  // Planned seconds from the copy's issue to the start of deadline_step (0: none known). The
  // topology scheduler orders chunks of the node's ranks by this deadline.
  double deadline_s = 0;
  TransferPurpose purpose = TransferPurpose::kActivation;
};

class LinkScheduler {
 public:
  virtual ~LinkScheduler() = default;
  virtual std::string_view name() const = 0;
  // Called before the copy is enqueued on `copy_stream`; may enqueue waits on it.
  virtual void before_copy(const TransferRequest& request, Stream& copy_stream) = 0;
  // Called after the copy is enqueued on `copy_stream`.
  virtual void after_copy(const TransferRequest& request, Stream& copy_stream) = 0;
  // The deadline the request's copy carries to the device (Device::copy_async). Unscheduled by
  // default: the copy is never arbitrated.
  virtual CopyDeadline deadline(const TransferRequest& /*request*/) const { return {}; }
};

// Oblivious: no ordering beyond the copy streams' own.
class FifoLinkScheduler : public LinkScheduler {
 public:
  std::string_view name() const override { return "fifo"; }
  void before_copy(const TransferRequest&, Stream&) override {}
  void after_copy(const TransferRequest&, Stream&) override {}
};

// The `topology` scheduler's side in the transfer engine: every copy carries its scheduled
// deadline (the plan's seconds) to the rank's link arbiter (the link emulator of a CPU rank, the
// link gatekeeper of a GPU rank), whose copies then cross the node's links in chunks, least
// deadline slack first (links/arbiter_policy.h). Invariant: every offload and prefetch is
// scheduled, with the deadline the plan gave it. Note [Life of an offloaded activation]
// (trainer/exec/executor.h), step 5.
class DeadlineLinkScheduler : public LinkScheduler {
 public:
  std::string_view name() const override { return "topology"; }
  void before_copy(const TransferRequest&, Stream&) override {}
  void after_copy(const TransferRequest&, Stream&) override {}
  CopyDeadline deadline(const TransferRequest& request) const override {
    return CopyDeadline{true, request.deadline_s};
  }
};

}  // namespace ferry
