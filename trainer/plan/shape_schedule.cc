// Shape schedules: from the config's data keys, or from text.
#include "trainer/plan/shape_schedule.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/strings.h"
#include "trainer/configured/dataset.h"
#include "trainer/configured/model.h"
#include "trainer/data/loader.h"

namespace ferry {

namespace {

// Weights normalised to sum to 1, repeated sizes merged (in the order first given).
ShapeSchedule normalised(const Config& config, const std::vector<std::pair<int64_t, double>>& raw,
                         std::string source) {
  ShapeSchedule out;
  out.source = std::move(source);
  const bool tokens = model_info(config.model.name).tokens;
  double total = 0;
  for (const auto& [size, weight] : raw) total += weight;
  for (const auto& [size, weight] : raw) {
    auto it = std::find_if(out.shapes.begin(), out.shapes.end(),
                           [&](const ScheduledShape& s) { return s.size == size; });
    if (it == out.shapes.end()) {
      const Shape input = tokens ? Shape{config.data.batch_size, size}
                                 : configured_input(config, config.data.batch_size, size);
      it = out.shapes.insert(out.shapes.end(), ScheduledShape{input, size, 0.0});
    }
    it->weight += weight / total;
  }
  return out;
}

}  // namespace

const ScheduledShape& ShapeSchedule::largest() const {
  FERRY_ASSERT(!shapes.empty(), "an empty shape schedule");
  return *std::max_element(shapes.begin(), shapes.end(),
                           [](const ScheduledShape& a, const ScheduledShape& b) {
                             return a.input.numel() < b.input.numel();
                           });
}

// Note [Where a shape schedule comes from]
// The loader draws the side of each global batch as data.scales[hash(seed, epoch, batch) mod n]
// (Note [Per-batch sides] in trainer/data/loader.h): every entry of the list equally often, so a
// side's weight is its count in the list over the list's length (a side listed twice is drawn
// twice as often). Documents padded per batch (data.documents without data.pack; Note [Documents
// as rows] in trainer/data/documents.h) take the length the loader gives each global batch of
// the first epoch (its longest document rounded up to data.len_bucket): each length weighted by
// the fraction of those batches padded to it. The global batch spans every rank, so the lengths
// depend on the job's ranks. Packed rows keep data.seq_len. Otherwise every step has the
// configured input.
ShapeSchedule shape_schedule(const Config& config, int world_size) {
  if (config.data.documents && !config.data.pack) {
    LoaderOptions lo = loader_options(config);
    lo.world_size = world_size;
    lo.drop_last = true;  // every rank takes part in every step, as in training
    lo.workers = 1;
    lo.prefetch = 1;
    const DataLoader loader(open_configured_dataset(config), lo);
    std::vector<std::pair<int64_t, double>> raw;
    for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      raw.emplace_back(loader.length(LoaderPosition{0, b}), 1.0);
    }
    // Shortest first, for the per-shape table.
    std::stable_sort(raw.begin(), raw.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    return normalised(
        config, raw,
        fmt::format("data.documents: the {} global batches of epoch 0 ({} x {} rows), "
                    "padded to data.len_bucket {}",
                    loader.batches_per_epoch(), world_size, config.data.batch_size,
                    config.data.len_bucket));
  }
  const std::vector<int64_t>& scales = config.data.scales;
  if (!scales.empty() && !model_info(config.model.name).tokens) {
    std::vector<std::pair<int64_t, double>> raw;
    for (int64_t side : scales) raw.emplace_back(side, 1.0);
    return normalised(
        config, raw,
        fmt::format("data.scales [{}], each entry drawn equally often", fmt::join(scales, ", ")));
  }
  const Shape input = configured_input(config, config.data.batch_size);
  ShapeSchedule out;
  out.source = "the configured input";
  out.shapes.push_back({input, input[input.rank() - 1], 1.0});
  return out;
}

ShapeSchedule parse_shape_schedule(const Config& config, const std::string& text,
                                   const std::string& what) {
  const bool tokens = model_info(config.model.name).tokens;
  const int64_t most = tokens ? tokens_per_row(config) : 16384;
  const std::string form = fmt::format(
      "give SIZE[:WEIGHT] entries separated by commas, e.g. {}: {} from 1 to {}, "
      "weights > 0 (default 1)",
      tokens ? "256:3,512:2,1024" : "160:1,224:2,288:1", tokens ? "tokens per row" : "image sides",
      most);
  std::vector<std::pair<int64_t, double>> raw;
  for (const std::string& entry : split(text, ',')) {
    const std::vector<std::string> parts = split(entry, ':');
    const auto size = parts.empty() ? std::nullopt : parse_digits<int64_t>(parts[0]);
    double weight = 1;
    bool good = size && *size >= 1 && *size <= most && parts.size() <= 2;
    if (good && parts.size() == 2) {
      errno = 0;
      char* end = nullptr;
      weight = std::strtod(parts[1].c_str(), &end);
      good = !parts[1].empty() && end == parts[1].c_str() + parts[1].size() && errno == 0 &&
             std::isfinite(weight) && weight > 0;
    }
    if (!good) {
      throw ConfigError(
          fmt::format("{}: bad entry '{}' in '{}'", what, printable(entry), printable(text)), form);
    }
    raw.emplace_back(*size, weight);
  }
  if (raw.empty()) throw ConfigError(fmt::format("{}: must not be empty", what), form);
  // Each weight is finite, but their sum must be too: normalising by an infinite sum would give
  // every shape weight 0 and the schedule a mean step of 0.
  double sum = 0;
  for (const auto& [size, weight] : raw) sum += weight;
  if (!std::isfinite(sum)) {
    throw ConfigError(fmt::format("{}: the weights in '{}' sum to more than a double holds", what,
                                  printable(text)),
                      "weights are relative: scale them down, e.g. 1:3,2:1");
  }
  return normalised(config, raw, fmt::format("{} {}", what, text));
}

}  // namespace ferry
