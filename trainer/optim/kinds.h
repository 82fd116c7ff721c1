// The optimizer and learning-rate schedule kinds (optim.name, optim.schedule).
#pragma once

namespace ferry {

enum class OptimizerKind { kSgd, kAdamW };
enum class ScheduleKind { kConstant, kStep, kCosine };

}  // namespace ferry
