// Issuing copies through the scheduler and the residency state machine.
#include "prefetch/transfer_engine.h"

#include "common/error.h"

namespace ferry {

namespace {

// The scheduler's deadline for `request`, labelled with what the copy carries (the link ledger
// shows it beside the copy's claims and flows).
CopyDeadline labelled(CopyDeadline deadline, const TransferRequest& request) {
  deadline.kind =
      request.purpose == TransferPurpose::kOptimizer ? CopyKind::kOptimizer : CopyKind::kActivation;
  return deadline;
}

}  // namespace

TransferEngine::TransferEngine(Device& device, std::unique_ptr<LinkScheduler> scheduler)
    : device_(device), scheduler_(std::move(scheduler)) {}

Event* TransferEngine::begin(const TransferRequest& request, Stream& stream, Event& ready) {
  scheduler_->before_copy(request, stream);
  const bool to_host = request.direction == TransferDirection::kToHost;
  if (request.purpose == TransferPurpose::kOptimizer) {
    ++stats_.optimizer_copies;
    (to_host ? stats_.optimizer_to_host_bytes : stats_.optimizer_to_device_bytes) += request.bytes;
  } else {
    ++stats_.transfers;
    (to_host ? stats_.to_host_bytes : stats_.to_device_bytes) += request.bytes;
  }
  if (!tracing_) return nullptr;
  TracedTransfer traced{request, device_.create_timing_event(), device_.create_timing_event()};
  stream.wait(ready);  // so the start mark is the copy's start, not its wait's
  stream.record(*traced.start);
  traced_.push_back(std::move(traced));
  return traced_.back().end.get();
}

void TransferEngine::end(const TransferRequest& request, Stream& stream, Event* traced_end) {
  if (traced_end) stream.record(*traced_end);
  scheduler_->after_copy(request, stream);
}

void TransferEngine::offload(ResidentTensor& tensor, const void* device_ptr, void* host,
                             Event& ready, int deadline_step, double deadline_s) {
  Stream& d2h = device_.stream(StreamKind::kDeviceToHost);
  const TransferRequest request{TransferDirection::kToHost, tensor.name(), tensor.bytes(),
                                deadline_step, deadline_s};
  Event* traced_end = begin(request, d2h, ready);
  tensor.offload(device_ptr, host, d2h, ready, labelled(scheduler_->deadline(request), request));
  end(request, d2h, traced_end);
}

void TransferEngine::prefetch(ResidentTensor& tensor, void* device_ptr, Event& ready,
                              int deadline_step, double deadline_s) {
  Stream& h2d = device_.stream(StreamKind::kHostToDevice);
  const TransferRequest request{TransferDirection::kToDevice, tensor.name(), tensor.bytes(),
                                deadline_step, deadline_s};
  // A fetch of an in-flight offload waits for it; so does the trace's start mark.
  if (tracing_) tensor.order_after_offload(h2d);
  Event* traced_end = begin(request, h2d, ready);
  tensor.prefetch(device_ptr, h2d, ready, labelled(scheduler_->deadline(request), request));
  end(request, h2d, traced_end);
}

void TransferEngine::copy(const TransferRequest& request, void* dst, const void* src, Event& ready,
                          Event& done) {
  FERRY_ASSERT(request.purpose == TransferPurpose::kOptimizer,
               "TransferEngine::copy carries model state; activations go through offload/prefetch");
  Stream& stream =
      device_.stream(request.direction == TransferDirection::kToHost ? StreamKind::kDeviceToHost
                                                                     : StreamKind::kHostToDevice);
  stream.wait(ready);
  Event* traced_end = begin(request, stream, ready);
  device_.copy_async(dst, src, request.bytes, stream,
                     labelled(scheduler_->deadline(request), request));
  stream.record(done);
  end(request, stream, traced_end);
}

}  // namespace ferry
