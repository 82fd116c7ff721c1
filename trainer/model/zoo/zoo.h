// The model zoo: named models built as Graphs for an input shape and a class count. ImageNet
// models equal torchvision 0.14's exactly (layer shapes, parameter counts, state_dict names and
// order, initialisation rules); scripts/zoo_reference.py writes the table the tests check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/shape.h"
#include "trainer/model/graph.h"

namespace ferry {

// What `trainer info` and config validation need to know about a model without building it.
struct ModelInfo {
  std::string name;
  std::string summary;  // one line: architecture, what input it is made for, parameters
  Shape default_input;  // (C, H, W)
  int64_t default_classes = 0;
  // optim.decay=auto decays only parameters of 2+ dimensions (transformers: not biases, layer
  // norm weights); false: every parameter (the CNNs, as torchvision's recipes train them).
  bool decay_matrices_only = false;
};

// Every model name, in the order `trainer info` lists them.
std::vector<std::string> zoo_names();
bool zoo_has(const std::string& name);

// The model's description; an unknown name is a ConfigError (see build_model).
const ModelInfo& model_info(const std::string& name);

// Builds `name` for an input batch (N, C, H, W) and `classes` logits, ending in the softmax
// cross-entropy loss. Only shapes are computed: no memory is allocated for tensors.
// Errors (ConfigError): an unknown name (the message names the nearest valid one and the hint
// lists the zoo), classes < 1, or an input the model cannot take (the message names the layer).
Graph build_model(const std::string& name, const Shape& input_nchw, int64_t classes);

}  // namespace ferry
