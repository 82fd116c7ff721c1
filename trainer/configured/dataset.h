// The config's dataset and loader, as training and evaluation open them.
#pragma once

#include <memory>

#include "device/device.h"
#include "trainer/config/config.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"

namespace ferry {

// The dataset the data.* keys describe; `evaluation`: an image folder reads data.val_path (when
// set) with the evaluation transform, a token source reads data.val_path (when set) in
// consecutive windows (training: random windows, or consecutive when data.shuffle is false).
// ConfigError when its images or classes do not fit model.input and model.classes.
std::shared_ptr<const Dataset> open_configured_dataset(const Config& config,
                                                       bool evaluation = false);

// The vocabulary every token must lie below: model.vocab resolved (the logits' width).
int64_t token_vocab(const Config& config);
// The token separating documents: data.eot_token, or model.vocab - 1 when it is -1.
int64_t end_of_text_token(const Config& config);

// The loader options the config gives, with batch buffers in the device's pinned memory.
LoaderOptions loader_options(const Config& config, Device& device);
// The same with batch buffers in plain host memory (a loader read for its shapes alone).
LoaderOptions loader_options(const Config& config);

}  // namespace ferry
