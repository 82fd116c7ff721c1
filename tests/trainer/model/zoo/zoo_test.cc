// The zoo's API: names, defaults, the documented parameter counts (torchvision's from the issue,
// ours for the CIFAR and small models), initialisers, residual wiring, errors, build speed and
// the layer table. Parity with PyTorch itself is in zoo_parity_test.cc.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "trainer/model/zoo/layer_table.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

const Node& node(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes()) {
    if (n.name == name) return n;
  }
  throw std::runtime_error("no node " + name);
}

TensorId tensor_named(const Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.tensors().size(); ++i) {
    if (g.tensors()[i].name == name) return static_cast<TensorId>(i);
  }
  throw std::runtime_error("no tensor " + name);
}

Shape out_shape(const Graph& g, const std::string& node_name) {
  return g.tensor(node(g, node_name).outputs[0]).desc.shape;
}

TEST(Zoo, ListsEveryModelInOrder) {
  const std::vector<std::string> expected{"mlp",
                                          "lenet5",
                                          "alexnet",
                                          "vgg11",
                                          "vgg13",
                                          "vgg16",
                                          "vgg19",
                                          "vgg11_bn",
                                          "vgg13_bn",
                                          "vgg16_bn",
                                          "vgg19_bn",
                                          "resnet18",
                                          "resnet34",
                                          "resnet50",
                                          "resnet101",
                                          "resnet152",
                                          "alexnet_cifar",
                                          "vgg11_cifar",
                                          "vgg13_cifar",
                                          "vgg16_cifar",
                                          "vgg19_cifar",
                                          "vgg11_bn_cifar",
                                          "vgg13_bn_cifar",
                                          "vgg16_bn_cifar",
                                          "vgg19_bn_cifar",
                                          "resnet18_cifar",
                                          "resnet34_cifar",
                                          "resnet50_cifar",
                                          "resnet101_cifar",
                                          "resnet152_cifar",
                                          "gpt2",
                                          "gpt2-medium",
                                          "llama",
                                          "smollm-135m",
                                          "tinyllama-1.1b"};
  EXPECT_EQ(zoo_names(), expected);
  for (const std::string& name : expected) EXPECT_TRUE(zoo_has(name)) << name;
  EXPECT_FALSE(zoo_has("resnet"));
  EXPECT_FALSE(zoo_has("ResNet18"));
}

TEST(Zoo, ModelInfoDefaults) {
  EXPECT_EQ(model_info("resnet50").default_input, (Shape{3, 224, 224}));
  EXPECT_EQ(model_info("resnet50").default_classes, 1000);
  EXPECT_EQ(model_info("vgg11_cifar").default_input, (Shape{3, 32, 32}));
  EXPECT_EQ(model_info("vgg11_cifar").default_classes, 10);
  EXPECT_EQ(model_info("lenet5").default_input, (Shape{1, 28, 28}));
  EXPECT_EQ(model_info("mlp").default_classes, 10);
  for (const std::string& name : zoo_names()) {
    EXPECT_EQ(model_info(name).name, name);
    EXPECT_FALSE(model_info(name).summary.empty()) << name;
  }
  EXPECT_NE(model_info("resnet50").summary.find("v1.5"), std::string::npos);
}

// The four numbers the issue states, independent of the fixture.
TEST(Zoo, TorchvisionParameterCounts) {
  const Shape imagenet{1, 3, 224, 224};
  EXPECT_EQ(build_model("resnet50", imagenet, 1000).parameter_count(), 25'557'032);
  EXPECT_EQ(build_model("vgg16", imagenet, 1000).parameter_count(), 138'357'544);
  EXPECT_EQ(build_model("resnet18", imagenet, 1000).parameter_count(), 11'689'512);
  EXPECT_EQ(build_model("alexnet", imagenet, 1000).parameter_count(), 61'100'840);
}

// The counts documented for the CIFAR variants (3x32x32, 10 classes).
TEST(Zoo, CifarVariantParameterCounts) {
  const std::vector<std::pair<std::string, int64_t>> expected{
      {"alexnet_cifar", 4'361'034},    {"vgg11_cifar", 9'225'610},
      {"vgg13_cifar", 9'410'122},      {"vgg16_cifar", 14'719'818},
      {"vgg19_cifar", 20'029'514},     {"vgg11_bn_cifar", 9'231'114},
      {"vgg13_bn_cifar", 9'416'010},   {"vgg16_bn_cifar", 14'728'266},
      {"vgg19_bn_cifar", 20'040'522},  {"resnet18_cifar", 11'173'962},
      {"resnet34_cifar", 21'282'122},  {"resnet50_cifar", 23'520'842},
      {"resnet101_cifar", 42'512'970}, {"resnet152_cifar", 58'156'618}};
  for (const auto& [name, count] : expected) {
    const Graph g = build_model(name, Shape{8, 3, 32, 32}, 10);
    EXPECT_EQ(g.parameter_count(), count) << name;
    EXPECT_EQ(g.tensor(g.logits()).desc.shape, (Shape{8, 10})) << name;
  }
}

