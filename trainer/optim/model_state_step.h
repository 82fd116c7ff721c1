// The reduce-and-update of memory.zero 1 and 2 and memory.optimizer host: a gradient reducer
// (buckets reduce-scattered, or all-reduced without sharding) and the optimizer of this rank's
// shard (on the device or the host), then the updated parameters all-gathered. Invariant: every
// rank issues the same collectives in the same order, and every rank ends the step with the
// same parameter bits.
#pragma once

#include <memory>
#include <vector>

#include "comm/buckets.h"
#include "comm/communicator.h"
#include "device/device.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/optim/optimizer.h"

namespace ferry {

// Note [Reduce and update by shard]
// memory.zero 1 and 2 (ranks > 1): the gradient block, padded to ranks equal shards of S floats
// (StoreLayout), is reduce-scattered bucket by bucket: each bucket's range is cut where the
// shards meet and every rank keeps the mean of its own part, in place (the rest of the block is
// then stale). zero 2 launches each bucket as backward completes it (comm.overlap), zero 1 all
// of them after backward. The optimizer updates [rank * S, rank * S + S) only; with clipping the
// norm is the all-reduced sum of every shard's sum of squares. Then the parameters are
// all-gathered in pieces of comm.bucket_mb per shard, and compute waits for them before the next
// forward. memory.optimizer host: after the reduction the rank's gradient floats are copied to
// host memory, the host updates its fp32 copy of the rank's weights and the state there (one
// host wait per step, for the copy), and the weights are copied back before the all-gather.
// Gradient bits equal all_reduce_mean's on two ranks (a + b either way); with more ranks MPI may
// sum in another order (Note [Model state per rank] says what the tests hold).

struct ModelStateStepOptions {
  bool shard = false;              // zero 1 or 2 on several ranks
  bool reduce_in_backward = true;  // zero 2 (and comm.overlap): buckets reduced as backward goes
  bool host = false;               // memory.optimizer host
  uint64_t bucket_bytes = uint64_t{25} << 20;  // all-gather pieces per shard
};

class ModelStateStep {
 public:
  // `slices` and `buckets` as GradientBuckets takes them (their reduce is set here).
  ModelStateStep(Communicator& comm, Device& device, ParameterStore& store, Optimizer& optimizer,
                 std::vector<GradSlice> slices, BucketOptions buckets,
                 const ModelStateStepOptions& options);

  GradientBuckets& buckets() { return *buckets_; }
  // The reductions not launched during backward, and compute ordered after all of them.
  void reduce(Stream& compute);
  // Clipping, the shard's update (device or host), the all-gather; compute waits for it.
  void update(float lr);
  // The host copy of the weights no longer matches the device's (a checkpoint was loaded).
  void weights_changed() { host_weights_current_ = false; }
  // Collectives of the last step: reductions (one per bucket range) and all-gathers.
  int64_t reductions() const { return reductions_; }
  int64_t gathers() const { return gathers_; }

 private:
  CommWork reduce_range(float* block, int64_t offset, int64_t count, Stream& after);
  void clip(Stream& compute);

  Communicator& comm_;
  Device& device_;
  ParameterStore& store_;
  Optimizer& optimizer_;
  ModelStateStepOptions options_;
  std::unique_ptr<GradientBuckets> buckets_;
  int64_t shard_ = 0;  // S (floats); the whole block unsharded
  bool host_weights_current_ = false;
  int64_t reductions_ = 0, gathers_ = 0;
};

}  // namespace ferry
