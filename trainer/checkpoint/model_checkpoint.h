// Model checkpoints in safetensors: parameters and buffers under torchvision's state_dict
// names (so torch/torchvision load them), optimizer state under "optimizer.<slot>.<name>"
// (PyTorch's slot names: momentum_buffer, exp_avg, exp_avg_sq), and the training position in
// the metadata. Loading PyTorch's weights:
//   sd = safetensors.torch.load_file(path)
//   model.load_state_dict({k: v for k, v in sd.items() if not k.startswith("optimizer.")})
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/exec/parameter_store.h"
#include "trainer/model/graph.h"

namespace ferry {

// Where training stands; enough to resume exactly.
struct TrainingState {
  int64_t step = 0;   // steps completed
  int64_t epoch = 0;  // data position: the next batch to read
  int64_t batch_in_epoch = 0;
  uint64_t seed = 0;
  std::string model;  // model.name, checked on resume
  // The model's and the data's shape, config key -> value text ("model.heads" -> "4"): written
  // into the metadata and checked on resume (Note [What resume checks] in model_checkpoint.cc).
  std::map<std::string, std::string> shape;
  // load_checkpoint: the keys of `shape` an older checkpoint does not record (not checked).
  std::vector<std::string> unchecked;
};

// The optimizer's state slot names, in ParameterStore slot order.
std::vector<std::string> optimizer_slot_names(int slots, bool adamw);

// Writes `path` atomically (a crash leaves the previous file, never a half-written one).
void save_checkpoint(const std::string& path, const ParameterStore& store,
                     const std::vector<std::string>& slot_names, const TrainingState& state);

// How load_weights maps a file's tensors onto the model (Note [Every tensor accounted for]).
struct WeightsMapping {
  // A second name of a tied parameter -> the parameter's own name ("lm_head.weight" ->
  // "transformer.wte.weight"): such a tensor in a file must equal its parameter's.
  std::map<std::string, std::string> tied;
  bool ignore_unused = false;  // model.init_ignore_unused: tensors no parameter reads are skipped
};

// The tied names of `graph`: a parameter a later node reuses (GPT-2's LM head) is also called
// "<that node>.weight".
std::map<std::string, std::string> tied_weight_names(const Graph& graph);

// Loads parameters and buffers (BN statistics; counters are ignored) from `path` (a safetensors
// file, or a Hugging Face model folder: its model.safetensors or shards), under the
// model's names or, for a file without the "transformer." prefix the model's names carry,
// without it (Hugging Face's GPT2Model). Every parameter must be present with its shape, and
// every tensor of the file read (unless `mapping.ignore_unused`): DataError names what is
// missing, mismatched or unused. Returns how many tensors were skipped as unused.
size_t load_weights(const std::string& path, ParameterStore& store,
                    const WeightsMapping& mapping = {});

// load_weights plus the optimizer state and the training position, for resuming. `shape` (this
// run's, as TrainingState::shape) is checked against the checkpoint's before anything loads: a
// changed key is a ConfigError naming it and both values.
TrainingState load_checkpoint(const std::string& path, ParameterStore& store,
                              const std::vector<std::string>& slot_names,
                              const std::map<std::string, std::string>& shape = {});

}  // namespace ferry
