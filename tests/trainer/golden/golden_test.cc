// Golden test against PyTorch: the fixture written by scripts/golden_reference.py holds a small
// CNN (BN, a residual block, max and adaptive pooling), its initial weights, three batches, the
// logits, loss and gradients of the first step, and the loss, parameters and BN statistics
// after each of three SGD steps (momentum 0.9, weight decay 5e-4). We run the same steps on the
// CPU backend and compare every tensor.
//
// Tolerances (fp32 against fp32 computed by different kernels): |ours - torch| <= atol + rtol *
// |torch| elementwise, with rtol 1e-4 and atol 1e-5 * max|torch| for forward values, and rtol
// 1e-3, atol 1e-4 * max|torch| for gradients and updated parameters (which compound three
// steps of rounding differences).
//
// The optimizer fixture (scripts/golden_reference.py --optim) starts from the same weights and
// batches and holds three steps of SGD and AdamW with gradient clipping by global norm
// (torch.nn.utils.clip_grad_norm_) and with weight decay only on parameters of 2+ dimensions
// (PyTorch param groups), checked with the same tolerances.
#include <cmath>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "device/device.h"
#include "tests/trainer/golden/golden_net.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/exec/executor.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/optim/optimizer.h"

namespace ferry {
namespace {

std::vector<float> floats(std::span<const uint8_t> bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::vector<float> floats(const std::vector<std::byte>& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

void expect_close(const std::vector<float>& ours, const std::vector<float>& ref, double rtol,
                  double atol_scale, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  double scale = 0;
  for (float r : ref) scale = std::max(scale, std::fabs(static_cast<double>(r)));
  const double atol = atol_scale * std::max(scale, 1e-3);
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(ours[i]) - ref[i]);
    if (err > atol + rtol * std::fabs(static_cast<double>(ref[i])) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: ours " << ours[i] << " torch " << ref[i];
    }
  }
}

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_ = read_safetensors(std::string(FERRY_SOURCE_DIR) +
                                "/tests/trainer/golden/golden_fixture.safetensors");
    DeviceOptions options;
    options.memory = 256ull << 20;
    device_ = create_device(options);
    graph_ = build_golden_net(kGoldenBatch);
    store_ = std::make_unique<ParameterStore>(*device_, graph_, /*optimizer_slots=*/2);  // AdamW
    store_->initialize(graph_, 0);
    for (size_t i = 0; i < store_->params().size(); ++i) {
      store_->write_param(i, fixture_.at("init." + store_->params()[i].name).bytes.data());
    }
    for (size_t i = 0; i < store_->buffers().size(); ++i) {
      if (store_->buffers()[i].desc.dtype != DType::kF32) continue;
      store_->write_buffer(i, fixture_.at("init." + store_->buffers()[i].name).bytes.data());
    }
    executor_ = std::make_unique<Executor>(
        *device_, *store_, [](int64_t n) { return build_golden_net(n); }, ExecutorOptions{});
    executor_->keep_alive({"fc"});
  }

  // Runs step k of `optimizer` on batch k with rate `lr` and returns the loss.
  float step(int k, Optimizer& optimizer, float lr = 0.1f) {
    const auto images = floats(fixture_.at("batch" + std::to_string(k) + ".images").bytes);
    const auto& label_entry = fixture_.at("batch" + std::to_string(k) + ".labels");
    std::vector<int32_t> labels(kGoldenBatch);
    std::memcpy(labels.data(), label_entry.bytes.data(), label_entry.bytes.size());
    executor_->enqueue({images.data(), labels.data(), kGoldenBatch}, true,
                       static_cast<uint64_t>(k));
    const float loss = executor_->read_metrics().loss;
    step0_logits_ = floats(executor_->read_activation("fc"));
    if (k == 0) {
      for (size_t i = 0; i < store_->params().size(); ++i)
        grads0_.push_back(floats(store_->read_grad(i)));
    }
    optimizer.step(device_->kernels(), device_->stream(StreamKind::kCompute), *store_, lr);
    device_->synchronize();
    return loss;
  }

  SafetensorsFile fixture_;
  std::unique_ptr<Device> device_;
  Graph graph_;
  std::unique_ptr<ParameterStore> store_;
  std::unique_ptr<Executor> executor_;
  std::vector<float> step0_logits_;
  std::vector<std::vector<float>> grads0_;
};

TEST_F(GoldenTest, ParameterNamesMatchTheTorchStateDict) {
  for (const auto& p : store_->params()) {
    const SafetensorsEntry& e = fixture_.at("init." + p.name);
    EXPECT_EQ(e.shape, p.desc.shape) << p.name;
  }
  for (const auto& b : store_->buffers())
    EXPECT_NE(fixture_.find("init." + b.name), nullptr) << b.name;
}

