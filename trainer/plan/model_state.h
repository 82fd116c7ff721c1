// Model state per data-parallel rank: the bytes of weights, gradients and optimizer state one rank
// holds on its device and in host memory under memory.zero and memory.optimizer, and auto's choice
// of the two. Invariant: the figures are what ParameterStore allocates for the same inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "prefetch/plan.h"
#include "trainer/optim/kinds.h"

namespace ferry {

// Note [Model state per rank]
// fp32 training keeps per parameter 4 bytes of weight, 4 of gradient and 4 per optimizer slot
// (AdamW 2 slots = 8 bytes, SGD with momentum 1, without 0). With N data-parallel ranks the
// parameter block of F floats is cut into N shards of S = ceil(F / N) floats rounded up to 64
// (256 bytes, the device heap's alignment); under sharding the weight and gradient blocks are
// padded to N * S floats so every reduce-scatter and all-gather has equal parts. Per rank:
//
//   zero 0   weights P       gradients P                 optimizer slots * P
//   zero 1   weights N*S*4   gradients N*S*4             optimizer slots * S*4
//   zero 2   weights N*S*4   gradients S*4 + in flight   optimizer slots * S*4
//
// with P the parameter block's bytes. "In flight" under zero 2 is the staging area backward writes
// gradients into (Note [Gradients through a staging ring] in trainer/optim/gradient_staging.h):
// two bucket slots (the bucket backward is filling and the one being reduce-scattered), each the
// larger of comm.bucket_mb and the largest parameter written once (a parameter is never split),
// plus, for each parameter backward writes more than once (a tied embedding: the head starts its
// gradient, the embedding finishes it), its bucket held for the whole of backward: the larger of
// comm.bucket_mb and that parameter. Each is rounded up to 256 bytes. When S*4 + in flight is not
// below N*S*4, zero 2 keeps the whole block as zero 1 does.
// memory.optimizer host moves the optimizer state off the device (0 there) and adds in host memory,
// per rank, the state (slots * shard) plus the shard's fp32 weights and gradients the host update
// reads and writes: (slots + 2) * shard bytes, with shard = S*4 under zero 1 and 2 and P under zero
// 0. One rank (N = 1): S*4 = P and no padding, so zero changes nothing.
// device.precision bf16 adds the bf16 working copy of the (padded) block, block / 2 bytes, and
// with sharding or the host optimizer keeps the fp32 masters apart (Note [Sharded master weights]
// in trainer/exec/parameter_store.h): weights are then S*4 (none with the host optimizer, whose
// masters live on the host) plus F, the fp32 weights some op reads whole (embeddings, norms,
// biases), so per parameter 2 + 4/N bytes (2 on the host optimizer) plus 4 per fp32 weight.

struct ModelStateInputs {
  uint64_t param_bytes = 0;    // the parameter block (each tensor padded to 64 bytes)
  uint64_t largest_param = 0;  // bytes of the largest parameter (padded)
  uint64_t bucket_bytes = 0;   // comm.bucket_mb in bytes
  int slots = 0;               // optimizer state blocks
  int ranks = 1;               // data-parallel ranks
  uint64_t buffers = 0;        // BN statistics and metrics (never sharded)
  // The parameters (padded bytes) more than one node writes the gradient of (tied weights), and
  // the largest of the others (0: largest_param).
  std::vector<uint64_t> held_params;
  uint64_t largest_unheld = 0;
  // true: zero 2 keeps the whole (padded) gradient block, as zero 1 does; training sets it under
  // comm.overlap false, where no bucket is reduced before backward ends (a staging area would
  // hold every bucket). false: the formula above.
  bool whole_gradients = false;
  // device.precision bf16, and F: the bytes of the fp32 weights kept whole when the masters are
  // apart (ParameterStore::fp32_weight_bytes).
  bool bf16 = false;
  uint64_t fp32_weight_bytes = 0;
};

struct ModelStateChoice {
  ZeroStage zero = ZeroStage::k0;
  OptimizerPlacement optimizer = OptimizerPlacement::kDevice;
  bool operator==(const ModelStateChoice&) const = default;
};

// "zero 1 + host optimizer", "zero 0 + device optimizer".
std::string describe(const ModelStateChoice& c);

struct ModelState {
  ModelStateChoice choice;
  int ranks = 1;
  uint64_t shard_floats = 0;  // S: one rank's part of the (padded) parameter block
  // zero 2 without a whole gradient block: the gradients are the rank's shard (S*4) plus a
  // staging area of staging_bytes (two buckets and the held gradients).
  bool staged_gradients = false;
  uint64_t staging_bytes = 0;
  uint64_t staging_slot = 0;  // one of its two bucket slots
  // On the rank's device.
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizer = 0;
  // bf16: the working copy, and the fp32 weights within `weights` when the masters are apart.
  bool masters_apart = false;
  uint64_t working_weights = 0;
  uint64_t fp32_weights = 0;
  // In the rank's host memory (memory.optimizer host): the optimizer state, and the shard's
  // weights and gradients the host update works on.
  uint64_t host_optimizer = 0;
  uint64_t host_weights = 0;
  uint64_t host_gradients = 0;
  uint64_t device_bytes() const { return weights + gradients + optimizer + working_weights; }
  uint64_t host_bytes() const { return host_optimizer + host_weights + host_gradients; }
  // The persistent bytes a plan holds: these plus `buffers` (BN statistics, metrics).
  PersistentBytes persistent(uint64_t buffers) const {
    return {weights, gradients, optimizer, buffers, working_weights};
  }
};

// S for `floats` parameters over `ranks` ranks: ceil(floats / ranks) rounded up to 64 floats
// (the whole block when ranks is 1).
uint64_t shard_floats(uint64_t floats, int ranks);

// Note [Model state per rank]. `choice` must not hold auto.
ModelState model_state(const ModelStateInputs& in, ModelStateChoice choice);

// The combinations memory.zero and memory.optimizer allow, auto expanded, in order of preference
// (no sharding before sharding, the device before the host): (0, device), (1, device), (2,
// device), (0, host), (1, host), (2, host).
std::vector<ModelStateChoice> model_state_candidates(ZeroStage zero, OptimizerPlacement optimizer);

// Seconds a step spends on model state beyond what its memory plan predicts: under sharding the
// all-gather of the updated parameters ((N-1)/N of the block, not overlapped with backward as
// the all-reduce it replaces is) at `collective_gbps`; under the host optimizer the gradient
// shard's copy to host and the parameter shard's copy back at `link_gbps`, and the host update
// streaming (2 * slots + 3) * shard bytes at `host_update_gbps`.
double model_state_seconds(const ModelState& s, int slots, double collective_gbps, double link_gbps,
                           double host_update_gbps);

// One candidate as auto weighed it.
struct ModelStateOption {
  ModelState state;
  bool fits = false;
  std::string why_not;      // the budget or host-limit line when it does not fit
  MemoryPlan plan;          // the activation plan with this state (when it fits)
  double step_seconds = 0;  // plan's prediction + model_state_seconds
};

struct ModelStateDecision {
  std::vector<ModelStateOption> options;  // in model_state_candidates' order
  int chosen = -1;                        // index into options; -1: none fits
  const ModelStateOption& choice() const { return options[static_cast<size_t>(chosen)]; }
};

// Plans every candidate with `plan` (throws ConfigError/BudgetError when it does not fit the
// budget with those persistent bytes) and checks its host bytes plus the plan's offload bytes
// against `host_limit` (0: no limit); picks the fitting option with the least predicted step,
// the earlier (less sharding, no offload) one when they are within 1% of each other.
ModelStateDecision choose_model_state(
    const ModelStateInputs& in, const std::vector<ModelStateChoice>& candidates,
    uint64_t host_limit, const std::function<MemoryPlan(const PersistentBytes&)>& plan,
    const std::function<double(const ModelState&)>& extra_seconds);

}  // namespace ferry
