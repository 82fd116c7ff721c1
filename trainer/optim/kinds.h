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

}  // namespace ferry
