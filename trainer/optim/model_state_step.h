// The reduce-and-update of memory.zero 1 and 2 and memory.optimizer host: a gradient reducer
// (buckets reduce-scattered, or all-reduced without sharding) and the optimizer of this rank's
// shard (on the device or the host), then the updated parameters all-gathered. Invariant: every
// rank issues the same collectives in the same order, and every rank ends the step with the
// same parameter bits.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/buckets.h"
#include "comm/communicator.h"
#include "device/device.h"
#include "device/pinned_floats.h"
#include "prefetch/transfer_engine.h"
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
// forward. memory.optimizer host: the rank's gradient floats go to host memory bucket by bucket,
// the host updates its fp32 copy of the rank's weights and the state there (one host wait per
// step, for the copies), and the weights go back before the all-gather (Note [Host copies on the
// links]). Gradient bits equal all_reduce_mean's on two ranks (a + b either way); with more ranks
// MPI may sum in another order (Note [Model state per rank] says what the tests hold).

// Note [Host copies on the links]
// memory.optimizer host's copies take the activations' way (Note [Life of an offloaded
// activation] in trainer/exec/executor.h, steps 4-6): the executor's TransferEngine issues them on
// the device-to-host and host-to-device streams, asking the same topology.scheduler, so under
// `topology` they carry a scheduled deadline and cross the node's links in arbitrated chunks
// beside every rank's offloads (claims in the link ledger: `trainer jobs`), and under tracing they
// land on the "optimizer d2h" and "optimizer h2d" tracks. Into pinned host blocks bound to the
// rank's NUMA node (ParameterStore::host_params).
//  - Gradients: each bucket's range of the rank's floats is copied down as soon as its reduction
//    (all-reduce, or reduce-scatter under sharding) ends: the copy stream waits for the bucket's
//    gradients on compute and for its collective. Deadline: the step's end, where the host update
//    waits for them (the planned seconds from the bucket's last gradient to the tape's end).
//    Floats no bucket covers (padding) follow after reduce().
//  - Clipping: the device sums the squares (all-reduced by shard) and the 4-byte sum goes down the
//    same way; the host scales its gradients with ClipByNorm's element math (bitwise the device's).
//  - Weights: after the host update the rank's floats go up in pieces of comm.bucket_mb cut at
//    parameter boundaries, least deadline first; a piece's deadline is the planned start of the
//    forward step of the first layer that reads it. Compute waits for every piece before the next
//    forward (or the all-gather); a wait per layer is left to the planner.

struct ModelStateStepOptions {
  bool shard = false;              // zero 1 or 2 on several ranks
  bool reduce_in_backward = true;  // zero 2 (and comm.overlap): buckets reduced as backward goes
  bool host = false;               // memory.optimizer host
  uint64_t bucket_bytes = uint64_t{25} << 20;  // all-gather pieces per shard
  // memory.optimizer host: the engine the copies go through (the executor's), and per parameter
  // (ParameterStore::params() order) the planned seconds from its gradient's last write to the
  // step's end and from the step's end to the forward that first reads it (0: none known).
  TransferEngine* transfers = nullptr;
  std::vector<double> gradient_deadline_s, weight_deadline_s;
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
  // `on_device` false: the sum of squares only (the host scales: Note [Host copies on the links]).
  void clip(Stream& compute, bool on_device = true);

  // memory.optimizer host (model_state_host.cc, Note [Host copies on the links]).
  // The floats [offset, offset + count) of the block, once `after`'s work so far and `reduced`
  // are done, copied down where they fall in this rank's range.
  void send_gradients(int64_t offset, int64_t count, const CommWork& reduced, Stream& after);
  // After reduce(): the rank's floats no bucket sent.
  void send_rest(Stream& compute);
  void host_update(Stream& compute, float lr);
  Event& next_event();
  // The parameter whose slice holds float `at` of the block; its name for copies' labels.
  size_t param_at(int64_t at) const;
  std::string copy_name(const char* what, int64_t begin, int64_t end) const;

  Communicator& comm_;
  Device& device_;
  ParameterStore& store_;
  Optimizer& optimizer_;
  ModelStateStepOptions options_;
  std::unique_ptr<GradientBuckets> buckets_;
  int64_t shard_ = 0;  // S (floats); the whole block unsharded
  bool host_weights_current_ = false;
  int64_t reductions_ = 0, gathers_ = 0;
  // memory.optimizer host, per step: the copies' events (reused), the ranges sent down, the last
  // copy down's event, and the pinned landing place of the clipping sum.
  std::vector<std::unique_ptr<Event>> events_;
  size_t next_event_ = 0;
  std::vector<std::pair<int64_t, int64_t>> sent_;
  Event* down_ = nullptr;
  PinnedFloats host_sum_sq_;
};

}  // namespace ferry
