// `trainer info`: the zoo, or one model's layer table.
#include <cstdio>

#include <fmt/format.h>

#include "common/file_write.h"
#include "common/strings.h"
#include "trainer/cli/commands.h"
#include "trainer/model/zoo/layer_table.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {

int report_error(const Error& e, int code) {
  std::fprintf(stderr, "error: %s\n", e.what());
  if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
  return code;
}

namespace {

void print_table(const Graph& graph, const InfoArgs& args) {
  if (args.json) {
    std::printf("%s\n", layer_table_json(graph, args.model).dump(2).c_str());
  } else {
    std::printf("%s", layer_table(graph, args.model).c_str());
  }
  check_stdout();
}

}  // namespace

int run_info(const InfoArgs& args) {
  if (args.model.empty()) {
    for (const auto& name : zoo_names()) {
      const ModelInfo& m = model_info(name);
      std::printf("%-18s %s\n", name.c_str(), m.summary.c_str());
    }
    return 0;
  }
  const ModelInfo& m = model_info(args.model);
  if (m.tokens) {
    if (!args.input.empty()) {
      throw ConfigError(
          fmt::format("--input is C,H,W for image models; '{}' takes tokens", args.model));
    }
    print_table(build_token_model(args.model, 1, m.sizes.context, {}), args);
    return 0;
  }
  Shape chw = m.default_input;
  if (!args.input.empty()) {
    const auto parts = split(args.input, ',');
    if (parts.size() != 3) {
      throw ConfigError(fmt::format("--input must be C,H,W, got '{}'", args.input));
    }
    for (size_t i = 0; i < 3; ++i) {
      try {
        chw[i] = std::stoll(parts[i]);
      } catch (const std::exception&) {
        throw ConfigError(fmt::format("--input must be C,H,W integers, got '{}'", args.input));
      }
      if (chw[i] < 1)
        throw ConfigError(fmt::format("--input sizes must be >= 1, got '{}'", args.input));
    }
  }
  const int64_t classes = args.classes > 0 ? args.classes : m.default_classes;
  print_table(build_model(args.model, Shape{1, chw[0], chw[1], chw[2]}, classes), args);
  return 0;
}

}  // namespace ferry
