// Recomputation (SuperNeurons' cost-aware recompute): a saved activation produced by a cheap
// step (ReLU, BN, pooling) can be dropped after the forward pass and rebuilt just before its
// first backward use by running its producer again — and, when the producer's input was not
// kept either, that input's producer first (a short chain back to tensors that are kept).
#pragma once

#include <vector>

#include "prefetch/liveness.h"
#include "prefetch/tape.h"

namespace ferry {

struct RecomputeChain {
  int target = -1;         // the saved tensor rebuilt
  std::vector<int> steps;  // forward steps to run again, in forward order; the last writes target
  std::vector<int> temps;  // tensors the chain rebuilds on the way (not saved themselves)
  double flops = 0;
};

// The chain that rebuilds `target`, or an empty chain when it cannot be rebuilt from tensors
// that stay available (its producer is not recomputable, or the chain would be too long).
// `saved` marks tensors that backward reads (they are kept or fetched back).
RecomputeChain recompute_chain(const Tape& tape, const Liveness& live, int target,
                               const std::vector<bool>& saved, int max_steps = 3);

// The tape with each chain's steps inserted (as kRecompute copies of the forward steps, writing
// only the chain's tensors) right before its target's first backward use. `origin` receives,
// per output step, the input step it runs.
Tape insert_recompute(const Tape& tape, const Liveness& live,
                      const std::vector<RecomputeChain>& chains, std::vector<int>& origin);

}  // namespace ferry
