// The zoo's registry: one entry per model name with its description and builder. The table is
// built once, in listing order; build_model never allocates tensor memory (shapes only).
#include "trainer/model/zoo/zoo.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "trainer/model/zoo/models.h"

namespace ferry {
namespace {

struct Entry {
  ModelInfo info;
  std::function<TensorId(GraphBuilder&)> build;  // image models
};

std::vector<Entry> make_registry() {
  const Shape kImageNet{3, 224, 224};
  const Shape kCifar{3, 32, 32};
  const Shape kMnist{1, 28, 28};
  std::vector<Entry> r;
  auto add = [&r](std::string name, std::string summary, Shape input, int64_t classes,
                  std::function<TensorId(GraphBuilder&)> build) {
    r.push_back({ModelInfo{std::move(name), std::move(summary), std::move(input), classes},
                 std::move(build)});
  };
  add("mlp", "MLP: flatten -> 512 -> ReLU -> 256 -> ReLU -> classes, for any input", kMnist, 10,
      zoo::build_mlp);
  add("lenet5", "LeNet-5 with ReLU and max-pool, for 28x28 (padded) or 32x32 images", kMnist, 10,
      zoo::build_lenet5);
  add("alexnet", "AlexNet, torchvision's (ImageNet, 224x224)", kImageNet, 1000,
      [](GraphBuilder& b) { return zoo::build_alexnet(b, false); });
  for (bool bn : {false, true}) {
    for (int depth : {11, 13, 16, 19}) {
      add(fmt::format("vgg{}{}", depth, bn ? "_bn" : ""),
          fmt::format("VGG-{}{}, torchvision's (ImageNet, 224x224)", depth,
                      bn ? " with batch norm" : ""),
          kImageNet, 1000,
          [depth, bn](GraphBuilder& b) { return zoo::build_vgg(b, depth, bn, false); });
    }
  }
  for (int depth : {18, 34, 50, 101, 152}) {
    add(fmt::format("resnet{}", depth),
        fmt::format("ResNet-{}, torchvision's{} (ImageNet, 224x224)", depth,
                    depth >= 50 ? " v1.5 (stride in the 3x3 conv)" : ""),
        kImageNet, 1000, [depth](GraphBuilder& b) { return zoo::build_resnet(b, depth, false); });
  }
  add("alexnet_cifar",
      "AlexNet for 32x32: 3x3 convs, 2x2 pools, classifier 1024 -> 1024 -> 1024 -> classes", kCifar,
      10, [](GraphBuilder& b) { return zoo::build_alexnet(b, true); });
  for (bool bn : {false, true}) {
    for (int depth : {11, 13, 16, 19}) {
      add(fmt::format("vgg{}{}_cifar", depth, bn ? "_bn" : ""),
          fmt::format("VGG-{}{} for 32x32: torchvision's features, classifier.0 = "
                      "Linear(512, classes)",
                      depth, bn ? " with batch norm" : ""),
          kCifar, 10, [depth, bn](GraphBuilder& b) { return zoo::build_vgg(b, depth, bn, true); });
    }
  }
  for (int depth : {18, 34, 50, 101, 152}) {
    add(fmt::format("resnet{}_cifar", depth),
        fmt::format("ResNet-{} for 32x32: 3x3 stride-1 stem, no max-pool, torchvision's names",
                    depth),
        kCifar, 10, [depth](GraphBuilder& b) { return zoo::build_resnet(b, depth, true); });
  }
  // Token models: built by build_token_model from their resolved sizes.
  const auto gpt = [&r](std::string name, TransformerSizes sizes) {
    ModelInfo info{name,
                   fmt::format("GPT-2, Hugging Face's GPT2LMHeadModel: {} layers, {} heads, width "
                               "{}, vocabulary {}, context {} (sizes: model.layers, ...)",
                               sizes.layers, sizes.heads, sizes.width, sizes.vocab, sizes.context),
                   Shape{sizes.context},
                   sizes.vocab,
                   /*tokens=*/true,
                   sizes,
                   /*decay_matrices_only=*/true,  // nanoGPT's and Hugging Face's groups
                   "GPT2LMHeadModel"};
    r.push_back({std::move(info), nullptr});
  };
  gpt("gpt2", {12, 12, 768, 50257, 1024, 0.0});
  gpt("gpt2-medium", {24, 16, 1024, 50257, 1024, 0.0});
  const auto llama = [&r](std::string name, std::string what, TransformerSizes s) {
    ModelInfo info{name,
                   fmt::format("{}, Hugging Face's LlamaForCausalLM: {} layers, {} heads ({} KV), "
                               "width {}, ffn {}, vocabulary {}, context {}, {} head",
                               what, s.layers, s.heads, s.kv_heads, s.width, s.ffn, s.vocab,
                               s.context, *s.tie_embeddings ? "tied" : "untied"),
                   Shape{s.context},
                   s.vocab,
                   /*tokens=*/true,
                   s,
                   /*decay_matrices_only=*/true,
                   "LlamaForCausalLM"};
    r.push_back({std::move(info), nullptr});
  };
  // name, layers, heads, width, vocab, context, dropout, fused attention, kv_heads, ffn,
  // rope_theta, norm_eps, tied
  llama("llama", "Llama (sizes: model.layers, model.kv_heads, model.ffn, ...)",
        {6, 6, 384, 32000, 2048, 0.0, true, 2, 1024, 10000.0, 1e-5, false});
  llama("smollm-135m", "SmolLM-135M",
        {30, 9, 576, 49152, 2048, 0.0, true, 3, 1536, 10000.0, 1e-5, true});
  llama("tinyllama-1.1b", "TinyLlama-1.1B",
        {22, 32, 2048, 32000, 2048, 0.0, true, 4, 5632, 10000.0, 1e-5, false});
  return r;
}

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = make_registry();
  return entries;
}

const Entry& find(const std::string& name) {
  for (const Entry& e : registry()) {
    if (e.info.name == name) return e;
  }
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string near = nearest(lower, zoo_names());
  throw ConfigError(
      fmt::format("unknown model '{}'{}", name,
                  near.empty() ? std::string() : fmt::format(" (did you mean '{}'?)", near)),
      fmt::format("model.name must be one of: {}", join(zoo_names(), ", ")));
}

}  // namespace

