// Hugging Face model folders as model.* keys: model.init_from naming a directory reads its
// config.json, whose architecture names the model (LlamaForCausalLM: llama, GPT2LMHeadModel:
// gpt2) and whose fields give its sizes. Invariant: a key the user set agrees with the folder or
// the config is refused; the weights themselves are read by trainer/checkpoint/hf_folder.h.
#pragma once

#include <functional>
#include <string>

#include "trainer/config/config.h"

namespace ferry {

// The Hugging Face architectures ferry trains, as config.json's "architectures" spells them.
inline constexpr const char* kLlamaArchitecture = "LlamaForCausalLM";
inline constexpr const char* kGpt2Architecture = "GPT2LMHeadModel";

// Whether model.init_from names a directory (a model folder) rather than a weights file.
bool is_model_folder(const std::string& path);

// Sets c.model's name and sizes from `dir`/config.json. `given_at(key)` says where the user gave
// a key (" (FILE:LINE)"), or "" for a key left at its default: a given key whose value differs
// from the folder's is one ConfigError naming both values. ConfigError also for a missing or
// malformed config.json, an architecture ferry does not train (naming it and the supported
// ones), a missing field, or a feature ferry's model lacks (biases, rope scaling, ...).
void apply_model_folder(Config& c, const std::string& dir,
                        const std::function<std::string(const std::string&)>& given_at);

}  // namespace ferry
