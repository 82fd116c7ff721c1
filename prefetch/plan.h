// A memory plan: per arena tensor, resident, offloaded or recomputed, and where it lives; made once
// per input shape. Invariant: its step indices refer to its own tape (Note [A plan's tape]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "prefetch/arena.h"
#include "prefetch/cost_model.h"
#include "prefetch/liveness.h"
#include "prefetch/policy.h"
#include "prefetch/tape.h"

namespace ferry {

// Note [A plan's tape]
// A memory plan: for every arena tensor, whether it stays resident, is offloaded to pinned
// host memory and prefetched back, or is dropped and recomputed; where it lives in the arena
// during each stretch of device residency; and the predicted peak and cost. Made once per input
// shape. Recomputation adds steps, so a plan carries its own tape (the input tape with the
// recompute steps inserted); step indices in a plan refer to that tape.

// Device bytes that live for the whole run, by lifetime class.
struct PersistentBytes {
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizer = 0;
  uint64_t buffers = 0;  // BN running statistics, metrics
  // device.precision bf16: the weights' bf16 working copy, made once per update (Note [Which
  // tensors are bf16] in trainer/model/precision.h); 0 in fp32.
  uint64_t working_weights = 0;
  uint64_t total() const { return weights + gradients + optimizer + buffers + working_weights; }
};

enum class Decision : uint8_t { kResident, kOffload, kRecompute };
std::string_view decision_name(Decision d);

// One stretch of device residency at one arena offset: steps [begin, end].
struct Residency {
  int begin = 0;
  int end = 0;
  uint64_t offset = 0;
  // The step `end` computes another tensor in place over this one: its memory is handed on.
  bool handed_on = false;
};

// The four steps of an offload, in steps of the planned tape, always in this order:
//
//   offload_after < release_at < fetch_at <= needed_at
//
//   ..write.. [offload_after] [release_at ... fetch_at-1] [fetch_at ... needed_at-1] [needed_at]
//              copy to host    space reused by others      copy back into new space   first use
//              starts after    (compute waited for the     (h2d waited for compute    (compute
//              this step       copy to host first)         to end step fetch_at-1)    waits for it)
//
// - offload_after: the tensor's last write before its idle gap (for a saved activation, its
//   producer). The copy to host is ordered after this step's event.
// - release_at: the step after its last access before the gap. Compute waits for the copy to
//   host before this step, and from it on the tensor's first residency stretch is free space.
// - fetch_at: the copy back is issued before this step, into the tensor's second stretch,
//   which begins here; the host-to-device stream first waits for compute to end step
//   fetch_at - 1 (the space is then free).
// - needed_at: its first access after the gap (for a saved activation, its first backward
//   use). Compute waits for the copy back before this step.
//
// The copy to host has to land by release_at and the copy back by needed_at: those are the
// deadlines the transfers carry (TransferRequest::deadline_step). vdnn_timing and gap_timing
// (planner_impl.h) choose the four; auto then issues fetches earlier and releases later as far
// as the budget allows.
// See Note [Life of an offloaded activation] (trainer/exec/executor.h) for where each is used.
struct OffloadTiming {
  int offload_after = -1;
  int release_at = -1;
  int fetch_at = -1;
  int needed_at = -1;
};

// What the plan decided for one tensor. Its OffloadTiming (the base) is set for kOffload and
// -1 otherwise; an offloaded tensor has two residency stretches, [first write, release_at - 1]
// and [fetch_at, last access].
struct TensorPlan : OffloadTiming {
  Decision decision = Decision::kResident;
  std::vector<Residency> residency;  // in step order; empty for a tensor never written
};

struct MemoryPlan {
  MemoryPolicy policy = MemoryPolicy::kNone;
  uint64_t budget = 0;
  PersistentBytes persistent;
  Tape tape;                // the planned tape: the input tape plus recompute steps
  std::vector<int> origin;  // per planned step: the input step it runs (a recompute step
                            // runs a forward step again)
  std::vector<TensorPlan> tensors;
  uint64_t arena_bytes = 0;       // activations + gradients + workspaces, laid out
  uint64_t activation_bytes = 0;  // of the arena at its fullest step: activations, aux, inputs
  uint64_t workspace_bytes = 0;   // of the arena at its fullest step: workspaces
  uint64_t gradient_bytes = 0;    // of the arena at its fullest step: activation gradients
  uint64_t offload_bytes = 0;     // copied to host per step (and prefetched back)
  uint64_t host_bytes = 0;        // pinned host memory the offloads need
  double recompute_flops = 0;
  // The saved tensors the policy drops and rebuilds in backward (tape ids, the same in the input
  // and the planned tape): the recompute chains' targets and the dropped tensors they rebuild.
  std::vector<int> dropped;
  uint64_t lower_bound = 0;   // persistent + the largest single-step working set
  int lower_bound_step = -1;  // the input-tape step that sets it
  Prediction prediction;      // the cost model's step time and stalls

