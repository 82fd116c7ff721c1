// The reduce-and-update of memory.zero 1 and 2 and memory.optimizer host: a gradient reducer
// (buckets reduce-scattered, or all-reduced without sharding) and the optimizer of this rank's
// shard (on the device or the host), then the updated parameters all-gathered. Invariant: every
// rank issues the same collectives in the same order, and every rank ends the step with the
// same parameter bits.
#pragma once

#include <map>
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
#include "trainer/exec/program.h"
#include "trainer/optim/gather_order.h"
#include "trainer/optim/gradient_staging.h"
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
// forward (in the order and with the per-piece waits of Note [Parameters gathered for the next
// forward] in gather_order.h). memory.optimizer host: the rank's gradient floats go to host memory
// bucket by bucket, the host updates its fp32 copy of the rank's weights and the state there (one
// host wait per step, for the copies), and the weights go back piece by piece, each before its
// piece of the all-gather (Note [Host copies on the links]). Gradient bits equal all_reduce_mean's
// on two ranks (a + b either way); with more ranks MPI may sum in another order (Note [Model state
// per rank] says what the tests hold). zero 2 with a staging area (ParameterStore::staged) keeps no
// whole gradient block: Note [Gradients through a staging ring] in gradient_staging.h; under
// optim.accumulate it reduce-scatters every micro-batch and sums them in the shard (DeepSpeed's
// choice: N reductions per update, no whole-block accumulation buffer).

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
//    Floats no bucket covers (padding) follow after reduce(). Under staged zero 2 the reduced
//    floats live in the gradient shard (ParameterStore::update_grads), and each bucket's copy
//    reads them there once its part has been copied (or added) into the shard; under
//    optim.accumulate they go down once, after the update's last micro-batch.
//  - Clipping: the device sums the squares (all-reduced by shard) and the 4-byte sum goes down the
//    same way; the host scales its gradients with ClipByNorm's element math (bitwise the device's).
//  - Weights: after the host update the rank's floats go up in pieces of comm.bucket_mb cut at
//    parameter boundaries, least deadline first; a piece's deadline is the planned start of the
//    forward step of the first layer that reads it. Each piece's copy completes its own event, and
//    compute waits for a piece only before the first step of the next forward that reads one of
//    its floats (as the all-gather's pieces: Note [Parameters gathered for the next forward] in
//    gather_order.h), so the later layers' weights go up while the first layers compute; any
//    other step (the first backward step) and checkpoints first wait for every piece still going
//    up. Under sharding (zero 1/2 on several ranks) compute never waits for the copies itself:
//    the all-gather of piece k (floats [k * P, k * P + P) of every shard) waits on the comm
//    stream for the copies up of this rank's part of piece k only, and the next forward waits for
//    the gather pieces it reads, so the chain is per piece: piece k's copy up, piece k's gather,
//    piece k's first reader. The next batch goes up on compute (ExecutorOptions::load_on_compute),
//    not behind the pieces on the host-to-device stream, or the first layer would wait for them
//    all. Under bf16 compute still waits for every piece once the update is issued: the working
//    copy is narrowed from the whole block before the first step (Note [The bf16 working copy]).
//    A trace shows the overlap: Note [Weights going up across a traced step's end] (trace.cc).

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
  // Whether backward writes into the staging area (zero 2 without a whole gradient block).
  bool staged() const { return store_.staged(); }
  // Before a backward pass (staged): `first` is the update's first micro-batch, whose reduced
  // parts replace the shard's gradients; later ones add to them. Under memory.optimizer host the
  // shard goes down to the host in the `last` micro-batch only.
  void begin_backward(bool first, bool last = true);
  // The executor's hooks (GradientListener): before step `step`, the waits for the parameter
  // pieces it reads (or, not a forward step, for every piece still gathering) and for staging
  // bytes it reuses; and where parameter `param`'s gradient is written (null: not staged).
  void before_step(const Program& program, int step);
  float* gradient_address(const Program& program, size_t param);
  // Orders `compute` after every parameter piece still being gathered (before anything but the
  // next forward reads parameters: checkpoints).
  void settle(Stream& compute);
  // The pieces of the last all-gather in the order they were issued.
  const std::vector<size_t>& gather_order() const { return gather_order_; }
  // memory.optimizer host: the weight pieces that go up (block floats [bounds[k], bounds[k + 1])),
  // and per piece the tape step before which compute waited for the last update's copy of it
  // (-1: a wait for every piece, -2: no wait yet; under sharding the gather waits instead).
  const std::vector<int64_t>& weight_pieces() const { return up_bounds_; }
  const std::vector<int>& weight_waits() const { return up_waited_at_; }
  // The staging layout of `program` (planned on first use).
  const StagingPlan& staging_plan(const Program& program) { return staged_for(program).plan; }
  // The reductions not launched during backward, and compute ordered after all of them.
  void reduce(Stream& compute);
  // Clipping, the shard's update (device or host), the all-gather; compute waits for it.
  void update(float lr);
  // The host copy of the weights no longer matches the device's (a checkpoint was loaded).
  void weights_changed() { host_weights_current_ = false; }
  // Collectives of the last update: reductions (one per bucket range, per micro-batch when
  // staged) and all-gathers.
  int64_t reductions() const { return reductions_; }
  int64_t gathers() const { return gathers_; }
  // Bytes the last update's all-gathers delivered to each rank (every rank's parts: fp32, or
  // under sharded masters the bf16 working copy and the fp32 weights).
  uint64_t gathered_bytes() const { return gathered_bytes_; }

 private:
  struct Staged {
    StagingPlan plan;
    std::byte* base = nullptr;  // the store's staging area, or a grown one
    std::vector<int> origin;    // the program's plan.origin: a program at a reused address differs
  };
  CommWork reduce_range(float* block, int64_t offset, int64_t count, Stream& after);
  // Staged: the range's reduce-scatter in the staging area and this rank's part into the shard.
  CommWork reduce_staged(int64_t offset, int64_t count, Stream& after);
  const Staged& staged_for(const Program& program);
  // Per step of `program`, the pieces it reads, and the order to gather them in.
  struct Gathers {
    std::vector<std::vector<size_t>> read;
    std::vector<std::vector<size_t>> uploads;  // memory.optimizer host unsharded: weight pieces
    std::vector<size_t> order;
    std::vector<int> origin;
  };
  const Gathers& gathers_for(const Program& program);
  // Under bf16, compute after every piece once the update is issued (the working copy is
  // narrowed from the whole block).
  void settle_for_working_copy(Stream& compute);
  // `on_device` false: the sum of squares only (the host scales: Note [Host copies on the links]).
  void clip(Stream& compute, bool on_device = true);

  // memory.optimizer host (model_state_host.cc, Note [Host copies on the links]).
  // The floats [offset, offset + count) of the block, once `after`'s work so far and `reduced`
  // are done, copied down where they fall in this rank's range.
  void send_gradients(int64_t offset, int64_t count, const CommWork& reduced, Stream& after);
  // After reduce(): the rank's floats no bucket sent.
  void send_rest(Stream& compute);
  void host_update(Stream& compute, float lr);
  // The weight pieces going up, in block order: cut at parameter boundaries, each with the least
  // deadline of its parameters (cut once; up_bounds_ holds their bounds).
  struct UpPiece {
    int64_t begin, end;
    double deadline_s;
  };
  const std::vector<UpPiece>& up_pieces();
  // Orders compute after weight piece k's copy up, before tape step `step` (-1: settle).
  void wait_upload(size_t k, Stream& compute, int step);
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
  uint64_t gathered_bytes_ = 0;
  // Staged gradients: plans by program, the one of the backward running, each range's bucket
  // and index by its first float in the gradient block, and per bucket the event of its last
  // shard copy (compute waits for it before reusing the bucket's bytes).
  std::map<const Program*, Staged> plans_;
  const Staged* plan_ = nullptr;
  std::vector<DeviceBuffer> grown_;  // areas for layouts past the planned one
  // The parameter all-gather: its pieces, each one's work while compute has not been ordered
  // after it, the program of the last backward (the next forward's, most likely).
  GatherPieces pieces_;
  std::map<const Program*, Gathers> gather_plans_;
  std::vector<CommWork> gathering_;
  std::vector<uint8_t> waiting_;
  std::vector<size_t> gather_order_;
  const Program* last_program_ = nullptr;
  std::map<int64_t, std::pair<size_t, size_t>> range_at_;
  std::vector<std::unique_ptr<Event>> copied_;
  std::vector<uint8_t> launched_;  // buckets reduced in this backward
  bool first_micro_ = true;
  bool last_micro_ = true;
  bool grew_ = false;
  // memory.optimizer host, per step: the copies' events (reused), the ranges sent down, the last
  // copy down's event, and the pinned landing place of the clipping sum.
  std::vector<std::unique_ptr<Event>> events_;
  size_t next_event_ = 0;
  std::vector<std::pair<int64_t, int64_t>> sent_;
  Event* down_ = nullptr;
  PinnedFloats host_sum_sq_;
  // The weights going up: the pieces, each one's event (its own: compute may wait on it after the
  // step's other events are re-recorded), the copies compute has not been ordered after yet
  // (unsharded), and where compute waited for each (weight_waits()).
  std::vector<UpPiece> up_pieces_;
  std::vector<int64_t> up_bounds_;
  std::vector<std::unique_ptr<Event>> up_events_;
  std::vector<uint8_t> uploading_;
  std::vector<int> up_waited_at_;
};

}  // namespace ferry
