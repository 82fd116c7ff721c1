// Building the configured model, images or tokens.
#include "trainer/configured/model.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "trainer/model/precision.h"

namespace ferry {

TransformerSizes transformer_sizes(const Config& config) {
  const ModelConfig& m = config.model;
  return TransformerSizes{m.layers, m.heads, m.width, m.vocab, m.context, m.dropout};
}

TransformerSizes resolved_sizes(const Config& config) {
  return resolve_sizes(model_info(config.model.name), transformer_sizes(config));
}

int64_t tokens_per_row(const Config& config) {
  return check_seq_len(config.data.seq_len, resolved_sizes(config).context);
}

std::string input_text(const Config& config) {
  if (model_info(config.model.name).tokens) {
    if (config.data.pack) {
      return fmt::format("{} tokens per row of packed documents", tokens_per_row(config));
    }
    if (config.data.documents) {
      return fmt::format(
          "one document per row, padded per batch to a multiple of {} tokens, at "
          "most {}",
          std::min(config.data.len_bucket, tokens_per_row(config)), tokens_per_row(config));
    }
    return fmt::format("{} tokens per row", tokens_per_row(config));
  }
  if (!config.data.scales.empty()) {
    return fmt::format("input [{}, side per batch from data.scales [{}]]", config.model.input[0],
                       fmt::join(config.data.scales, ", "));
  }
  return fmt::format("input [{}]", fmt::join(config.model.input, ", "));
}

Shape configured_input(const Config& config, int64_t batch, int64_t side) {
  if (model_info(config.model.name).tokens) return Shape{batch, tokens_per_row(config)};
  const auto& in = config.model.input;
  return Shape{batch, in[0], side > 0 ? side : in[1], side > 0 ? side : in[2]};
}

Shape largest_input(const Config& config) {
  const std::vector<int64_t>& scales = config.data.scales;
  const int64_t side = scales.empty() ? 0 : *std::max_element(scales.begin(), scales.end());
  return configured_input(config, config.data.batch_size, side);
}

// The zoo's graph for the config, every float tensor fp32; build_configured_model applies
// device.precision to it.
static Graph build_fp32_model(const Config& config, int64_t batch);

static Graph build_fp32_model(const Config& config, const Shape& input) {
  if (input == configured_input(config, input[0])) return build_fp32_model(config, input[0]);
  if (model_info(config.model.name).tokens) {
    return build_token_model(config.model.name, input[0], input[1], transformer_sizes(config),
                             config.data.pack);
  }
  const char* hint = "give sides the model accepts (data.scales), or set data.scales=[]";
  Graph g;
  try {
    g = build_model(config.model.name, input, config.model.classes);
  } catch (const Error& e) {
    throw ConfigError(fmt::format("data.scales: model '{}' cannot take input {}: {}",
                                  config.model.name, input.str(), e.what()),
                      hint);
  }
  // Every shape trains the same parameters: a model whose weights depend on the side (a fully
  // connected layer after the convolutions, as in lenet5) cannot change it.
  const Graph configured = build_fp32_model(config, input[0]);
  const bool same = g.params().size() == configured.params().size() &&
                    std::equal(g.params().begin(), g.params().end(), configured.params().begin(),
                               [&](TensorId a, TensorId b) {
                                 return g.tensor(a).name == configured.tensor(b).name &&
                                        g.tensor(a).desc == configured.tensor(b).desc;
                               });
  if (!same) {
    throw ConfigError(
        fmt::format("data.scales: model '{}' at input {} has other parameter "
                    "shapes than at model.input [{}]: its weights depend on the "
                    "image side",
                    config.model.name, input.str(), fmt::join(config.model.input, ", ")),
        "use a model with global pooling before its classifier (resnet18_cifar, "
        "resnet50), or set data.scales=[]");
  }
  return g;
}

static Graph build_fp32_model(const Config& config, int64_t batch) {
  const ModelInfo& info = model_info(config.model.name);
  if (info.tokens != (config.data.source == DataSource::kTokens)) {
    throw ConfigError(
        info.tokens
            ? fmt::format("model '{}' reads tokens, but data.source is {}", config.model.name,
                          to_string(config.data.source))
            : fmt::format("model '{}' reads images, but data.source is tokens", config.model.name),
        info.tokens ? "set data.source=tokens and data.path to a token file "
                      "(scripts/prepare_tokens.py makes one)"
                    : "pick a token model (gpt2, gpt2-medium) for data.source=tokens");
  }
  if (info.tokens) {
    return build_token_model(config.model.name, batch, tokens_per_row(config),
                             transformer_sizes(config), config.data.pack);
  }
  const auto& in = config.model.input;
  return build_model(config.model.name, Shape{batch, in[0], in[1], in[2]}, config.model.classes);
}

Graph build_configured_model(const Config& config, const Shape& input) {
  Graph g = build_fp32_model(config, input);
  apply_precision(g, config.device.precision);  // Note [Which tensors are bf16]
  return g;
}

Graph build_configured_model(const Config& config, int64_t batch) {
  Graph g = build_fp32_model(config, batch);
  apply_precision(g, config.device.precision);
  return g;
}

}  // namespace ferry