std::vector<std::string> zoo_names() {
  std::vector<std::string> names;
  names.reserve(registry().size());
  for (const Entry& e : registry()) names.push_back(e.info.name);
  return names;
}

bool zoo_has(const std::string& name) {
  return std::any_of(registry().begin(), registry().end(),
                     [&name](const Entry& e) { return e.info.name == name; });
}

const ModelInfo& model_info(const std::string& name) { return find(name).info; }

TransformerSizes resolve_sizes(const ModelInfo& model, const TransformerSizes& overrides) {
  if (!model.tokens) {
    throw ConfigError(fmt::format("model '{}' reads images, not tokens", model.name),
                      "pick a token model (gpt2, gpt2-medium) for data.source=tokens");
  }
  TransformerSizes s = model.sizes;
  const auto take = [&](int64_t value, int64_t& into, const char* key) {
    if (value < 0) {
      throw ConfigError(
          fmt::format("{} must be >= 0 (0 = {}'s value), got {}", key, model.name, value));
    }
    if (value > 0) into = value;
  };
  take(overrides.layers, s.layers, "model.layers");
  take(overrides.heads, s.heads, "model.heads");
  take(overrides.width, s.width, "model.width");
  take(overrides.vocab, s.vocab, "model.vocab");
  take(overrides.context, s.context, "model.context");
  if (!(overrides.dropout >= 0 && overrides.dropout < 1)) {
    throw ConfigError(fmt::format("model.dropout must be in [0, 1), got {}", overrides.dropout));
  }
  s.dropout = overrides.dropout;
  s.fused_attention = overrides.fused_attention;
  if (s.width % s.heads != 0) {
    throw ConfigError(
        fmt::format("model.heads ({}) must divide model.width ({})", s.heads, s.width),
        "pick a width that is a multiple of the head count");
  }
  if (!model.llama()) {
    const char* key = overrides.kv_heads          ? "model.kv_heads"
                      : overrides.ffn             ? "model.ffn"
                      : overrides.rope_theta != 0 ? "model.rope_theta"
                      : overrides.norm_eps != 0   ? "model.norm_eps"
                      : overrides.tie_embeddings  ? "model.tie_embeddings"
                                                  : nullptr;
    if (key != nullptr) {
      throw ConfigError(fmt::format("{} applies to Llama models, not '{}'", key, model.name),
                        "remove the key, or pick a Llama model (llama, smollm-135m, ...)");
    }
    return s;
  }
  take(overrides.kv_heads, s.kv_heads, "model.kv_heads");
  take(overrides.ffn, s.ffn, "model.ffn");
  if (overrides.rope_theta < 0 || overrides.norm_eps < 0) {
    throw ConfigError(
        fmt::format("model.rope_theta ({}) and model.norm_eps ({}) must be >= 0 (0 "
                    "= {}'s value)",
                    overrides.rope_theta, overrides.norm_eps, model.name));
  }
  if (overrides.rope_theta > 0) s.rope_theta = overrides.rope_theta;
  if (overrides.norm_eps > 0) s.norm_eps = overrides.norm_eps;
  if (overrides.tie_embeddings) s.tie_embeddings = overrides.tie_embeddings;
  if (overrides.heads > 0 && overrides.kv_heads == 0) s.kv_heads = s.heads;  // plain multi-head
  if (s.dropout > 0) {
    throw ConfigError(
        fmt::format("model.dropout must be 0 for '{}' (Llama has no dropout)", model.name),
        "set model.dropout=0");
  }
  if (s.heads % s.kv_heads != 0) {
    throw ConfigError(
        fmt::format("model.kv_heads ({}) must divide model.heads ({})", s.kv_heads, s.heads),
        "set model.kv_heads to a divisor of model.heads (equal to it: no grouped-query attention)");
  }
  if ((s.width / s.heads) % 2 != 0) {
    throw ConfigError(fmt::format("rotary embeddings need an even head width; model.width / "
                                  "model.heads = {} / {} = {}",
                                  s.width, s.heads, s.width / s.heads),
                      "pick model.width and model.heads so that their quotient is even");
  }
  return s;
}

