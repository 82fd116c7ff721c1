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

// Note [Three ids of a tensor]
// A tensor is numbered in up to three spaces, one per layer that names it:
//  - TensorId (trainer/model/tensor.h): its index in Graph::tensors(). Every tensor of the
//    model graph has one, persistent ones (parameters, buffers, metrics) included; the model,
//    the ParameterStore and checkpoints speak it.
//  - tape index (prefetch/tape.h): its index in Tape::tensors. Only what lives in the
//    activation arena has one: inputs, activations, aux state, activation gradients and
//    workspaces. The planner, MemoryPlan::tensors, the executor's per-step lists and
//    Program::offloads speak it. Lowered::tape_of maps TensorId -> tape index (-1 for a
//    persistent tensor); a workspace or a partial gradient has a tape index and no TensorId.
//    Recompute steps add no tensors, so the input tape and the planned tape share tape indices.
//  - binding slot (StepBinding): what fills one OpIo slot of a step, one int for both spaces:
//    a tape index (>= 0), a persistent tensor as -2 - TensorId (persistent_slot, <= -2), or
//    nothing (-1). The executor resolves it with slot_address.

// Where each OpIo slot of one step comes from, as binding slots (Note [Three ids of a tensor]).
struct StepBinding {
  std::vector<int> inputs, outputs, params, buffers, aux;
  std::vector<int> grad_outputs, grad_inputs, grad_params;
  int workspace = -1;
  // The node's storage dtype, OpIo::dtype (node_dtype).
  DType dtype = DType::kF32;
  // kAccumulate: tape tensor `accumulate_from` is added into `accumulate_into`.
  int accumulate_from = -1, accumulate_into = -1;
};

// Binding slot <-> TensorId of a persistent tensor (Note [Three ids of a tensor]).
constexpr int persistent_slot(TensorId id) { return -2 - id; }
constexpr bool is_persistent_slot(int slot) { return slot <= -2; }
constexpr TensorId persistent_id(int slot) { return -2 - slot; }

struct Lowered {
  Tape tape;
  std::vector<StepBinding> bindings;  // one per tape step
  std::vector<int> tape_of;           // graph TensorId -> tape tensor, -1 when persistent
  bool training = true;
};

// The storage dtype of node `n`'s kernels (Note [Storage dtype of a kernel] in
// device/kernels.h): its first floating activation output's, else its first floating input's
// (the loss reads bf16 logits and writes fp32 metrics), else fp32.
DType node_dtype(const Graph& graph, int n);

// Lowers `graph`. training=false gives a forward-only tape (evaluation).
Lowered lower_graph(const Graph& graph, Kernels& kernels, bool training);

}  // namespace ferry
