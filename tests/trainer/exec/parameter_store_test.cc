// The parameter store's bf16 working copy (Note [The bf16 working copy]): every weight rounded to
// bf16 at half its offset, made once per update by the executor's next step, planned bytes equal
// to the bytes held; an fp32 store has none.
#include "trainer/exec/parameter_store.h"

#include <cstring>

#include <gtest/gtest.h>

#include "device/bf16.h"
#include "tests/trainer/golden/golden_net.h"
#include "trainer/exec/executor.h"
#include "trainer/model/precision.h"

namespace ferry {
namespace {

std::unique_ptr<Device> cpu_device() {
  DeviceOptions o;
  o.memory = 256 << 20;
  o.precision = Precision::kBf16;
  return create_device(o);
}

Graph bf16_golden_net(int64_t batch) {
  Graph g = build_golden_net(batch);
  apply_precision(g, Precision::kBf16);
  return g;
}

std::vector<uint16_t> read_bf16(Device& device, const void* src, size_t n) {
  std::vector<uint16_t> out(n);
  Stream& s = device.stream(StreamKind::kCompute);
  device.copy_async(out.data(), src, n * sizeof(uint16_t), s);
  s.synchronize();
  return out;
}

TEST(ParameterStore, TheBf16WorkingCopyIsEveryWeightRoundedOncePerUpdate) {
  auto device = cpu_device();
  const Graph graph = bf16_golden_net(kGoldenBatch);
  ParameterStore store(*device, graph, 1, {}, false, Precision::kBf16);
  store.initialize(graph, 0);
  ASSERT_TRUE(store.has_working_copy());
  EXPECT_EQ(store.bytes().working_weights,
            ParameterStore::plan_bytes(graph, 1, false, Precision::kBf16).working_weights);
  EXPECT_GE(store.bytes().working_weights * 2, store.bytes().weights);

  Executor exec(*device, store, bf16_golden_net, ExecutorOptions{});
  std::vector<float> images(kGoldenBatch * kGoldenChannels * kGoldenSize * kGoldenSize, 0.5f);
  std::vector<int32_t> labels(kGoldenBatch, 1);
  // No update between the steps: one narrowing serves them all.
  for (int i = 0; i < 3; ++i) {
    exec.enqueue({images.data(), labels.data(), kGoldenBatch}, true, 1);
    EXPECT_TRUE(std::isfinite(exec.read_metrics().loss));
  }
  EXPECT_EQ(store.working_refreshes(), 1u);

  // An update (here: a new weight) makes the next step narrow again, once.
  std::vector<std::byte> w = store.read_param(0);
  reinterpret_cast<float*>(w.data())[0] = 1.00390625f + 0.001f;  // not a bf16 value
  store.write_param(0, w.data());
  for (int i = 0; i < 2; ++i) {
    exec.enqueue({images.data(), labels.data(), kGoldenBatch}, true, 2);
    exec.read_metrics();
  }
  EXPECT_EQ(store.working_refreshes(), 2u);

  // Each parameter's copy: its weights rounded to nearest even, element by element.
  size_t checked = 0;
  for (size_t i = 0; i < store.params().size(); ++i) {
    const std::vector<std::byte> bytes = store.read_param(i);
    const size_t n = bytes.size() / sizeof(float);
    TensorId id = kNoTensor;
    for (TensorId p : graph.params())
      if (graph.tensor(p).name == store.params()[i].name) id = p;
    ASSERT_NE(id, kNoTensor);
    const std::vector<uint16_t> copy = read_bf16(*device, store.working_address(graph, id), n);
    for (size_t k = 0; k < n; ++k) {
      float x;
      std::memcpy(&x, bytes.data() + k * sizeof(float), sizeof(float));
      ASSERT_EQ(copy[k], float_to_bf16(x).bits) << store.params()[i].name << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100u);
}

TEST(ParameterStore, AnFp32StoreHasNoWorkingCopy) {
  DeviceOptions o;
  o.memory = 64 << 20;
  auto device = create_device(o);
  const Graph graph = build_golden_net(kGoldenBatch);
  ParameterStore store(*device, graph, 1);
  store.initialize(graph, 0);
  EXPECT_FALSE(store.has_working_copy());
  EXPECT_EQ(store.bytes().working_weights, 0u);
  EXPECT_EQ(store.working_address(graph, graph.params()[0]), nullptr);
  store.refresh_working_weights(device->stream(StreamKind::kCompute));
  EXPECT_EQ(store.working_refreshes(), 0u);
}

}  // namespace
}  // namespace ferry
