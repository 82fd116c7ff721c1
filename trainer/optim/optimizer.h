// Optimizers and learning-rate schedules. The update is one fused kernel launch over the
// whole parameter block (parameters, gradients and state share one layout), so its cost does
// not grow with the number of layers.
#pragma once

#include <cstdint>

#include "device/kernels.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/optim/kinds.h"

namespace ferry {

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

// State blocks the optimizer needs: SGD with momentum 1, SGD without 0, AdamW 2.
int optimizer_slots(const OptimizerOptions& options);

class Optimizer {
 public:
  explicit Optimizer(const OptimizerOptions& options) : options_(options) {}
  // Enqueues one update of every parameter with learning rate `lr` on `stream`.
  void step(Kernels& kernels, Stream& stream, ParameterStore& store, float lr);
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }

 private:
  OptimizerOptions options_;
  int64_t steps_ = 0;
};

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::kConstant;
  float base_lr = 0.1f;
  int64_t warmup_steps = 0;  // linear warm-up from base_lr / warmup_steps
  int64_t step_size = 30;    // kStep: multiply by gamma every step_size steps after warm-up
  float gamma = 0.1f;
  float min_lr = 0.0f;  // kCosine: the floor reached at total_steps
  int64_t total_steps = 1;

  // The rate for update number `step` (0-based).
  float at(int64_t step) const;
};

}  // namespace ferry
