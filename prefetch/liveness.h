// Liveness over a tape: for every tensor, the step that writes it, every step that reads it,
// and the step after which it is dead. Forward uses and backward uses are kept apart, since
// the gap between them is what offloading exploits.
#pragma once

#include <vector>

#include "prefetch/tape.h"

namespace ferry {

struct TensorLiveness {
  int produced = -1;            // the first step that writes it
  std::vector<int> uses;        // steps that read it, ascending (no duplicates)
  int last_use = -1;            // the last step that reads or writes it
  int last_forward_use = -1;    // the last use at or before the end of the forward pass
  int first_backward_use = -1;  // the first use after the forward pass, -1 if none
};

struct Liveness {
  std::vector<TensorLiveness> tensors;
  int forward_end = -1;  // index of the last forward step
};

Liveness analyse_liveness(const Tape& tape);

}  // namespace ferry
