// The optimizer and learning-rate schedule kinds (optim.name, optim.schedule) and which
// parameters weight decay applies to (optim.decay).
#pragma once

namespace ferry {

enum class OptimizerKind { kSgd, kAdamW };
enum class ScheduleKind { kConstant, kStep, kCosine };
// kMatrices: only parameters of 2+ dimensions (weights of linear, conv and embedding layers), not
// biases or normalisation weights (Hugging Face's Trainer, nanoGPT); kAuto: the model's choice
// (ModelInfo::decay_matrices_only).
enum class WeightDecayGroups { kAuto, kMatrices, kAll };
// memory.zero: how much model state each data-parallel rank keeps (Note [Model state per rank]
// in trainer/plan/model_state.h). k1: 1/N of the optimizer state; k2: and of the gradients; kAuto:
// the planner's choice.
enum class ZeroStage { k0, k1, k2, kAuto };
// memory.optimizer: where the optimizer state lives and its update runs; kAuto: the planner's.
enum class OptimizerPlacement { kDevice, kHost, kAuto };

}  // namespace ferry
