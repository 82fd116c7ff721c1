// Gradient accumulation (optim.accumulate): the micro-batches of one update and the sum of their
// gradients on the device. Invariant: when the last micro-batch's backward marks a parameter
// ready for its bucket's all-reduce, its gradient block slice already holds the update's sum.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "device/device.h"
#include "trainer/exec/executor.h"
#include "trainer/exec/parameter_store.h"

namespace ferry {

// Note [Accumulating micro-batches]
// An update of optim.accumulate = N runs N micro-batches of data.batch_size rows per rank, then
// one reduction and one optimizer step. Backward kernels overwrite the gradient block, so the
// sum lives in a second block of the same layout (ParameterStore::accumulation_block, planned
// as persistent gradient memory: it is held across the whole update). As each micro-batch's
// backward writes a parameter's gradient (the executor's GradientListener, at its last writer),
// that parameter's slice is folded on the compute stream:
//
//   micro-batches 1..N-1:  acc = grad (first write of the update), else acc += grad
//   micro-batch N:         grad += acc, then the parameter is marked ready for its bucket
//
// so the buckets' all-reduce runs once per update, on the last micro-batch, overlapped with its
// backward exactly as without accumulation, and the optimizer reads the reduced sum in the
// gradient block. A parameter the last micro-batch does not write gets acc copied in before the
// reduction (fold_rest). The loss is averaged as one batch of N x batch_size rows: each
// micro-batch's loss divides by N times its own divisor (the rows, or data.documents' real
// tokens), so the summed gradient is the large batch's mean gradient up to float reassociation,
// and the logged loss of an update is the sum of its micro-batches' losses.

// Micro-batch `index` of `count` in one update.
struct MicroBatch {
  int64_t index = 0;
  int64_t count = 1;
  bool last() const { return index + 1 == count; }
  // The step number that seeds the micro-batch's random draws (dropout): `step` itself without
  // accumulation, else the count of micro-batches up to this one, distinct for each.
  uint64_t seed_step(int64_t step) const {
    return count == 1 ? static_cast<uint64_t>(step)
                      : static_cast<uint64_t>((step - 1) * count + index + 1);
  }
};

class GradientAccumulation {
 public:
  // `store` must have an accumulation block; `reduce` is told, on the last micro-batch, which
  // parameters hold their summed gradient (the gradient buckets' listener). Both outlive this.
  GradientAccumulation(Device& device, const ParameterStore& store, GradientListener& reduce);

  // The listener for micro-batch `micro`'s backward (Note [Accumulating micro-batches]).
  GradientListener* begin(const MicroBatch& micro);
  // After the last micro-batch's backward, before the reduction finishes: the parameters it did
  // not write get the update's sum from the accumulation block.
  void fold_rest();

  // Folding launches enqueued so far (merged runs of adjacent parameters), for tests.
  uint64_t launches() const { return launches_; }

 private:
  class Folder;
  // What one parameter's fold does.
  enum class Fold : uint8_t { kNone, kCopyToAcc, kAddToAcc, kAddToGrad, kCopyToGrad };
  void fold(std::span<const size_t> params);
  // Launches one fold over bytes [begin, end) of both blocks.
  void launch(Fold fold, uint64_t begin, uint64_t end);

  Device& device_;
  const ParameterStore& store_;
  GradientListener& reduce_;
  std::unique_ptr<GradientListener> folder_;
  MicroBatch micro_;
  std::vector<uint8_t> held_;     // the accumulation block holds this update's sum of it
  std::vector<uint8_t> written_;  // written by the current micro-batch
  uint64_t launches_ = 0;
};

}  // namespace ferry
