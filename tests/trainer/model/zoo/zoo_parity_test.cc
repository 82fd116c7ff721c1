// Zoo parity with PyTorch: every zoo model, built at the fixture's input and class count, has
// torchvision's parameter count, state_dict (names, order, shapes, dtypes, param/buffer) and
// layer-by-layer output shapes. The fixture is written by scripts/zoo_reference.py.
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

const nlohmann::json& fixture() {
  static const nlohmann::json j = [] {
    const std::string path =
        std::string(FERRY_SOURCE_DIR) + "/tests/trainer/model/zoo/torchvision_zoo.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path + " (run scripts/zoo_reference.py)");
    return nlohmann::json::parse(in);
  }();
  return j;
}

std::vector<int64_t> dims(const Shape& s) { return s.dims(); }

// torch module type -> our op kind.
std::string kind_of_torch(const std::string& type) {
  static const std::map<std::string, std::string> kinds{
      {"Conv2d", "conv2d"},   {"BatchNorm2d", "batchnorm2d"},
      {"ReLU", "relu"},       {"MaxPool2d", "maxpool"},
      {"Linear", "linear"},   {"AdaptiveAvgPool2d", "adaptive_avgpool"},
      {"Dropout", "dropout"}, {"AvgPool2d", "avgpool"}};
  auto it = kinds.find(type);
  return it == kinds.end() ? "unknown torch module " + type : it->second;
}

// Our state_dict: per node (in module order) its parameters, then its buffers.
struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  std::string role;
};

std::vector<Entry> state_dict_of(const Graph& g) {
  std::vector<Entry> out;
  auto push = [&](TensorId t, const char* role) {
    const TensorInfo& info = g.tensor(t);
    out.push_back(
        {info.name, dims(info.desc.shape), std::string(dtype_name(info.desc.dtype)), role});
  };
  for (const Node& n : g.nodes()) {
    for (TensorId p : n.params) push(p, "param");
    for (TensorId b : n.buffers) push(b, "buffer");
  }
  return out;
}

class ZooParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooParity, MatchesTorchReference) {
  const std::string& name = GetParam();
  ASSERT_TRUE(fixture()["models"].contains(name))
      << name << " has no reference entry; rerun scripts/zoo_reference.py";
  const nlohmann::json& ref = fixture()["models"][name];
  const auto input = ref["input"].get<std::vector<int64_t>>();
  const Graph g = build_model(name, Shape(input), ref["classes"].get<int64_t>());

  EXPECT_EQ(g.parameter_count(), ref["parameters"].get<int64_t>());
  EXPECT_EQ(dims(g.tensor(g.logits()).desc.shape), ref["logits"].get<std::vector<int64_t>>());

  // state_dict: names, order, shapes, dtypes and roles.
  const std::vector<Entry> ours = state_dict_of(g);
  const nlohmann::json& theirs = ref["state_dict"];
  ASSERT_EQ(ours.size(), theirs.size()) << "state_dict sizes differ";
  std::vector<std::string> ref_params, ref_buffers;
  for (size_t i = 0; i < ours.size(); ++i) {
    const nlohmann::json& t = theirs[i];
    ASSERT_EQ(ours[i].name, t[0].get<std::string>()) << "entry " << i;
    EXPECT_EQ(ours[i].shape, t[1].get<std::vector<int64_t>>()) << ours[i].name;
    EXPECT_EQ(ours[i].dtype, t[2].get<std::string>()) << ours[i].name;
    EXPECT_EQ(ours[i].role, t[3].get<std::string>()) << ours[i].name;
    (t[3] == "param" ? ref_params : ref_buffers).push_back(t[0].get<std::string>());
  }
  // Graph::params() / buffers() (what checkpoints and the optimizer walk) keep that order too.
  std::vector<std::string> params, buffers;
  for (TensorId p : g.params()) params.push_back(g.tensor(p).name);
  for (TensorId b : g.buffers()) buffers.push_back(g.tensor(b).name);
  EXPECT_EQ(params, ref_params);
  EXPECT_EQ(buffers, ref_buffers);

  // Layers: every torch module call, in forward order, with its output shape. Our extra nodes
  // are torch's functional calls (flatten, the residual add) and the loss.
  std::vector<const Node*> layers;
  for (const Node& n : g.nodes()) {
    const std::string_view kind = n.op->kind();
    if (kind != "flatten" && kind != "add" && kind != "softmax_cross_entropy") {
      layers.push_back(&n);
    }
  }
  const nlohmann::json& ref_layers = ref["layers"];
  ASSERT_EQ(layers.size(), ref_layers.size()) << "layer counts differ";
  for (size_t i = 0; i < layers.size(); ++i) {
    const nlohmann::json& t = ref_layers[i];
    ASSERT_EQ(layers[i]->name, t[0].get<std::string>()) << "layer " << i;
    EXPECT_EQ(std::string(layers[i]->op->kind()), kind_of_torch(t[1].get<std::string>()))
        << layers[i]->name;
    EXPECT_EQ(dims(g.tensor(layers[i]->outputs[0]).desc.shape), t[2].get<std::vector<int64_t>>())
        << layers[i]->name;
  }
}

// Every image model of the zoo is checked: the list comes from the zoo, not from the fixture.
// (The token models' parity is with Hugging Face: tests/trainer/golden/gpt2_parity.py.)
std::vector<std::string> image_models() {
  std::vector<std::string> names;
  for (const std::string& name : zoo_names()) {
    if (!model_info(name).tokens) names.push_back(name);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooParity, ::testing::ValuesIn(image_models()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// The fixture's input and classes are the zoo's defaults, so the parity above is at defaults.
TEST(ZooParityFixture, CoversTheZooAtDefaults) {
  const nlohmann::json& models = fixture()["models"];
  EXPECT_EQ(models.size(), image_models().size());
  for (const std::string& name : image_models()) {
    ASSERT_TRUE(models.contains(name)) << name;
    const ModelInfo& info = model_info(name);
    const auto input = models[name]["input"].get<std::vector<int64_t>>();
    EXPECT_EQ(std::vector<int64_t>(input.begin() + 1, input.end()), info.default_input.dims())
        << name;
    EXPECT_EQ(models[name]["classes"].get<int64_t>(), info.default_classes) << name;
  }
  EXPECT_EQ(fixture()["torchvision"].get<std::string>().substr(0, 4), "0.14");
}

}  // namespace
}  // namespace ferry
