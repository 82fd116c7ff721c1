// Model checkpoints in safetensors: parameters and buffers under torchvision's state_dict
// names (so torch/torchvision load them), optimizer state under "optimizer.<slot>.<name>"
// (PyTorch's slot names: momentum_buffer, exp_avg, exp_avg_sq), and the training position in
// the metadata. Loading PyTorch's weights:
//   sd = safetensors.torch.load_file(path)
//   model.load_state_dict({k: v for k, v in sd.items() if not k.startswith("optimizer.")})
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/exec/parameter_store.h"

namespace ferry {

// Where training stands; enough to resume exactly.
struct TrainingState {
  int64_t step = 0;   // steps completed
  int64_t epoch = 0;  // data position: the next batch to read
  int64_t batch_in_epoch = 0;
  uint64_t seed = 0;
  std::string model;  // model.name, checked on resume
};

// The optimizer's state slot names, in ParameterStore slot order.
std::vector<std::string> optimizer_slot_names(int slots, bool adamw);

// Writes `path` atomically (a crash leaves the previous file, never a half-written one).
void save_checkpoint(const std::string& path, const ParameterStore& store,
                     const std::vector<std::string>& slot_names, const TrainingState& state);

// Loads parameters and buffers (BN statistics; counters are ignored) from `path`. Every
// parameter must be present with its shape; DataError names what is missing or mismatched.
void load_weights(const std::string& path, ParameterStore& store);

// load_weights plus the optimizer state and the training position, for resuming.
TrainingState load_checkpoint(const std::string& path, ParameterStore& store,
                              const std::vector<std::string>& slot_names);

}  // namespace ferry
