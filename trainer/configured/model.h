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

// The token model's sizes, each 0 replaced by the named model's (resolve_sizes).
TransformerSizes resolved_sizes(const Config& config);

// Tokens per row a token model reads: data.seq_len, or model.context when it is 0 (ConfigError
// naming both keys when it exceeds the context: check_seq_len).
int64_t tokens_per_row(const Config& config);

// "input [3, 32, 32]" for an image model, "1024 tokens per row" for a token model.
std::string input_text(const Config& config);

// The model for `batch` rows per rank (ConfigError as build_model / build_token_model, or
// when the model reads tokens and data.source is not tokens, or the other way round).
Graph build_configured_model(const Config& config, int64_t batch);

// The model for a full input shape: (N, C, H, W) images (data.scales: another side than
// model.input's) or (N, T) tokens. ConfigError as above, and naming data.scales when the model
// cannot take the shape.
Graph build_configured_model(const Config& config, const Shape& input);

// The input shape of a batch of `batch` rows at image side `side` (0: model.input's H and W).
Shape configured_input(const Config& config, int64_t batch, int64_t side = 0);

// The largest input a full training batch takes: (data.batch_size, C, S, S) with S the largest
// side of data.scales, else the configured input (a token model: data.seq_len tokens per row).
Shape largest_input(const Config& config);

}  // namespace ferry
