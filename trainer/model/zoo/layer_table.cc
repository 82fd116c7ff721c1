// Rendering a Graph as a layer table, text or JSON, from one list of rows so both agree.
#include "trainer/model/zoo/layer_table.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace ferry {
namespace {

struct Row {
  std::string name;
  std::string kind;
  std::string detail;
  Shape output;
  int64_t parameters = 0;
};

// Every node but the loss, in schedule order.
std::vector<Row> rows_of(const Graph& graph) {
  std::vector<Row> rows;
  rows.reserve(graph.nodes().size());
  std::vector<bool> counted(graph.tensors().size(), false);  // a tied weight counts once
  for (const Node& node : graph.nodes()) {
    if (!node.outputs.empty() && node.outputs[0] == graph.loss()) continue;
    Row row{node.name, std::string(node.op->kind()), node.op->describe(), {}, 0};
    if (!node.outputs.empty()) row.output = graph.tensor(node.outputs[0]).desc.shape;
    for (TensorId p : node.params) {
      if (counted[static_cast<size_t>(p)]) continue;
      counted[static_cast<size_t>(p)] = true;
      row.parameters += graph.tensor(p).desc.shape.numel();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

std::string group_thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string layer_table(const Graph& graph, const std::string& model) {
  const std::vector<Row> rows = rows_of(graph);
  size_t wn = 5, wk = 4, wd = 6, wo = 6, wp = 6;
  std::vector<std::string> outputs, params;
  for (const Row& r : rows) {
    outputs.push_back(r.output.str());
    params.push_back(r.parameters ? group_thousands(r.parameters) : "-");
    wn = std::max(wn, r.name.size());
    wk = std::max(wk, r.kind.size());
    wd = std::max(wd, r.detail.size());
    wo = std::max(wo, outputs.back().size());
    wp = std::max(wp, params.back().size());
  }
  std::string out = fmt::format("model {}: input {}, {} classes\n", model,
                                graph.tensor(graph.input()).desc.shape.str(),
                                graph.tensor(graph.logits()).desc.shape[1]);
  out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {:>{}}\n", "layer", wn, "kind", wk, "detail",
                     wd, "output", wo, "params", wp);
  for (size_t i = 0; i < rows.size(); ++i) {
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {:>{}}\n", rows[i].name, wn, rows[i].kind,
                       wk, rows[i].detail, wd, outputs[i], wo, params[i], wp);
  }
  out += fmt::format("total parameters: {}\n", group_thousands(graph.parameter_count()));
  return out;
}

nlohmann::json layer_table_json(const Graph& graph, const std::string& model) {
  nlohmann::json layers = nlohmann::json::array();
  for (const Row& r : rows_of(graph)) {
    layers.push_back({{"name", r.name},
                      {"kind", r.kind},
                      {"detail", r.detail},
                      {"output", r.output.dims()},
                      {"parameters", r.parameters}});
  }
  return {{"model", model},
          {"input", graph.tensor(graph.input()).desc.shape.dims()},
          {"classes", graph.tensor(graph.logits()).desc.shape[1]},
          {"parameters", graph.parameter_count()},
          {"layers", std::move(layers)}};
}

}  // namespace ferry
