// The config's model as a graph: images (model.input, model.classes) or tokens (data.seq_len and
// the transformer sizes, model.layers ...). Every place that builds the configured model asks here.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/config/config.h"
#include "trainer/model/graph.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {

// model.layers, model.heads, ... as given (0 = the named model's).
TransformerSizes transformer_sizes(const Config& config);

// Tokens per row a token model is built for: model.context resolved (data.seq_len, when the
// data section gives one, is checked against it when the graph is built).
int64_t tokens_per_row(const Config& config);

// "input [3, 32, 32]" for an image model, "1024 tokens per row" for a token model.
std::string input_text(const Config& config);

// The model for `batch` rows per rank (ConfigError as build_model / build_token_model).
Graph build_configured_model(const Config& config, int64_t batch);

}  // namespace ferry
