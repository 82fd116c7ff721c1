// The explicit model dump format (`ferry_topology_model: 1`), private to topology/: reading it
// back into TopologyData. dump_model_yaml (synthetic.h) writes it. Invariant: dump then read
// reproduces every field Topology validates and derives from.
#pragma once

#include <yaml-cpp/yaml.h>

#include "topology/model.h"
#include "topology/yaml_reader.h"

namespace ferry {

inline constexpr int kModelYamlVersion = 1;

TopologyData read_model_yaml(const yaml::Reader& reader, const YAML::Node& root);

}  // namespace ferry