TEST_F(GoldenTest, ThreeSgdStepsMatchPyTorch) {
  Optimizer optimizer(OptimizerOptions{OptimizerKind::kSgd, 0.9f, false, 5e-4f});
  for (int k = 0; k < 3; ++k) {
    const float loss = step(k, optimizer);
    const float ref = floats(fixture_.at("step" + std::to_string(k) + ".loss").bytes)[0];
    EXPECT_NEAR(loss, ref, 1e-4 * std::fabs(ref)) << "loss of step " << k;
    if (k == 0) {
      expect_close(step0_logits_, floats(fixture_.at("step0.logits").bytes), 1e-4, 1e-5, "logits");
      for (size_t i = 0; i < store_->params().size(); ++i) {
        const std::string& name = store_->params()[i].name;
        expect_close(grads0_[i], floats(fixture_.at("step0.grad." + name).bytes), 1e-3, 1e-4,
                     "grad " + name);
      }
    }
    const std::string after = "after" + std::to_string(k) + ".";
    for (size_t i = 0; i < store_->params().size(); ++i) {
      const std::string& name = store_->params()[i].name;
      expect_close(floats(store_->read_param(i)), floats(fixture_.at(after + name).bytes), 1e-3,
                   1e-4, "step " + std::to_string(k) + " " + name);
    }
    for (size_t i = 0; i < store_->buffers().size(); ++i) {
      const auto& b = store_->buffers()[i];
      if (b.desc.dtype != DType::kF32) continue;
      expect_close(floats(store_->read_buffer(i)), floats(fixture_.at(after + b.name).bytes), 1e-4,
                   1e-5, "step " + std::to_string(k) + " " + b.name);
    }
  }
}

class GoldenOptimTest : public GoldenTest {
 protected:
  void SetUp() override {
    GoldenTest::SetUp();
    optim_ = read_safetensors(std::string(FERRY_SOURCE_DIR) +
                              "/tests/trainer/golden/golden_optim_fixture.safetensors");
  }

  float scalar(const std::string& name) { return floats(optim_.at(name).bytes)[0]; }

  // Three steps of `options` at rate `lr` against the fixture's `variant`.
  void expect_trajectory(const std::string& variant, const OptimizerOptions& options, float lr) {
    Optimizer optimizer(options);
    for (int k = 0; k < 3; ++k) {
      const std::string at = variant + ".step" + std::to_string(k) + ".";
      const float loss = step(k, optimizer, lr);
      const float ref = scalar(at + "loss");
      EXPECT_NEAR(loss, ref, 1e-4 * std::fabs(ref)) << variant << " loss of step " << k;
      if (options.clip_norm > 0) {
        float sum_sq = 0;
        device_->copy_async(&sum_sq, store_->grad_sq_address(), sizeof(float),
                            device_->stream(StreamKind::kCompute));
        device_->synchronize();
        const float norm = scalar(at + "grad_norm");
        EXPECT_GT(norm, options.clip_norm) << "the fixture must clip";
        EXPECT_NEAR(std::sqrt(sum_sq), norm, 1e-3 * norm) << variant << " grad norm " << k;
      }
      const std::string after = variant + ".after" + std::to_string(k) + ".";
      for (size_t i = 0; i < store_->params().size(); ++i) {
        const std::string& name = store_->params()[i].name;
        expect_close(floats(store_->read_param(i)), floats(optim_.at(after + name).bytes), 1e-3,
                     1e-4, variant + " step " + std::to_string(k) + " " + name);
      }
    }
  }

  SafetensorsFile optim_;
};

TEST_F(GoldenOptimTest, SgdWithGradientClippingMatchesPyTorch) {
  OptimizerOptions o{OptimizerKind::kSgd, 0.9f, false, 5e-4f};
  o.clip_norm = 0.5f;
  expect_trajectory("sgd_clip", o, 0.1f);
}

TEST_F(GoldenOptimTest, SgdDecayingOnlyMatricesMatchesPyTorchParamGroups) {
  OptimizerOptions o{OptimizerKind::kSgd, 0.9f, false, 0.05f};
  o.decay = WeightDecayGroups::kMatrices;
  expect_trajectory("sgd_matrices", o, 0.1f);
}

TEST_F(GoldenOptimTest, AdamWDecayingOnlyMatricesWithClippingMatchesPyTorch) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.weight_decay = 0.1f;
  o.decay = WeightDecayGroups::kMatrices;
  o.clip_norm = 0.5f;
  expect_trajectory("adamw_matrices_clip", o, 0.01f);
}

}  // namespace
}  // namespace ferry
