// Building a run from its config.
#include "trainer/session/session.h"

#include "trainer/checkpoint/model_checkpoint.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/session/planning.h"

namespace ferry {

PlanOptions plan_options(const Config& config) {
  PlanOptions p;
  p.policy = config.memory.policy;
  p.budget = config.memory.budget;
  p.recompute = config.memory.recompute;
  p.cost = cost_model(config);
  return p;
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

Shape Session::input_shape(int64_t n) const {
  const auto& in = config_.model.input;
  return Shape{n, in[0], in[1], in[2]};
}

Session::Session(const Config& config, bool training) : config_(config) {
  graph_ = build_model(config.model.name, input_shape(config.data.batch_size),
                       config.model.classes);
  DeviceOptions d;
  d.backend = config.device.backend;
  d.memory = config.device.memory;
  d.threads = static_cast<int>(config.device.threads);
  d.copy_gbps = config.device.copy_gbps;
  device_ = create_device(d);
  const OptimizerOptions opt = optimizer_options(config);
  store_ = std::make_unique<ParameterStore>(*device_, graph_, training ? optimizer_slots(opt) : 0);
  store_->initialize(graph_, config.run.seed);
  if (!config.model.init_from.empty()) load_weights(config.model.init_from, *store_);
  optimizer_ = std::make_unique<Optimizer>(opt);
  const std::string name = config.model.name;
  const int64_t classes = config.model.classes;
  ExecutorOptions exec;
  exec.plan = plan_options(config);
  exec.host_limit = config.memory.host_limit;
  exec.poison = config.memory.debug_poison;
  exec.seed = config.run.seed;
  executor_ = std::make_unique<Executor>(
      *device_, *store_,
      [this, name, classes](int64_t batch) { return build_model(name, input_shape(batch), classes); },
      exec);
}

Session::~Session() = default;

std::vector<std::string> Session::optimizer_slot_names() const {
  return ferry::optimizer_slot_names(store_->optimizer_slots(),
                                     config_.optim.name == OptimizerKind::kAdamW);
}

}  // namespace ferry
