// The optimizer's launches over the parameter block: decay runs (optim.decay), how many kernels
// a step launches, decay skipped bitwise on the parameters outside the group, and clipping by the
// global norm of the whole gradient block.
#include "trainer/optim/optimizer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "device/device.h"
#include "tests/trainer/golden/golden_net.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

// GPT-2 small's parameters in nanoGPT's order (12 blocks; lm_head tied to wte), 64-byte
// aligned as ParameterStore cuts them: the layout the transformer models will have.
std::vector<ParameterStore::Entry> gpt2_params(int64_t* floats) {
  const int64_t d = 768, vocab = 50304, ctx = 1024;
  std::vector<std::pair<std::string, Shape>> shapes = {{"wte", Shape{vocab, d}},
                                                       {"wpe", Shape{ctx, d}}};
  for (int l = 0; l < 12; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    for (auto [name, shape] :
         std::vector<std::pair<std::string, Shape>>{{"ln_1.weight", Shape{d}},
                                                    {"ln_1.bias", Shape{d}},
                                                    {"attn.c_attn.weight", Shape{3 * d, d}},
                                                    {"attn.c_attn.bias", Shape{3 * d}},
                                                    {"attn.c_proj.weight", Shape{d, d}},
                                                    {"attn.c_proj.bias", Shape{d}},
                                                    {"ln_2.weight", Shape{d}},
                                                    {"ln_2.bias", Shape{d}},
                                                    {"mlp.c_fc.weight", Shape{4 * d, d}},
                                                    {"mlp.c_fc.bias", Shape{4 * d}},
                                                    {"mlp.c_proj.weight", Shape{d, 4 * d}},
                                                    {"mlp.c_proj.bias", Shape{d}}}) {
      shapes.emplace_back(h + name, shape);
    }
  }
  shapes.emplace_back("ln_f.weight", Shape{d});
  shapes.emplace_back("ln_f.bias", Shape{d});
  std::vector<ParameterStore::Entry> out;
  uint64_t offset = 0;
  for (auto& [name, shape] : shapes) {
    out.push_back({name, TensorDesc{shape}, offset});
    offset += (out.back().desc.bytes() + 63) / 64 * 64;
  }
  *floats = static_cast<int64_t>(offset / sizeof(float));
  return out;
}

// Every float of the block is in exactly one run, runs alternate, and each parameter lies
// inside a run of its own decay.
void expect_partition(const std::vector<DecayRun>& runs,
                      const std::vector<ParameterStore::Entry>& params, int64_t floats,
                      WeightDecayGroups groups) {
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs.front().begin, 0);
  EXPECT_EQ(runs.back().end, floats);
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].begin, runs[i - 1].end);
    EXPECT_NE(runs[i].decay, runs[i - 1].decay) << "neighbouring runs alike were not merged";
  }
  for (const auto& e : params) {
    const auto begin = static_cast<int64_t>(e.offset / sizeof(float));
    const int64_t end = begin + e.desc.shape.numel();
    bool inside = false;
    for (const DecayRun& r : runs) {
      if (r.begin <= begin && end <= r.end) {
        inside = true;
        EXPECT_EQ(r.decay, decays(e, groups)) << e.name;
      }
    }
    EXPECT_TRUE(inside) << e.name << " straddles two runs";
  }
}

TEST(DecayRuns, MatricesOnlyCutsGpt2IntoAlternatingRuns) {
  int64_t floats = 0;
  const auto params = gpt2_params(&floats);
  const auto runs = decay_runs(params, floats, WeightDecayGroups::kMatrices, 0.1f);
  expect_partition(runs, params, floats, WeightDecayGroups::kMatrices);
  // [wte wpe] then per block [ln_1 (+ the last block's c_proj.bias)] [c_attn.w] [c_attn.b]
  // [c_proj.w] [c_proj.b ln_2] [c_fc.w] [c_fc.b] [c_proj.w], then [c_proj.b ln_f].
  EXPECT_EQ(runs.size(), 1u + 12 * 8 + 1);
  EXPECT_TRUE(runs.front().decay);
  EXPECT_FALSE(runs.back().decay);
  EXPECT_EQ(decay_runs(params, floats, WeightDecayGroups::kAll, 0.1f).size(), 1u);
  EXPECT_EQ(decay_runs(params, floats, WeightDecayGroups::kMatrices, 0.0f).size(), 1u)
      << "without weight decay the groups do not matter";
}

