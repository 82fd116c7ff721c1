// The model zoo: named models built as Graphs for an input shape and a class count. ImageNet
// models equal torchvision 0.14's exactly (layer shapes, parameter counts, state_dict names and
// order, initialisation rules); scripts/zoo_reference.py writes the table the tests check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "device/shape.h"
#include "trainer/model/graph.h"

namespace ferry {

// A transformer's sizes (model.layers, model.heads, ...); 0 = the named model's value.
struct TransformerSizes {
  int64_t layers = 0, heads = 0, width = 0, vocab = 0, context = 0;
  double dropout = 0;           // embedding, attention and residual dropout
  bool fused_attention = true;  // model.attention: fused (true) or naive
  // Llama family (0 or unset = the named model's): key-value heads of grouped-query attention,
  // the SwiGLU MLP's width, the rotary base, RMSNorm's eps, and whether the LM head is tied.
  int64_t kv_heads = 0, ffn = 0;
  double rope_theta = 0, norm_eps = 0;
  std::optional<bool> tie_embeddings;
  bool operator==(const TransformerSizes&) const = default;
};

// What `trainer info` and config validation need to know about a model without building it.
struct ModelInfo {
  std::string name;
  std::string summary;          // one line: architecture, what input it is made for, parameters
  Shape default_input;          // (C, H, W); for a token model (T): its context
  int64_t default_classes = 0;  // a token model: its vocabulary
  bool tokens = false;          // takes (N, T) int32 tokens, predicts the next token everywhere
  TransformerSizes sizes;       // a token model's named sizes
  // optim.decay=auto decays only parameters of 2+ dimensions (transformers: not biases, layer
  // norm weights); false: every parameter (the CNNs, as torchvision's recipes train them).
  bool decay_matrices_only = false;
  // Hugging Face's class for a token model ("GPT2LMHeadModel", "LlamaForCausalLM"); "" otherwise.
  std::string architecture;
  bool llama() const { return architecture == "LlamaForCausalLM"; }
};

// `overrides` with each 0 replaced by the named model's size. ConfigError for an image model, a
// negative size, heads that do not divide the width, or a dropout outside [0, 1); for a Llama,
// kv_heads that do not divide heads or an odd head width; for GPT-2, a Llama-only size set.
TransformerSizes resolve_sizes(const ModelInfo& model, const TransformerSizes& overrides);

// Every model name, in the order `trainer info` lists them.
std::vector<std::string> zoo_names();
bool zoo_has(const std::string& name);

// The model's description; an unknown name is a ConfigError (see build_model).
const ModelInfo& model_info(const std::string& name);

// Builds `name` for an input batch (N, C, H, W) and `classes` logits, ending in the softmax
// cross-entropy loss. Only shapes are computed: no memory is allocated for tensors.
// Errors (ConfigError): an unknown name (the message names the nearest valid one and the hint
// lists the zoo), classes < 1, or an input the model cannot take (the message names the layer).
Graph build_model(const std::string& name, const Shape& input_nchw, int64_t classes);

// Builds the token model `name` (ModelInfo::tokens) for a batch of `batch` rows of `seq_len`
// tokens, with `sizes` resolved against the named model (resolve_sizes); `segments`: rows of
// packed documents, whose segment starts are a third input (data.pack; GraphBuilder).
// ConfigError for a seq_len above the context, heads that do not divide the width, or a
// non-token model.
Graph build_token_model(const std::string& name, int64_t batch, int64_t seq_len,
                        const TransformerSizes& sizes, bool segments = false);

}  // namespace ferry