Graph build_token_model(const std::string& name, int64_t batch, int64_t seq_len,
                        const TransformerSizes& sizes, bool segments) {
  const Entry& entry = find(name);
  if (!entry.info.tokens) {
    throw ConfigError(fmt::format("model '{}' takes images, not tokens", name),
                      "pick a token model (gpt2, gpt2-medium) for data.source=tokens");
  }
  const TransformerSizes s = resolve_sizes(entry.info, sizes);
  if (seq_len < 1 || seq_len > s.context) {
    throw ConfigError(
        fmt::format("data.seq_len ({}) must be in [1, model.context = {}]", seq_len, s.context),
        "lower data.seq_len or raise model.context");
  }
  GraphBuilder builder(Shape{batch, seq_len}, s.vocab, segments);
  builder.set_fused_attention(s.fused_attention);
  builder.loss(entry.info.llama() ? zoo::build_llama(builder, s) : zoo::build_gpt2(builder, s));
  return builder.finish();
}

Graph build_model(const std::string& name, const Shape& input_nchw, int64_t classes) {
  const Entry& entry = find(name);
  if (entry.info.tokens) {
    if (input_nchw.rank() != 2) {
      throw ConfigError(
          fmt::format("model '{}' takes (N, T) tokens, not {}", name, input_nchw.str()),
          "set data.source=tokens for a token model");
    }
    return build_token_model(name, input_nchw[0], input_nchw[1], {});
  }
  if (classes < 1) {
    throw ConfigError(fmt::format("model '{}' needs at least 1 class, got {}", name, classes),
                      "set model.classes to the number of labels in the dataset");
  }
  try {
    GraphBuilder builder(input_nchw, classes);
    builder.loss(entry.build(builder));
    return builder.finish();
  } catch (const ConfigError& e) {
    std::string hint = e.hint();
    if (input_nchw.rank() == 4 && zoo_has(name + "_cifar")) {
      hint = fmt::format("'{}' is made for {} inputs; use '{}_cifar' for 32x32 images", name,
                         entry.info.default_input.str(), name);
    } else if (hint.empty()) {
      hint = fmt::format("'{}' is made for {} inputs; check model.input", name,
                         entry.info.default_input.str());
    }
    throw ConfigError(
        fmt::format("model '{}' cannot take input {}: {}", name, input_nchw.str(), e.what()), hint);
  }
}

}  // namespace ferry
