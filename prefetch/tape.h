// The step schedule the memory planner works on: a linear, model-agnostic tape of steps over the
// arena's tensors. Invariant: every tensor is written by one step before any step reads it
// (accumulation targets excepted: Note [What a tape holds]).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "device/dtype.h"

namespace ferry {

// Note [What a tape holds]
// The step schedule the memory planner works on: a linear tape of steps (load, forward ops,
// backward ops, gradient accumulations, the update) over the tensors that live in the
// activation arena. It is model-agnostic: the trainer lowers its graph to a Tape.
// Invariant: every tensor is written by exactly one step before any step reads it, except
// accumulation targets, which their accumulate steps read and write.

enum class TapeTensorKind : uint8_t {
  kInput,       // the uploaded batch (images, labels)
  kActivation,  // a forward output
  kAux,         // state a forward saves for its backward
  kGradient,    // an activation's gradient (or a partial one to accumulate)
  kWorkspace,   // one step's scratch
};

struct TapeTensor {
  std::string name;
  uint64_t bytes = 0;
  TapeTensorKind kind = TapeTensorKind::kActivation;
  // The storage dtype (for reports: bytes by dtype); bytes already count it. A workspace is
  // kU8 (raw bytes).
  DType dtype = DType::kF32;
};

// kRecompute runs a forward step again, in backward, to rebuild a dropped activation; it
// writes the same bits and leaves persistent state alone.
enum class StepPhase : uint8_t { kLoad, kForward, kBackward, kAccumulate, kUpdate, kRecompute };

struct TapeStep {
  StepPhase phase = StepPhase::kForward;
  int node = -1;     // the graph node (forward/backward), -1 otherwise
  std::string name;  // "layer1.0.conv1" (+ phase for display)
  std::string op;    // the op kind ("conv2d")
  std::vector<int> reads;
  std::vector<int> writes;
  double flops = 0;
  bool recomputable = false;  // its forward may run again in backward (ReLU, BN, pool, conv)
  // (read, write) tensor pairs the step computes in place: when the read tensor dies at this
  // step, the write may take over its memory.
  std::vector<std::pair<int, int>> alias;
  // Writes a recompute of this step cannot rebuild (an output its op rebuilds only with others).
  std::vector<int> not_rebuilt;
};

struct Tape {
  // Indexed by tape index, the number every step, liveness and plan uses for a tensor (the
  // trainer's graph numbers them otherwise: Note [Three ids of a tensor] in
  // trainer/exec/lower.h).
  std::vector<TapeTensor> tensors;
  std::vector<TapeStep> steps;
};

}  // namespace ferry
