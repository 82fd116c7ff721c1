// The config's keys as the options of the libraries below the trainer (device, planner and cost
// model, optimizer, learning-rate schedule): the one mapping training, planning and the simulator
// share, so that a plan made offline is the plan a run makes.
#pragma once

#include <string>

#include "device/device.h"
#include "prefetch/plan.h"
#include "trainer/config/config.h"
#include "trainer/optim/optimizer.h"

namespace ferry {

// The cost model the planner assumes for a config's backend and link (device.*, memory.link_gbps).
CostModel cost_model(const Config& config);
// Maps the config's memory.* keys to planner options (Note [Life of an offloaded activation]
// in trainer/exec/executor.h, step 1).
PlanOptions plan_options(const Config& config);
// The config's device.* keys and the kernels' workspace limit (memory.workspace_limit, at most
// an eighth of memory.budget, or of device.memory when device.deterministic); ordinal 0,
// threads as configured.
DeviceOptions device_options(const Config& config);
// Where a deterministic run with timed search keeps rank `rank`'s convolution algorithms, so a
// resumed run takes them (Note [Timed choices across processes] in
// device/cuda/algorithm_cache.h): <run.dir>/conv_algorithms.rank<R>.txt; "" for any other run.
std::string conv_algorithm_file(const Config& config, int rank);
// The config's optim.* keys; optim.decay=auto resolved from the model (ModelInfo).
OptimizerOptions optimizer_options(const Config& config);
LrSchedule lr_schedule(const Config& config);

}  // namespace ferry
