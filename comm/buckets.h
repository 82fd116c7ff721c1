// Gradient buckets (PyTorch DDP's reducer): each bucket is all-reduced once its gradients are
// written, while backward goes on. Invariant: buckets launch in index order on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "comm/bucket_plan.h"
#include "comm/communicator.h"
#include "device/device.h"

namespace ferry {

// Note [Buckets while backward runs]
// Gradient buckets (PyTorch DDP's reducer): as backward is enqueued, each bucket whose
// gradients have all been written is all-reduced (mean over ranks) on the comm stream while
// backward goes on; finish() launches the rest and orders the compute stream after them, so the
// optimizer sees averaged gradients. Invariant: buckets launch in index order on every rank, so
// the ranks' collectives always match.

struct BucketOptions {
  uint64_t bucket_bytes = uint64_t{25} << 20;  // comm.bucket_mb (default 25 MiB)
  bool overlap = true;  // comm.overlap: false reduces every bucket in finish(), after backward
  // The order backward produces the gradients (a permutation of the parameters); empty: the
  // reverse of the table's order. Must be the same on every rank.
  std::vector<size_t> order;
  // How many times backward writes each parameter's gradient per step (a shared weight is
  // written once per use); empty: once each. A bucket is ready after the last write.
  std::vector<int> writes_per_param;
  // The collective of one range of the block (floats from the block's start, and count); empty:
  // all_reduce_mean. memory.zero 1 and 2 reduce-scatter instead (trainer/optim/model_state_step.h).
  std::function<CommWork(float* block, int64_t offset, int64_t count, Stream& after)> reduce;
  // comm.dtype: the format buckets cross the wire in. kBF16: all_reduce_mean_bf16, the bf16 sum
  // widened into the fp32 gradients (Note [A bf16 all-reduce] in comm/bf16_wire.h); not with
  // `reduce` (the constructor throws UnsupportedError).
  DType wire_dtype = DType::kF32;
};

// The host-clock span of one bucket's all-reduce in the last step, for traces.
struct BucketSpan {
  size_t bucket = 0;
  uint64_t bytes = 0;     // on the wire: the bucket's fp32 bytes, halved under comm.dtype bf16
  int64_t launch_ns = 0;  // when the host enqueued it (steady_clock ns, see CommSpan)
  int64_t start_ns = 0;   // when the collective started on the comm stream
  int64_t end_ns = 0;     // when it ended
};

class GradientBuckets {
 public:
  // `grad_block` is the device address of the gradient block and `params` the slice of each
  // parameter's gradient in it (pass sizes rounded up to the block's alignment when the padding
  // is zero: touching slices then merge into one collective per bucket). The communicator and
  // the device must outlive this object.
  GradientBuckets(Communicator& comm, Device& device, float* grad_block,
                  std::vector<GradSlice> params, BucketOptions options = {});

  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t bucket_of(size_t param) const { return bucket_of_[param]; }
  const BucketOptions& options() const { return options_; }

  // Starts a step and clears the marks. Never blocks: the previous step's collectives already
  // order compute (finish()); those still in flight are kept and checked at later resets, and
  // a failure of one that has completed is rethrown here. Call before each step's backward.
  void reset();

  // Parameter `param`'s gradient write has been enqueued on the device's compute stream. With
  // overlap on, launches every bucket that became ready, in index order.
  void mark_ready(size_t param);
  void mark_ready(std::span<const size_t> params);

  // Launches the buckets not launched yet (all of them with overlap off), ordered after the
  // work enqueued on `compute`, and makes `compute` wait for every bucket's all-reduce. Does
  // not block the host. Call once per step, after backward is enqueued and before the
  // optimizer step.
  void finish(Stream& compute);

  // Buckets launched in this step so far.
  size_t launched() const { return next_; }

  // Counts since construction, for checks that a step reduces once: finish() calls, collectives
  // launched (one per bucket range), and buckets launched while backward ran (before finish()).
  uint64_t reductions() const { return reductions_; }
  uint64_t collectives() const { return collectives_; }
  uint64_t overlapped_buckets() const { return overlapped_; }

  // The spans of this step's all-reduces (after finish; blocks until they completed). Empty
  // when the communicator does not measure (one rank: nothing is reduced).
  std::vector<BucketSpan> spans() const;

 private:
  void launch(size_t bucket, Stream& after);
  uint64_t wire_bytes(uint64_t fp32_bytes) const;  // a range's bytes in options_.wire_dtype
  void launch_ready();

  Communicator& comm_;
  Device& device_;
  float* block_;
  std::vector<GradSlice> params_;
  BucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int> expected_;  // writes per parameter per step

  // Per step.
  std::vector<int> marks_;                    // writes seen per parameter
  std::vector<size_t> pending_;               // parameters of each bucket not fully written yet
  std::vector<std::vector<CommWork>> works_;  // per bucket, one per range
  std::vector<CommWork> in_flight_;           // earlier steps' collectives not seen complete
  std::vector<int64_t> launch_ns_;
  size_t next_ = 0;  // buckets [0, next_) are launched
  bool finished_ = false;
  uint64_t reductions_ = 0, collectives_ = 0, overlapped_ = 0;
};

}  // namespace ferry
