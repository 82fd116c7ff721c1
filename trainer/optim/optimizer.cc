// SGD / AdamW launches and the schedules.
#include "trainer/optim/optimizer.h"

#include <cmath>

namespace ferry {

int optimizer_slots(const OptimizerOptions& options) {
  if (options.kind == OptimizerKind::kAdamW) return 2;
  return options.momentum > 0 ? 1 : 0;
}

void Optimizer::step(Kernels& kernels, Stream& stream, ParameterStore& store, float lr) {
  ++steps_;
  const int64_t n = store.param_floats();
  if (options_.kind == OptimizerKind::kSgd) {
    kernels.launch(SgdUpdate{n, lr, options_.momentum, options_.weight_decay, options_.nesterov,
                             store.param_block(), store.grad_block(),
                             options_.momentum > 0 ? store.optimizer_block(0) : nullptr},
                   stream);
    return;
  }
  kernels.launch(AdamWUpdate{n, lr, options_.beta1, options_.beta2, options_.eps,
                             options_.weight_decay, steps_, store.param_block(), store.grad_block(),
                             store.optimizer_block(0), store.optimizer_block(1)},
                 stream);
}

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  const int64_t after = step - warmup_steps;
  switch (kind) {
    case ScheduleKind::kConstant:
      return base_lr;
    case ScheduleKind::kStep:
      return base_lr * std::pow(gamma, static_cast<float>(after / std::max<int64_t>(step_size, 1)));
    case ScheduleKind::kCosine: {
      // The last update (number total_steps - 1) is at min_lr.
      const int64_t span = std::max<int64_t>(total_steps - 1 - warmup_steps, 1);
      const double progress = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
      return static_cast<float>(min_lr +
                                (base_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return base_lr;
}

}  // namespace ferry
