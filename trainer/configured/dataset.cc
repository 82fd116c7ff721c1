// Opening the configured dataset and loader (shared by train and eval).
#include "trainer/configured/dataset.h"

#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/configured/model.h"

namespace ferry {

namespace fs = std::filesystem;

int64_t token_vocab(const Config& config) { return resolved_sizes(config).vocab; }

int64_t end_of_text_token(const Config& config) {
  return config.data.eot_token >= 0 ? config.data.eot_token : token_vocab(config) - 1;
}

namespace {

// Token windows of data.seq_len (Note [Token windows] in trainer/data/dataset.h), or documents
// (Note [Documents as rows] in trainer/data/documents.h).
std::shared_ptr<const Dataset> open_token_dataset(const Config& config, bool evaluation) {
  DatasetSpec spec;
  spec.source = "tokens";
  spec.path = evaluation && !config.data.val_path.empty() ? config.data.val_path : config.data.path;
  spec.seq_len = tokens_per_row(config);
  spec.classes = token_vocab(config);
  spec.documents = config.data.documents;
  spec.pack = config.data.pack;
  spec.eot = end_of_text_token(config);
  spec.augment = !evaluation && config.data.shuffle;
  spec.seed = config.data.seed >= 0 ? static_cast<uint64_t>(config.data.seed) : config.run.seed;
  return open_dataset(spec);
}

}  // namespace

std::shared_ptr<const Dataset> open_configured_dataset(const Config& config, bool evaluation) {
  if (config.data.source == DataSource::kTokens) return open_token_dataset(config, evaluation);
  DatasetSpec spec;
  spec.source = std::string(to_string(config.data.source));
  spec.path = config.data.path;
  if (evaluation && config.data.source == DataSource::kImageFolder &&
      !config.data.val_path.empty()) {
    spec.path = config.data.val_path;
    if (!fs::is_directory(spec.path)) {
      throw ConfigError(fmt::format("data.val_path: '{}' is not a folder", spec.path),
                        "set data.val_path to the evaluation image folder, or \"\" to evaluate on "
                        "data.path");
    }
  }
  spec.augment = !evaluation;
  spec.resize = config.data.resize;
  spec.skip_bad = config.data.skip_bad;
  spec.labels_path = config.data.labels;
  spec.image_shape = Shape{config.model.input[0], config.model.input[1], config.model.input[2]};
  spec.classes = config.model.classes;
  spec.samples = config.data.samples;
  spec.seed = config.data.seed >= 0 ? static_cast<uint64_t>(config.data.seed) : config.run.seed;
  std::shared_ptr<const Dataset> dataset = open_dataset(spec);
  if (dataset->image_shape() != spec.image_shape) {
    throw ConfigError(fmt::format("the dataset's images are {} but model.input is [{}, {}, {}]",
                                  dataset->image_shape().str(), config.model.input[0],
                                  config.model.input[1], config.model.input[2]),
                      "set model.input to the dataset's (C, H, W)");
  }
  if (dataset->classes() > config.model.classes) {
    throw ConfigError(fmt::format("the dataset has {} classes but model.classes is {}",
                                  dataset->classes(), config.model.classes),
                      fmt::format("set model.classes={} (or more)", dataset->classes()));
  }
  return dataset;
}

LoaderOptions loader_options(const Config& config, Device& device) {
  LoaderOptions o = loader_options(config);
  o.allocator = &device.pinned();
  return o;
}

LoaderOptions loader_options(const Config& config) {
  LoaderOptions o;
  o.batch_size = config.data.batch_size;
  o.shuffle = config.data.shuffle;
  o.seed = config.run.seed;
  o.mean.assign(config.data.mean.begin(), config.data.mean.end());
  o.stddev.assign(config.data.std.begin(), config.data.std.end());
  o.drop_last = config.data.drop_last;
  o.workers = static_cast<int>(config.data.workers);
  o.len_bucket = config.data.len_bucket;
  return o;
}

}  // namespace ferry