  uint64_t peak_bytes() const { return persistent.total() + arena_bytes; }
};

// Note [One plan for every shape]
// Mimose's static baseline (memory.per_shape: false): the decisions of the plan made for one
// input shape (the largest), by tensor name, applied to the tape of every other shape of the same
// graph: the same tensors offloaded and the same ones dropped and rebuilt, where a plan per shape
// would move or rebuild less for a smaller input. Only the timing of the offloads (when each is
// released and fetched back) is fitted to each tape and the budget again, as a layout detail.
struct FixedDecisions {
  std::string from;                    // the input they were planned for, for messages
  std::vector<std::string> offload;    // tensors offloaded
  std::vector<std::string> recompute;  // saved tensors dropped and rebuilt in backward
};

// The decisions of `plan` by tensor name; `from` names the input it was planned for.
FixedDecisions fixed_decisions(const MemoryPlan& plan, std::string from);

struct PlanOptions {
  MemoryPolicy policy = MemoryPolicy::kNone;
  uint64_t budget = 0;  // device bytes the plan must fit; 0 = unlimited
  bool recompute = false;
  // auto only: after fitting, keep resident again each offload whose copies the link (at
  // cost.link_gbps, the bandwidth this GPU gets) cannot hide, where the plan still fits. The
  // contention-aware planner sets it; see Note [Keeping what a shared link cannot hide].
  bool keep_unhidden = false;
  // auto only: take these decisions instead of choosing them (Note [One plan for every shape]);
  // nullptr: choose. A tensor they name that this tape lacks is a ConfigError; a tape they do
  // not fit within the budget a BudgetError.
  std::shared_ptr<const FixedDecisions> fixed;
  PersistentBytes persistent;
  CostModel cost;
};

// Plans `tape` under options.policy. Throws BudgetError when options.budget is below the lower
// bound (naming the step whose working set does not fit and the smallest budget that would),
// or when the policy's plan does not fit the budget (naming the smallest budget it can meet).
MemoryPlan plan_memory(const Tape& tape, const PlanOptions& options);

// The copies a plan makes per step, in tensor order (each offload, then its prefetch): what the
// cost model's simulate() and the node simulator run.
std::vector<SimTransfer> plan_transfers(const MemoryPlan& plan);

// The largest single-step working set (every tensor a step reads or writes) plus the
// persistent bytes: no plan of this tape can peak lower.
uint64_t working_set_bound(const Tape& tape, const PersistentBytes& persistent, int* step);

// Arena bytes in use at each step of the plan's tape (aligned sizes of the stretches that
// cover it): the device-memory curve of a step, minus the persistent bytes.
std::vector<uint64_t> arena_occupancy(const MemoryPlan& plan);

// The tensors a backward step reads that forward produced: what vDNN calls saved activations.
// `conv_inputs_only` keeps those a convolution's forward reads (vDNN's vdnn-conv).
std::vector<int> saved_tensors(const Tape& tape, const Liveness& live, bool conv_inputs_only);

}  // namespace ferry
