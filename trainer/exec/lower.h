// Lowers a model graph to the planner's tape: load, forward steps, backward steps in reverse
// order with gradient accumulation where a tensor feeds several consumers, then the update.
// Also records, per step, which tape tensors fill each slot of the op's OpIo, so the executor
// only substitutes addresses.
#pragma once

#include <vector>

#include "device/kernels.h"
#include "prefetch/tape.h"
#include "trainer/model/graph.h"

namespace ferry {

// Where each OpIo slot of one step comes from: a tape tensor (>= 0), a persistent tensor of
// the graph (encoded as -2 - TensorId), or nothing (-1).
struct StepBinding {
  std::vector<int> inputs, outputs, params, buffers, aux;
  std::vector<int> grad_outputs, grad_inputs, grad_params;
  int workspace = -1;
  // kAccumulate: tape tensor `accumulate_from` is added into `accumulate_into`.
  int accumulate_from = -1, accumulate_into = -1;
};

constexpr int persistent_slot(TensorId id) { return -2 - id; }
constexpr bool is_persistent_slot(int slot) { return slot <= -2; }
constexpr TensorId persistent_id(int slot) { return -2 - slot; }

struct Lowered {
  Tape tape;
  std::vector<StepBinding> bindings;  // one per tape step
  std::vector<int> tape_of;           // graph TensorId -> tape tensor, -1 when persistent
  bool training = true;
};

// Lowers `graph`. training=false gives a forward-only tape (evaluation).
Lowered lower_graph(const Graph& graph, Kernels& kernels, bool training);

}  // namespace ferry
