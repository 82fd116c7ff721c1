// Hugging Face model folders, the file side: the weights of a folder (model.safetensors, or the
// shards model.safetensors.index.json names) for model.init_from, and a folder written from a
// ferry checkpoint (config.json + model.safetensors) that transformers' from_pretrained loads.
// The config side (config.json -> model.* keys) is trainer/config/model_folder.h.
#pragma once

#include <string>
#include <vector>

#include "trainer/checkpoint/safetensors.h"

namespace ferry {

// The weight files of folder `dir`: model.safetensors, else every shard named by
// model.safetensors.index.json (each once, in index order). DataError naming the folder when
// neither exists, a shard is missing, the index is malformed, or a tensor the index places in a
// shard is not there.
std::vector<SafetensorsFile> read_folder_weights(const std::string& dir);

// Writes `out_dir` (created if needed) from a ferry checkpoint: config.json for the model its
// metadata names (LlamaForCausalLM or GPT2LMHeadModel, sizes from the recorded model.* keys) and
// model.safetensors with every model tensor (no optimizer state; metadata format "pt"), plus the
// tokenizer files found in `tokenizer_dir` ("" = none). Returns the files written. ConfigError
// for a checkpoint of an image model or one that predates the recorded sizes.
std::vector<std::string> export_model_folder(const std::string& checkpoint,
                                             const std::string& out_dir,
                                             const std::string& tokenizer_dir = "");

}  // namespace ferry
