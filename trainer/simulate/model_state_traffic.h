// What memory.zero and memory.optimizer move in one simulated step: the all-reduce buckets turned
// into reduce-scatters and all-gathers, the host optimizer's gradient and parameter copies on
// every rank's streams, and its update on the host (Note [Model state on the node] in
// sim/node_sim.h). Invariant: zero 0 with the optimizer on the device leaves the input unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/node_sim.h"
#include "trainer/plan/model_state.h"

namespace ferry {

// Per rank and step: what the model state adds to the node's traffic.
struct ModelStateTraffic {
  ModelState state;              // the stage and placement simulated, and its bytes per rank
  int job_ranks = 1;             // every node's ranks
  uint64_t to_host_bytes = 0;    // the gradients the host update reads (its shard, fp32)
  uint64_t to_device_bytes = 0;  // the updated parameters back (its shard, fp32)
  double host_update_seconds = 0;
  // Whether anything differs from zero 0 with the optimizer on the device.
  bool active() const { return state.choice != ModelStateChoice{}; }
};

struct ModelStateSteps {
  int first_forward = 1;      // the step the all-gather and the parameters' upload must precede
  uint64_t bucket_bytes = 0;  // comm.bucket_mb: the all-gather's pieces per rank
  int slots = 0;              // optimizer state blocks
  double host_update_gbps = 0;
};

// Note [The device update's cost]
// The device optimizer's update is one memory-bound pass over the parameters a rank updates (its
// shard under zero 1 and 2, the whole block under zero 0): per parameter it reads the weight, the
// gradient and each optimizer slot and writes the weight and each slot back, (2 slots + 3) fp32
// values (AdamW 28 bytes, SGD with momentum 20, without 12). Under device.precision bf16 the
// update also writes the bf16 working copy (Note [The bf16 working copy] in
// trainer/exec/parameter_store.h), 2 bytes per parameter of the whole block, which every rank
// keeps, or of the shard only where zero 1 and 2 shard the masters (Note [Sharded master
// weights]: the all-gather fills the rest). The pass streams at the hardware profile's
// compute.memory_gbps (the HBM rate a stream reaches; each profile says how it relates to its
// datasheet peak), on top of the update step's launch cost, which was all the simulator counted
// before.

// Bytes the device update of one rank reads and writes per step (Note [The device update's
// cost]); `slots`: optimizer state blocks.
uint64_t device_update_bytes(const ModelState& state, int slots, bool bf16);

// Adds to each rank's update step (`update_step`, or its last when that is -1 or past its end)
// the time to stream `bytes` at `memory_gbps`; returns that time. Call it when the optimizer is
// on the device (trainer simulate, and each job of --mix).
double add_device_update(std::vector<SimRank>& ranks, int update_step, uint64_t bytes,
                         double memory_gbps);

// Rewrites `in` (its buckets: the all-reduce in launch order, each ready after the backward
// step that completes it; its ranks, each ending with the update step) for `state` on a job of
// `job_ranks` ranks:
//   zero 1, 2 (ranks > 1): each bucket becomes a reduce-scatter of the same bytes (zero 2 ready
//     as backward completes it, zero 1 after backward) and all-gathers of the same total, in
//     pieces of bucket_bytes per rank, open the step, needed by steps.first_forward;
//   host: per rank the shard's gradients to host after each bucket's collective (the shard's
//     part of the bucket, host_gradients in all), the update step's time replaced by the host
//     update's ((2 slots + 3) shard bytes at host_update_gbps), and the shard's parameters to
//     the device at the start, each all-gather piece waiting for its part (host_weights in all).
// Returns what it added.
ModelStateTraffic add_model_state_traffic(NodeSimInput& in, const ModelState& state, int job_ranks,
                                          const ModelStateSteps& steps);

}  // namespace ferry