TEST(Zoo, CifarResNetKeepsFullResolutionInLayer1) {
  const Graph g = build_model("resnet18_cifar", Shape{2, 3, 32, 32}, 10);
  EXPECT_EQ(g.tensor(tensor_named(g, "conv1.weight")).desc.shape, (Shape{64, 3, 3, 3}));
  EXPECT_EQ(out_shape(g, "conv1"), (Shape{2, 64, 32, 32}));
  EXPECT_THROW(node(g, "maxpool"), std::runtime_error);
  EXPECT_EQ(out_shape(g, "layer1.1.relu_1"), (Shape{2, 64, 32, 32}));
  EXPECT_EQ(out_shape(g, "layer4.1.relu_1"), (Shape{2, 512, 4, 4}));
  EXPECT_EQ(out_shape(g, "avgpool"), (Shape{2, 512, 1, 1}));
}

TEST(Zoo, CifarVggEndsInOneLinear) {
  const Graph g = build_model("vgg16_bn_cifar", Shape{2, 3, 32, 32}, 10);
  EXPECT_EQ(out_shape(g, "features.43"), (Shape{2, 512, 1, 1}));  // the fifth max-pool
  EXPECT_EQ(g.tensor(tensor_named(g, "classifier.0.weight")).desc.shape, (Shape{10, 512}));
  EXPECT_THROW(node(g, "avgpool"), std::runtime_error);
  EXPECT_THROW(node(g, "classifier.1"), std::runtime_error);
}

