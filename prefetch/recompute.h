// Recomputation: a saved activation is dropped after the forward pass and rebuilt before its first
// backward use by running its producer again (Note [Recomputing a chain]).
#pragma once

#include <vector>

#include "prefetch/liveness.h"
#include "prefetch/tape.h"

namespace ferry {

// Note [Recomputing a chain]
// Recomputation (SuperNeurons' cost-aware recompute, Chen et al.'s segment checkpointing): a
// saved activation can be dropped after the forward pass and rebuilt just before its first
// backward use by running its producer again (ReLU, BN, pooling, and convolutions and linear
// layers from a kept or fetched input) — and, when the producer's input was not kept either,
// that input's producer first (a chain back to tensors that stay available).

struct RecomputeChain {
  int target = -1;         // the saved tensor rebuilt
  std::vector<int> steps;  // forward steps to run again, in forward order; the last writes target
  // Tensors the chain rebuilds on the way: scratch that is not saved, and dropped saved tensors
  // that the backward pass needs later (they stay from here to their last use).
  std::vector<int> temps;
  double flops = 0;
};

// The chain that rebuilds `target`, or an empty chain when it cannot be rebuilt from tensors
// that stay available (its producer is not recomputable, or the chain would be too long).
// `saved` marks tensors that backward reads (they are kept or fetched back).
RecomputeChain recompute_chain(const Tape& tape, const Liveness& live, int target,
                               const std::vector<bool>& saved, int max_steps = 4);

// The chains that rebuild every tensor of `dropped` (each one recompute_chain accepts alone),
// one per target in the order the backward pass first needs them. A chain that reaches a
// dropped tensor that no earlier chain rebuilt rebuilds it as well (it then stays until its
// own backward use, and needs no chain of its own), so each forward step runs again at most
// once per stretch of backward; a dropped tensor that an earlier chain rebuilt is available.
// The rebuilt tensors of the returned chains cover `dropped` exactly once.
std::vector<RecomputeChain> recompute_chains(const Tape& tape, const Liveness& live,
                                             const std::vector<int>& dropped,
                                             const std::vector<bool>& saved);

// The tape with each chain's steps inserted (as kRecompute copies of the forward steps, writing
// only the chain's tensors) right before its target's first backward use. `origin` receives,
// per output step, the input step it runs.
Tape insert_recompute(const Tape& tape, const Liveness& live,
                      const std::vector<RecomputeChain>& chains, std::vector<int>& origin);

}  // namespace ferry
