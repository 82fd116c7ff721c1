// The input shapes a config's training draws and how often (a shape schedule): what `trainer
// simulate` averages its step over. Invariant: shapes are distinct, in the order first given,
// and their weights are positive and sum to 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/shape.h"
#include "trainer/config/config.h"

namespace ferry {

struct ScheduledShape {
  Shape input;        // (N, C, S, S) images or (N, T) tokens, N = data.batch_size
  int64_t size = 0;   // the image side S, or the tokens per row T
  double weight = 0;  // the fraction of training steps drawn at this shape
};

struct ShapeSchedule {
  std::vector<ScheduledShape> shapes;
  std::string source;  // where it comes from, in words
  // The shape of the largest input (the most elements; the first on a tie).
  const ScheduledShape& largest() const;
};

// What the config's loader draws (Note [Where a shape schedule comes from]): the sides of
// data.scales, each weighted by how often the loader draws it; the lengths of data.documents'
// padded batches over the first epoch of a job of `world_size` ranks; else the configured input
// alone. DataError/ConfigError as training's loader for a documents source it cannot open.
ShapeSchedule shape_schedule(const Config& config, int world_size = 1);

// A schedule given as text, `SIZE[:WEIGHT],...` (weights default to 1 and are normalised):
// image sides of the config's model, or tokens per row of a token model (at most its
// data.seq_len). ConfigError naming `what` (the option or key) for a malformed entry.
ShapeSchedule parse_shape_schedule(const Config& config, const std::string& text,
                                   const std::string& what);

}  // namespace ferry
