// A Session is the composition root of a run: from a resolved Config it creates the device,
// the model (graphs per input shape), the persistent memory, the optimizer and the executor,
// and prints what it built. The train and eval loops (train.cc, evaluate.cc) drive it.
#pragma once

#include <memory>
#include <string>

#include "device/device.h"
#include "trainer/config/config.h"
#include "trainer/exec/executor.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/graph.h"
#include "trainer/optim/optimizer.h"

namespace ferry {

class Session {
 public:
  // Builds everything; `training` selects whether optimizer state is allocated.
  Session(const Config& config, bool training);
  ~Session();

  const Config& config() const { return config_; }
  Device& device() { return *device_; }
  ParameterStore& store() { return *store_; }
  Executor& executor() { return *executor_; }
  Optimizer& optimizer() { return *optimizer_; }
  // The graph at the configured batch size (layer names, parameter list).
  const Graph& graph() const { return graph_; }
  std::vector<std::string> optimizer_slot_names() const;
  // The input shape (N, C, H, W) of a batch of n samples.
  Shape input_shape(int64_t n) const;

 private:
  Config config_;
  std::unique_ptr<Device> device_;
  Graph graph_;
  std::unique_ptr<ParameterStore> store_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Executor> executor_;
};

// Maps the config's memory.* keys to planner options.
PlanOptions plan_options(const Config& config);
OptimizerOptions optimizer_options(const Config& config);
LrSchedule lr_schedule(const Config& config);

}  // namespace ferry
