// The layer table `trainer info` prints: one row per node up to the logits (the loss is not a
// layer), with its kind, hyper-parameters, output shape and parameter count. The rows'
// parameter counts add up to Graph::parameter_count().
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "trainer/model/graph.h"

namespace ferry {

// A fixed-width text table, ending with the input shape and the total parameter count:
//   layer            kind         detail            output               params
//   conv1            conv2d       7x7 s2 p3, 3->64  (1, 64, 112, 112)     9,408
std::string layer_table(const Graph& graph, const std::string& model);

// {"model": model, "input": [N, C, H, W], "classes": K, "parameters": N,
//  "layers": [{"name", "kind", "detail", "output": [...], "parameters": n}, ...]}
nlohmann::json layer_table_json(const Graph& graph, const std::string& model);

// 25557032 -> "25,557,032".
std::string group_thousands(int64_t n);

}  // namespace ferry
