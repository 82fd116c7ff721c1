// The transfer engine: issues a rank's offloads and prefetches through the residency state
// machine, asking a LinkScheduler around each copy (Note [The transfer engine's copies]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/residency.h"
#include "prefetch/link_scheduler.h"

namespace ferry {

// Note [The transfer engine's copies]
// The transfer engine: issues a rank's offloads (device -> pinned host, on the device-to-host
// stream) and prefetches (host -> device, on the host-to-device stream) through the residency
// state machine, asking a LinkScheduler around each copy and for the deadline the copy carries
// to the device, and keeps per-step totals and, when tracing, each copy's start and end events
// (Note [Life of an offloaded activation] in trainer/exec/executor.h, steps 4 and 7). The host
// optimizer's copies (TransferPurpose::kOptimizer) take the same way without a residency state
// machine: copy() (Note [Host copies on the links] in trainer/optim/model_state_step.h).

struct TransferStats {
  uint64_t to_host_bytes = 0;  // activations
  uint64_t to_device_bytes = 0;
  uint64_t transfers = 0;
  uint64_t optimizer_to_host_bytes = 0;    // the host optimizer's gradients
  uint64_t optimizer_to_device_bytes = 0;  // and updated weights
  uint64_t optimizer_copies = 0;
};

// A traced copy: its request and the timing events around it on its stream.
struct TracedTransfer {
  TransferRequest request;
  std::unique_ptr<Event> start;
  std::unique_ptr<Event> end;
};

class TransferEngine {
 public:
  TransferEngine(Device& device, std::unique_ptr<LinkScheduler> scheduler);

  // Copies `tensor` (at `device_ptr`) to `host` once `ready` has fired; the copy's event
  // then lets compute reuse the space (ResidentTensor::order_after_offload).
  // `deadline_s`: planned seconds from now to deadline_step (TransferRequest::deadline_s).
  void offload(ResidentTensor& tensor, const void* device_ptr, void* host, Event& ready,
               int deadline_step, double deadline_s = 0);
  // Copies `tensor` back to `device_ptr` once `ready` has fired (the space is free).
  void prefetch(ResidentTensor& tensor, void* device_ptr, Event& ready, int deadline_step,
                double deadline_s = 0);

  // A copy of model state (request.purpose kOptimizer): request.bytes from `src` to `dst` on the
  // copy stream of request.direction once `ready` has fired, with the scheduler's hooks and
  // deadline, the totals and the trace marks of any other copy; `done` is recorded after it.
  void copy(const TransferRequest& request, void* dst, const void* src, Event& ready, Event& done);

  const TransferStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  // While on, every copy is bracketed by timing events, kept until take_traced().
  void set_tracing(bool on) { tracing_ = on; }
  std::vector<TracedTransfer> take_traced() { return std::move(traced_); }
  const LinkScheduler& scheduler() const { return *scheduler_; }

 private:
  // Around each copy: the scheduler's hooks, the totals, the trace marks.
  Event* begin(const TransferRequest& request, Stream& stream, Event& ready);
  void end(const TransferRequest& request, Stream& stream, Event* traced_end);

  Device& device_;
  std::unique_ptr<LinkScheduler> scheduler_;
  TransferStats stats_;
  bool tracing_ = false;
  std::vector<TracedTransfer> traced_;
};

}  // namespace ferry