TEST(Zoo, SmallModelsFollowTheirInput) {
  EXPECT_EQ(build_model("mlp", Shape{4, 1, 28, 28}, 10).parameter_count(), 535'818);
  EXPECT_EQ(build_model("mlp", Shape{4, 3, 32, 32}, 10).parameter_count(), 1'707'274);
  // LeNet-5: padded conv1 for 28x28, classic unpadded for 32x32; the same 16x5x5 at fc1.
  const Graph mnist = build_model("lenet5", Shape{4, 1, 28, 28}, 10);
  const Graph classic = build_model("lenet5", Shape{4, 1, 32, 32}, 10);
  EXPECT_EQ(mnist.parameter_count(), 61'706);
  EXPECT_EQ(classic.parameter_count(), 61'706);
  EXPECT_EQ(out_shape(mnist, "conv1"), (Shape{4, 6, 28, 28}));
  EXPECT_EQ(out_shape(classic, "conv1"), (Shape{4, 6, 28, 28}));
  EXPECT_EQ(out_shape(mnist, "pool2"), (Shape{4, 16, 5, 5}));
  EXPECT_EQ(build_model("lenet5", Shape{4, 3, 32, 32}, 10).parameter_count(), 62'006);
}

TEST(Zoo, ClassesAndInputSizeChangeOnlyWhatTheyShould) {
  // fc 2048 -> 10 instead of 2048 -> 1000.
  EXPECT_EQ(build_model("resnet50", Shape{1, 3, 224, 224}, 10).parameter_count(), 23'528'522);
  // VGG's adaptive 7x7 pool makes the count independent of the image size.
  const Graph vgg = build_model("vgg16", Shape{4, 3, 64, 64}, 1000);
  EXPECT_EQ(vgg.parameter_count(), 138'357'544);
  EXPECT_EQ(out_shape(vgg, "features.30"), (Shape{4, 512, 2, 2}));
  EXPECT_EQ(out_shape(vgg, "avgpool"), (Shape{4, 512, 7, 7}));
}

TEST(Zoo, LogitsAreBatchByClasses) {
  for (const std::string name : {"mlp", "lenet5", "alexnet", "vgg11_bn", "resnet18", "resnet101",
                                 "resnet50_cifar", "alexnet_cifar"}) {
    const ModelInfo& info = model_info(name);
    const Shape in{3, info.default_input[0], info.default_input[1], info.default_input[2]};
    const Graph g = build_model(name, in, 7);
    EXPECT_EQ(g.tensor(g.logits()).desc.shape, (Shape{3, 7})) << name;
    EXPECT_EQ(g.tensor(g.input()).desc.shape, in) << name;
    EXPECT_EQ(g.nodes().back().name, "loss") << name;
    EXPECT_EQ(g.nodes().back().inputs[0], g.logits()) << name;
  }
}

TEST(Zoo, ResidualWiringFollowsTorchvision) {
  const Graph r18 = build_model("resnet18", Shape{2, 3, 224, 224}, 1000);
  const Node& add10 = node(r18, "layer1.0.add");
  EXPECT_EQ(add10.inputs[0], node(r18, "layer1.0.bn2").outputs[0]);
  EXPECT_EQ(add10.inputs[1], node(r18, "maxpool").outputs[0]);  // identity shortcut
  const Node& add20 = node(r18, "layer2.0.add");
  EXPECT_EQ(add20.inputs[1], node(r18, "layer2.0.downsample.1").outputs[0]);
  EXPECT_EQ(node(r18, "layer2.0.downsample.0").inputs[0], node(r18, "layer1.1.relu_1").outputs[0]);

  const Graph r50 = build_model("resnet50", Shape{2, 3, 224, 224}, 1000);
  // v1.5: the stride sits in conv2 (3x3), not conv1 (1x1).
  EXPECT_EQ(out_shape(r50, "layer2.0.conv1"), (Shape{2, 128, 56, 56}));
  EXPECT_EQ(out_shape(r50, "layer2.0.conv2"), (Shape{2, 128, 28, 28}));
  // layer1.0 widens 64 -> 256 at stride 1, so it has a downsample; layer1.1 does not.
  EXPECT_EQ(out_shape(r50, "layer1.0.downsample.0"), (Shape{2, 256, 56, 56}));
  EXPECT_THROW(node(r50, "layer1.1.downsample.0"), std::runtime_error);
  EXPECT_EQ(node(r50, "layer1.1.add").inputs[1], node(r50, "layer1.0.relu_2").outputs[0]);
}

TEST(Zoo, InitialisersFollowTorchvision) {
  using Kind = ParamInit::Kind;
  const Graph r = build_model("resnet18", Shape{1, 3, 224, 224}, 1000);
  const ParamInit conv = r.init(tensor_named(r, "conv1.weight"));
  EXPECT_EQ(conv.kind, Kind::kNormal);
  EXPECT_FLOAT_EQ(conv.value, std::sqrt(2.0f / (64 * 7 * 7)));  // kaiming_normal_, fan_out
  const ParamInit fc = r.init(tensor_named(r, "fc.weight"));
  EXPECT_EQ(fc.kind, Kind::kUniform);
  EXPECT_FLOAT_EQ(fc.value, 1.0f / std::sqrt(512.0f));  // nn.Linear default
  EXPECT_EQ(r.init(tensor_named(r, "fc.bias")).kind, Kind::kUniform);
  EXPECT_EQ(r.init(tensor_named(r, "bn1.weight")).kind, Kind::kConstant);
  EXPECT_EQ(r.init(tensor_named(r, "bn1.weight")).value, 1.0f);
  EXPECT_EQ(r.init(tensor_named(r, "bn1.running_var")).value, 1.0f);

  const Graph v = build_model("vgg16", Shape{1, 3, 224, 224}, 1000);
  EXPECT_EQ(v.init(tensor_named(v, "features.0.weight")).kind, Kind::kNormal);
  EXPECT_FLOAT_EQ(v.init(tensor_named(v, "features.0.weight")).value,
                  std::sqrt(2.0f / (64 * 3 * 3)));
  EXPECT_EQ(v.init(tensor_named(v, "features.0.bias")).kind, Kind::kConstant);
  EXPECT_EQ(v.init(tensor_named(v, "features.0.bias")).value, 0.0f);
  EXPECT_EQ(v.init(tensor_named(v, "classifier.6.weight")).kind, Kind::kNormal);
  EXPECT_FLOAT_EQ(v.init(tensor_named(v, "classifier.6.weight")).value, 0.01f);
  EXPECT_EQ(v.init(tensor_named(v, "classifier.6.bias")).value, 0.0f);

  const Graph a = build_model("alexnet", Shape{1, 3, 224, 224}, 1000);
  EXPECT_EQ(a.init(tensor_named(a, "features.0.weight")).kind, Kind::kUniform);
  EXPECT_FLOAT_EQ(a.init(tensor_named(a, "features.0.weight")).value,
                  1.0f / std::sqrt(3.0f * 11 * 11));
  EXPECT_EQ(node(a, "classifier.0").op->describe(), "p=0.5");
}

TEST(Zoo, UnknownNameSuggestsTheNearest) {
  try {
    build_model("resnet51", Shape{1, 3, 224, 224}, 1000);
    FAIL() << "no error for an unknown model";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model 'resnet51'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("did you mean 'resnet50'"), std::string::npos);
    EXPECT_NE(e.hint().find("mlp, lenet5, alexnet"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("resnet152_cifar"), std::string::npos) << e.hint();
  }
  try {
    model_info("VGG16cifar");
    FAIL() << "no error for an unknown model";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'vgg16_cifar'"), std::string::npos)
        << e.what();
  }
  try {
    build_model("transformer", Shape{1, 3, 224, 224}, 1000);
    FAIL() << "no error for an unknown model";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("resnet50"), std::string::npos);
  }
}

TEST(Zoo, InputTooSmallIsAConfigErrorWithAHint) {
  try {
    build_model("alexnet", Shape{1, 3, 32, 32}, 10);
    FAIL() << "alexnet built for 32x32";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model 'alexnet' cannot take input (1, 3, 32, 32)"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("alexnet_cifar"), std::string::npos) << e.hint();
  }
  try {
    build_model("lenet5", Shape{1, 1, 8, 8}, 10);
    FAIL() << "lenet5 built for 8x8";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'conv2'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_model("resnet18", Shape{3, 224, 224}, 10), ConfigError);  // no batch dim
  EXPECT_THROW(build_model("resnet18", Shape{1, 3, 224, 224}, 0), ConfigError);
}

// Building only computes shapes: resnet152 (over 1,000 nodes) must take milliseconds.
TEST(Zoo, BuildingIsFast) {
  using Clock = std::chrono::steady_clock;
  double best_ms = 1e9;
  size_t nodes = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    const Graph g = build_model("resnet152", Shape{64, 3, 224, 224}, 1000);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    best_ms = std::min(best_ms, ms);
    nodes = g.nodes().size();
  }
  EXPECT_GT(nodes, 500u);
  EXPECT_LT(best_ms, 100.0) << "resnet152 took " << best_ms << " ms to build";
  RecordProperty("resnet152_build_ms", std::to_string(best_ms));
}

TEST(LayerTable, JsonRowsAddUpToTheModel) {
  const Graph g = build_model("resnet18", Shape{1, 3, 224, 224}, 1000);
  const nlohmann::json j = layer_table_json(g, "resnet18");
  EXPECT_EQ(j["model"], "resnet18");
  EXPECT_EQ(j["parameters"].get<int64_t>(), 11'689'512);
  EXPECT_EQ(j["classes"].get<int64_t>(), 1000);
  EXPECT_EQ(j["input"].get<std::vector<int64_t>>(), (std::vector<int64_t>{1, 3, 224, 224}));
  const nlohmann::json& layers = j["layers"];
  ASSERT_EQ(layers.size(), g.nodes().size() - 1);  // every node but the loss
  int64_t sum = 0;
  for (const nlohmann::json& l : layers) sum += l["parameters"].get<int64_t>();
  EXPECT_EQ(sum, 11'689'512);
  EXPECT_EQ(layers.front()["name"], "conv1");
  EXPECT_EQ(layers.front()["kind"], "conv2d");
  EXPECT_EQ(layers.front()["output"].get<std::vector<int64_t>>(),
            (std::vector<int64_t>{1, 64, 112, 112}));
  EXPECT_EQ(layers.front()["parameters"].get<int64_t>(), 9'408);
  EXPECT_EQ(layers.back()["name"], "fc");
  EXPECT_EQ(layers.back()["parameters"].get<int64_t>(), 513'000);
  EXPECT_EQ(layers.back()["output"].get<std::vector<int64_t>>(), (std::vector<int64_t>{1, 1000}));
}

TEST(LayerTable, TextTableNamesLayersAndTotal) {
  const Graph g = build_model("resnet18_cifar", Shape{1, 3, 32, 32}, 10);
  const std::string t = layer_table(g, "resnet18_cifar");
  EXPECT_EQ(t.rfind("model resnet18_cifar: input (1, 3, 32, 32), 10 classes\n", 0), 0u) << t;
  EXPECT_NE(t.find("layer4.1.bn2"), std::string::npos);
  EXPECT_NE(t.find("(1, 512, 4, 4)"), std::string::npos);
  EXPECT_NE(t.find("total parameters: 11,173,962\n"), std::string::npos);
  EXPECT_EQ(t.find("softmax_cross_entropy"), std::string::npos);
  // Header + a title + one line per layer + the total.
  EXPECT_EQ(static_cast<size_t>(std::count(t.begin(), t.end(), '\n')), g.nodes().size() - 1 + 3);
}

TEST(LayerTable, GroupsThousands) {
  EXPECT_EQ(group_thousands(0), "0");
  EXPECT_EQ(group_thousands(999), "999");
  EXPECT_EQ(group_thousands(1000), "1,000");
  EXPECT_EQ(group_thousands(25'557'032), "25,557,032");
  EXPECT_EQ(group_thousands(-1234567), "-1,234,567");
}

}  // namespace
}  // namespace ferry
