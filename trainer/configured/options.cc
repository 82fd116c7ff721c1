// The config's keys as the options of the libraries below the trainer: the device, the planner
// and its cost model, the optimizer and its learning-rate schedule. One mapping, read by training,
// planning and the simulator alike.
#include "trainer/configured/options.h"

#include <algorithm>
#include <filesystem>

#include "device/backend_traits.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {

CostModel cost_model(const Config& config) {
  // Note [Default device rates] in device/backend_traits.h (device.copy_gbps included).
  const DeviceRates rates = default_device_rates(device_options(config));
  CostModel c;
  c.compute_flops = rates.compute_flops;
  c.memory_gbps = rates.memory_gbps;
  c.link_gbps = rates.link_gbps;
  if (config.memory.link_gbps > 0) c.link_gbps = config.memory.link_gbps;
  return c;
}

PlanOptions plan_options(const Config& config) {
  PlanOptions p;
  p.policy = config.memory.policy;
  p.budget = config.memory.budget;
  p.recompute = config.memory.recompute;
  p.cost = cost_model(config);
  return p;
}

DeviceOptions device_options(const Config& config) {
  DeviceOptions d;
  d.backend = config.device.backend;
  d.memory = config.device.memory;
  d.cpu.threads = static_cast<int>(config.device.threads);
  d.cpu.link_gbps = config.device.copy_gbps;
  d.cuda.conv_tf32 = config.device.tf32;
  d.cuda.matmul_tf32 = config.device.tf32_matmul;
  d.cuda.deterministic = config.device.deterministic;
  d.cuda.algorithms = config.device.algorithms;
  // A job sharing its GPU holds only what its heap holds (Note [Device memory of a shared GPU]
  // in device/cuda/cuda_device.h).
  d.map_on_use = config.memory.share;
  d.precision = config.device.precision;
  // At most an eighth of what the plan may use. A deterministic run caps it by device.memory
  // instead of memory.budget: the limit is part of every kernel's algorithm choice (and sizes
  // cuBLAS's workspace), so runs of different budgets must see the same one (Note [One algorithm
  // per geometry per process] in device/cuda/algorithm_cache.h).
  const uint64_t budget = config.memory.budget > 0 && !config.device.deterministic
                              ? config.memory.budget
                              : config.device.memory;
  d.workspace_limit = std::min(config.memory.workspace_limit, budget / 8);
  return d;
}

std::string conv_algorithm_file(const Config& config, int rank) {
  if (!keeps_algorithm_choices(device_options(config)) || config.run.dir.empty()) return "";
  return (std::filesystem::path(config.run.dir) /
          ("conv_algorithms.rank" + std::to_string(rank) + ".txt"))
      .string();
}

OptimizerOptions optimizer_options(const Config& config) {
  OptimizerOptions o;
  o.kind = config.optim.name;
  o.momentum = static_cast<float>(config.optim.momentum);
  o.nesterov = config.optim.nesterov;
  o.weight_decay = static_cast<float>(config.optim.weight_decay);
  o.beta1 = static_cast<float>(config.optim.beta1);
  o.beta2 = static_cast<float>(config.optim.beta2);
  o.eps = static_cast<float>(config.optim.eps);
  o.decay = config.optim.decay;
  if (o.decay == WeightDecayGroups::kAuto) {
    o.decay = model_info(config.model.name).decay_matrices_only ? WeightDecayGroups::kMatrices
                                                                : WeightDecayGroups::kAll;
  }
  o.clip_norm = static_cast<float>(config.optim.clip_norm);
  return o;
}

LrSchedule lr_schedule(const Config& config) {
  LrSchedule s;
  s.kind = config.optim.schedule;
  s.base_lr = static_cast<float>(config.optim.lr);
  s.warmup_steps = config.optim.warmup_steps;
  s.step_size = config.optim.step_size;
  s.gamma = static_cast<float>(config.optim.gamma);
  s.min_lr = static_cast<float>(config.optim.min_lr);
  s.total_steps = config.run.steps;
  return s;
}

}  // namespace ferry
