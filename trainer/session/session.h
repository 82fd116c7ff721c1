// A Session is the composition root of a run: from a resolved Config and this process's rank it
// builds the run (Note [What a Session builds]) and offers the steps of training in the words of
// the loop: forward_backward, reduce_gradients, update.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/buckets.h"
#include "comm/communicator.h"
#include "comm/ranks.h"
#include "device/device.h"
#include "links/link_arbiter.h"
#include "trainer/config/config.h"
#include "trainer/configured/options.h"
#include "trainer/exec/executor.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/graph.h"
#include "trainer/optim/model_state_step.h"
#include "trainer/optim/optimizer.h"
#include "trainer/plan/device_profile.h"
#include "trainer/plan/model_state.h"
#include "trainer/session/accumulation.h"
#include "trainer/session/rank_placement.h"

// Note [What a Session builds]
// It places the rank, creates the device, the model (graphs per input shape), the persistent
// memory, the optimizer, the executor and the communicator.

namespace ferry {

class Session {
 public:
  // Builds everything; `training` selects whether optimizer state is allocated. Under MPI,
  // rank 0's initial parameters and buffers are broadcast to every rank. `placed`: where the
  // caller already placed (and bound) this rank (place_this_rank), else the session places it.
  Session(const Config& config, const RankInfo& ranks, bool training,
          std::optional<RankPlacement> placed = std::nullopt);
  ~Session();

  const Config& config() const { return config_; }
  const RankInfo& ranks() const { return ranks_; }
  const RankPlacement& placement() const { return placement_; }
  Device& device() { return *device_; }
  ParameterStore& store() { return *store_; }
  Executor& executor() { return *executor_; }
  Optimizer& optimizer() { return *optimizer_; }
  Communicator& communicator() { return *comm_; }
  // The graph at the configured batch size (layer names, parameter list).
  const Graph& graph() const { return graph_; }
  std::vector<std::string> optimizer_slot_names() const;
  // The model state this rank holds (memory.zero, memory.optimizer, auto resolved), and the
  // banner's line about it (empty for zero 0 + device).
  const ModelStateChoice& model_state() const { return model_state_; }
  const std::string& model_state_line() const { return model_state_line_; }
  // The sharded or host reduce-and-update, or null (zero 0 + device: GradientBuckets and
  // Optimizer::step).
  ModelStateStep* model_state_step() { return state_step_.get(); }
  const ModelStateStep* model_state_step() const { return state_step_.get(); }
  // Optimizer state of a sharded or host store: every rank's shard assembled into the store's
  // optimizer image (collective: every rank calls it; before save_checkpoint), and after
  // load_checkpoint this rank's shard taken from it.
  void gather_optimizer_state();
  void scatter_optimizer_state();
  // The measured cost model the plan used (memory.measure), or null (the FLOP model).
  const DeviceProfile* cost_profile() const { return profile_ ? &*profile_ : nullptr; }
  // memory.optimizer host: the seconds an update spends beyond the activation plan's step (the
  // rank's gradients down, the host update, its weights up, and under sharding the all-gather),
  // at the cost model's rates (memory.measure: the host update's measured one); else 0.
  double model_state_seconds() const { return model_state_seconds_; }

  // One training step, in order. forward_backward enqueues the batch's forward and backward
  // passes, launching each gradient bucket's all-reduce as backward fills it (comm.overlap);
  // reduce_gradients launches the rest and orders compute after all of them; update enqueues
  // the optimizer; metrics waits for the step and returns its loss. Under optim.accumulate, an
  // update calls forward_backward once per micro-batch, then reduce_gradients and update once:
  // gradients are summed on the device and reduced on the last micro-batch only (Note
  // [Accumulating micro-batches] in accumulation.h).
  void forward_backward(const HostBatch& batch, uint64_t step, const MicroBatch& micro = {});
  void reduce_gradients();
  void update(float lr);
  StepMetrics metrics() { return executor_->read_metrics(); }
  // The device scalar holding the last update's gradient sum of squares (before clipping), or
  // null when the optimizer does not measure it (optim.clip_norm 0).
  const float* grad_norm_sq() const;
  // The all-reduce spans of the last step (for traces); empty on one rank.
  std::vector<BucketSpan> reduce_spans() const;
  // The gradient buckets' counts so far (reductions, collectives, overlapped buckets); null
  // before the first step.
  const GradientBuckets* gradient_buckets() const { return active_buckets_; }
  // What the node's link ledger measured on every emulated link (CPU ranks on topology.file);
  // empty when this run emulates no links.
  std::vector<LinkUsage> link_usage() const;

 private:
  // A block of param_floats() floats sharded like the optimizer state, whole on every rank from
  // each rank's shard `mine` (broadcast in host memory; unsharded, `mine` is the block). A
  // collective: every rank calls it in the same order.
  std::vector<float> gather_shards(const std::vector<float>& mine);
  GradientBuckets& buckets(const HostBatch& batch);
  // Sets model_state_ and its banner line; the store's layout for it.
  StoreLayout resolve_model_state(const Config& config, const RankInfo& ranks);
  // The node's shared link ledger, one per topology for every job of this user: each rank
  // attaches it under its job's token (drawn by rank 0), creating it when it is the first
  // (Note [Link ledger lifetime]).
  void attach_link_ledger();

  Config config_;
  RankInfo ranks_;
  RankPlacement placement_;
  // The copy arbiter of the rank's links (links/link_arbiter.h): CPU ranks on topology.file,
  // GPU ranks under the topology scheduler; null otherwise. Outlives the device, which drains
  // through it.
  std::shared_ptr<LinkArbiter> arbiter_;
  std::unique_ptr<Device> device_;
  Graph graph_;
  std::unique_ptr<ParameterStore> store_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<GradientBuckets> buckets_;
  std::unique_ptr<ModelStateStep> state_step_;
  GradientBuckets* active_buckets_ = nullptr;
  ModelStateChoice model_state_;
  ModelState state_;  // its bytes per rank
  double model_state_seconds_ = 0;
  std::string model_state_line_;
  std::unique_ptr<GradientListener> listener_;
  std::unique_ptr<GradientAccumulation> accumulation_;  // optim.accumulate > 1
  MicroBatch micro_;                                    // the current micro-batch
  std::optional<DeviceProfile> profile_;
};

}  // namespace ferry
