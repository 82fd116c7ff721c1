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
  std::function<TensorId(GraphBuilder&)> build;
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

Graph build_model(const std::string& name, const Shape& input_nchw, int64_t classes) {
  const Entry& entry = find(name);
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