TEST(DecayRuns, MatricesOnlyOnTheZoosGpt2) {
  // gpt2's 12 blocks at a small width: the parameter order is the model's.
  const Graph g = build_token_model("gpt2", 2, 16, TransformerSizes{12, 4, 64, 128, 32, 0.0});
  DeviceOptions options;
  options.memory = uint64_t{256} << 20;
  auto device = create_device(options);
  ParameterStore store(*device, g, 0);
  const auto runs =
      decay_runs(store.params(), store.param_floats(), WeightDecayGroups::kMatrices, 0.1f);
  expect_partition(runs, store.params(), store.param_floats(), WeightDecayGroups::kMatrices);
  std::string decayed;
  for (const auto& e : store.params()) {
    const bool in_block = e.name.find(".h.0.") != std::string::npos;
    if (decays(e, WeightDecayGroups::kMatrices) &&
        (in_block || e.name.find(".h.") == std::string::npos)) {
      decayed += e.name + " ";
    }
  }
  // The four matrices of a block and the two embeddings; not the layer norms, nor any bias.
  EXPECT_EQ(decayed,
            "transformer.wte.weight transformer.wpe.weight transformer.h.0.attn.c_attn.weight "
            "transformer.h.0.attn.c_proj.weight transformer.h.0.mlp.c_fc.weight "
            "transformer.h.0.mlp.c_proj.weight ");
  // As nanoGPT's layout (DecayRuns.MatricesOnlyCutsGpt2IntoAlternatingRuns): 8 per block.
  EXPECT_EQ(runs.size(), 1u + 12 * 8 + 1);
}

TEST(DecayRuns, MatricesOnlyOnResNet18DecaysConvAndFcWeightsOnly) {
  const Graph g = build_model("resnet18", Shape{2, 3, 224, 224}, 1000);
  DeviceOptions options;
  options.memory = uint64_t{1} << 30;
  auto device = create_device(options);
  ParameterStore store(*device, g, 0);
  const auto runs =
      decay_runs(store.params(), store.param_floats(), WeightDecayGroups::kMatrices, 1e-4f);
  expect_partition(runs, store.params(), store.param_floats(), WeightDecayGroups::kMatrices);
  int decayed = 0;
  for (const auto& e : store.params()) decayed += decays(e, WeightDecayGroups::kMatrices);
  EXPECT_EQ(decayed, 21);  // 20 convolutions and fc.weight
  // conv (bn weight bias) conv (bn ...) ... fc.weight fc.bias: two runs per decayed parameter.
  EXPECT_EQ(runs.size(), 42u);
}

TEST(ModelInfo, CnnsDecayEveryParameterUnderAutoAndGptOnlyItsMatrices) {
  // The CNNs: the behaviour every PyTorch-parity test of them was written against.
  for (const std::string& name : zoo_names()) {
    EXPECT_EQ(model_info(name).decay_matrices_only, model_info(name).tokens) << name;
  }
  EXPECT_TRUE(model_info("gpt2").decay_matrices_only);
}

class OptimizerOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.memory = uint64_t{256} << 20;
    device_ = create_device(options);
    graph_ = build_golden_net(kGoldenBatch);
  }

  std::unique_ptr<ParameterStore> make_store(int slots) {
    auto store = std::make_unique<ParameterStore>(*device_, graph_, slots);
    store->initialize(graph_, 7);
    return store;
  }

  std::vector<float> block(const ParameterStore& store, const float* device_block) {
    std::vector<float> out(static_cast<size_t>(store.param_floats()));
    device_->copy_async(out.data(), device_block, out.size() * sizeof(float),
                        device_->stream(StreamKind::kCompute));
    device_->synchronize();
    return out;
  }

  void write_grads(ParameterStore& store, const std::vector<float>& g) {
    device_->copy_async(store.grad_block(), g.data(), g.size() * sizeof(float),
                        device_->stream(StreamKind::kCompute));
    device_->synchronize();
  }

  void step(Optimizer& o, ParameterStore& store, float lr) {
    o.step(device_->kernels(), device_->stream(StreamKind::kCompute), store, lr);
    device_->synchronize();
  }

  std::unique_ptr<Device> device_;
  Graph graph_;
};

