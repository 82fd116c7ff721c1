// The metrics ring: each step's loss and correct count, copied on the compute stream into
// pinned host memory. Invariant: staging never blocks the host (Note [Metrics without a host
// wait]).

// Note [Metrics without a host wait]
// Staging never pins memory while the ring holds no more than the steps it was built for.
// The loss kernel writes each step's loss and correct count into the persistent metrics slot,
// which the next step overwrites. stage() copies them, on the compute stream, into the next
// entry of a pinned ring (chunks that are never moved or freed while the ring lives), so the
// host may run steps ahead; drain() synchronizes the compute stream once and reads every staged
// entry. The trainer drains on logging steps only, and the ring is allocated up front for that
// many steps (ExecutorOptions::metrics_steps): pinning memory mid-run (cudaHostAlloc) may
// synchronise the device, the stall this note exists to avoid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "device/device.h"

namespace ferry {

struct StepMetrics {
  float loss = 0;
  int32_t correct = 0;
};

// One step's metrics as staged by Executor::stage_metrics: the step it was tagged with.
struct StagedMetrics {
  uint64_t step = 0;
  float loss = 0;
  int32_t correct = 0;
  // The gradients' L2 norm before clipping, when the step staged it (optim.clip_norm > 0).
  std::optional<float> grad_norm;
};

class MetricsRing {
 public:
  static constexpr size_t kChunk = 256;  // entries per pinned chunk

  // Pins chunks for at least `steps` entries (at least one chunk).
  MetricsRing(Device& device, size_t steps);
  // Unpins the chunks: call only when no staged copy is in flight.
  ~MetricsRing();
  MetricsRing(const MetricsRing&) = delete;
  MetricsRing& operator=(const MetricsRing&) = delete;

  // Enqueues, on the compute stream, copies of the device's `loss` and `correct` (and, when not
  // null, the gradients' sum of squares `grad_sq`) into the next entry, tagged `step`. Never
  // blocks; grows by a chunk (never by a wait) only when more steps are staged between drains
  // than the ring holds.
  void stage(uint64_t step, const float* loss, const int32_t* correct,
             const float* grad_sq = nullptr);
  // Waits for the compute stream once and returns every step staged since the last drain, in
  // order.
  std::vector<StagedMetrics> drain();

  size_t staged() const { return staged_steps_.size(); }
  size_t capacity() const { return chunks_.size() * kChunk; }

 private:
  Device& device_;
  struct Entry {
    StepMetrics metrics;
    float grad_sq = 0;
  };
  // Pinned chunks of kChunk entries each, filled in staging order; never moved, so a copy in
  // flight keeps its target.
  std::vector<Entry*> chunks_;
  std::vector<uint64_t> staged_steps_;
  std::vector<bool> staged_grad_sq_;
};

}  // namespace ferry