TEST_F(OptimizerOnDevice, MatricesOnlyLeavesOneDimensionalParametersBitwiseUndecayed) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    SCOPED_TRACE(kind == OptimizerKind::kSgd ? "sgd" : "adamw");
    // Zero gradients: only the decay moves a parameter.
    OptimizerOptions o;
    o.kind = kind;
    o.weight_decay = 0.1f;
    std::vector<std::vector<float>> after;
    for (auto [groups, wd] :
         {std::pair{WeightDecayGroups::kMatrices, 0.1f}, std::pair{WeightDecayGroups::kAll, 0.0f},
          std::pair{WeightDecayGroups::kAll, 0.1f}}) {
      o.decay = groups;
      o.weight_decay = wd;
      auto store = make_store(2);
      Optimizer opt(o);
      step(opt, *store, 0.5f);
      after.push_back(block(*store, store->param_block()));
      // conv1 (bn1) conv2 (bn2) conv3 (bn3) conv4.weight (conv4.bias) fc.weight (fc.bias).
      EXPECT_EQ(opt.launches(), groups == WeightDecayGroups::kMatrices ? 10 : 1);
    }
    auto store = make_store(2);
    const auto before = block(*store, store->param_block());
    int moved = 0;
    for (const auto& e : store->params()) {
      const size_t b = e.offset / sizeof(float), n = static_cast<size_t>(e.desc.shape.numel());
      const auto& same = e.desc.shape.rank() >= 2 ? after[2] : after[1];
      EXPECT_EQ(std::memcmp(after[0].data() + b, same.data() + b, n * sizeof(float)), 0) << e.name;
      moved += std::memcmp(after[0].data() + b, before.data() + b, n * sizeof(float)) != 0;
    }
    EXPECT_EQ(moved, 5) << "conv1-4 and fc weights decay, nothing else";
  }
}

TEST_F(OptimizerOnDevice, ClipsByTheNormOfTheWholeGradientBlock) {
  auto store = make_store(0);
  // SGD without momentum or decay at rate 1 from zero parameters: p = -clipped g.
  const std::vector<float> zeros(static_cast<size_t>(store->param_floats()), 0.0f);
  device_->copy_async(store->param_block(), zeros.data(), zeros.size() * sizeof(float),
                      device_->stream(StreamKind::kCompute));
  std::vector<float> g(zeros.size(), 0.0f);
  double sum_sq = 0;
  for (const auto& e : store->params()) {  // every parameter, padding left zero
    for (int64_t i = 0; i < e.desc.shape.numel(); ++i) {
      const float v = std::sin(static_cast<float>(e.offset + i));
      g[e.offset / sizeof(float) + static_cast<size_t>(i)] = v;
      sum_sq += static_cast<double>(v) * v;
    }
  }
  write_grads(*store, g);
  OptimizerOptions o{OptimizerKind::kSgd, 0.0f};
  o.clip_norm = 2.0f;
  Optimizer opt(o);
  step(opt, *store, 1.0f);
  EXPECT_EQ(opt.launches(), 3);
  ASSERT_TRUE(opt.measures_grad_norm());
  float measured = 0;
  device_->copy_async(&measured, store->grad_sq_address(), sizeof(float),
                      device_->stream(StreamKind::kCompute));
  device_->synchronize();
  EXPECT_NEAR(measured, sum_sq, 1e-6 * sum_sq) << "the norm before clipping";
  const double coef = 2.0 / (std::sqrt(sum_sq) + 1e-6);
  ASSERT_LT(coef, 1.0);
  const auto p = block(*store, store->param_block());
  double p_sq = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(p[i], -g[i] * coef, 1e-6) << i;
    p_sq += static_cast<double>(p[i]) * p[i];
  }
  EXPECT_NEAR(std::sqrt(p_sq), 2.0, 1e-5);
}

}  // namespace
}  // namespace ferry
