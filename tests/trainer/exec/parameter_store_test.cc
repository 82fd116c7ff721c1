// The parameter store: its bf16 working copy (Note [The bf16 working copy]), every weight rounded
// to bf16 once per update, planned bytes equal to the bytes held; and memory.optimizer host's
// pinned host blocks, each placed on the rank's NUMA node before its first touch and zeroed; bf16
// master weights sharded by rank (Note [Sharded master weights]).
#include "trainer/exec/parameter_store.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "device/bf16.h"
#include "device/device.h"
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

struct Placed {
  std::vector<std::pair<const char*, uint64_t>> blocks;  // [addr, addr + bytes) placed
  // Whether [p, p + bytes) lies inside one placed block.
  bool holds(const void* p, uint64_t bytes) const {
    const auto* a = static_cast<const char*>(p);
    for (const auto& [b, n] : blocks)
      if (a >= b && a + bytes <= b + n) return true;
    return false;
  }
};

TEST(ParameterStore, HostOptimizerStateIsPinnedAndPlacedBeforeFirstTouch) {
  auto placed = std::make_shared<Placed>();
  DeviceOptions o;
  o.memory = 64 << 20;
  o.place_host_memory = [placed](void* addr, uint64_t bytes) {
    placed->blocks.emplace_back(static_cast<const char*>(addr), bytes);
  };
  auto device = create_device(o);
  const Graph g = build_golden_net(4);
  for (const bool sharded : {false, true}) {
    placed->blocks.clear();
    StoreLayout layout;
    layout.host_optimizer = true;
    if (sharded) {
      const int64_t floats =
          static_cast<int64_t>(ParameterStore::plan_bytes(g, 2).weights / sizeof(float));
      layout.ranks = 2;
      layout.rank = 1;
      layout.shard_floats = (floats + 31) / 32 * 16;
      layout.shard_optimizer = true;
    }
    {
      ParameterStore store(*device, g, /*optimizer_slots=*/2, layout);
      const int64_t n = store.update_end() - store.update_begin();
      ASSERT_GT(n, 0);
      const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
      EXPECT_EQ(store.host_bytes(), 4 * bytes) << "weights, gradients and two moments";
      ASSERT_EQ(placed->blocks.size(), 4u) << "one placed pinned block each";
      EXPECT_TRUE(placed->holds(store.host_params(), bytes));
      EXPECT_TRUE(placed->holds(store.host_grads(), bytes));
      for (int s = 0; s < 2; ++s) {
        EXPECT_TRUE(placed->holds(store.optimizer_block(s), bytes)) << s;
        const std::vector<float> state = store.read_local_optimizer(s);
        ASSERT_EQ(static_cast<int64_t>(state.size()), n);
        for (float v : state) ASSERT_EQ(v, 0.0f);
      }
      // Not on the device: the device block holds no optimizer state.
      EXPECT_EQ(store.bytes().optimizer, 0u);
      std::vector<float> ones(static_cast<size_t>(n), 1.0f);
      store.write_local_optimizer(1, ones.data());
      EXPECT_EQ(store.read_local_optimizer(1), ones);
    }
  }
}

// Note [Sharded master weights]: two ranks' stores of the golden CNN under bf16 and zero 1 hold
// their shard of the masters, the whole working copy and the fp32 weights (batch norm's gains and
// shifts, conv4's and fc's biases) with zero 0's bits; convolutions' and fc's weights have no
// fp32 copy; the ranks' parts of the fp32 block tile it; publish and write_param keep the three
// in step.
TEST(ParameterStore, ShardedMastersKeepTheShardTheWorkingCopyAndTheFp32Weights) {
  auto device = cpu_device();
  const Graph graph = bf16_golden_net(kGoldenBatch);
  ParameterStore whole(*device, graph, 2, {}, false, Precision::kBf16);
  whole.initialize(graph, 7);
  whole.refresh_working_weights(device->stream(StreamKind::kCompute));
  const int64_t floats = whole.param_floats();
  const int64_t S = ((floats + 1) / 2 + 63) / 64 * 64;
  std::vector<float> layout(static_cast<size_t>(2 * S));
  for (size_t i = 0; i < whole.params().size(); ++i) {
    const auto bytes = whole.read_param(i);
    std::memcpy(layout.data() + whole.params()[i].offset / 4, bytes.data(), bytes.size());
  }
  const std::vector<uint16_t> want_working = read_bf16(*device, whole.working_floats(), floats);
  int64_t tiled = 0;
  for (int rank : {0, 1}) {
    StoreLayout l;
    l.ranks = 2;
    l.rank = rank;
    l.shard_floats = S;
    l.shard_optimizer = true;
    ParameterStore store(*device, graph, 2, l, false, Precision::kBf16);
    store.initialize(graph, 7);
    ASSERT_TRUE(store.split_masters());
    EXPECT_EQ(store.bytes().weights,
              static_cast<uint64_t>(S) * 4 + ParameterStore::fp32_weight_bytes(graph));
    EXPECT_EQ(store.fp32_weights_bytes(), ParameterStore::fp32_weight_bytes(graph));
    const std::vector<float> masters = store.read_masters();
    ASSERT_EQ(masters.size(), static_cast<size_t>(S));
    EXPECT_EQ(std::memcmp(masters.data(), layout.data() + rank * S, S * 4), 0) << rank;
    EXPECT_EQ(read_bf16(*device, store.working_floats(), floats), want_working) << rank;
    for (size_t i = 0; i < store.params().size(); ++i) {
      const auto& e = store.params()[i];
      const bool product_weight =
          (e.name.starts_with("conv") || e.name.starts_with("fc")) && e.name.ends_with(".weight");
      EXPECT_EQ(store.reads_fp32(i), !product_weight) << e.name;
      const void* at = store.address(graph, graph.params()[i]);
      if (!store.reads_fp32(i)) {
        EXPECT_EQ(at, nullptr) << e.name;
        continue;
      }
      std::vector<float> got(static_cast<size_t>(e.desc.shape.numel()));
      Stream& s = device->stream(StreamKind::kCompute);
      device->copy_async(got.data(), at, got.size() * 4, s);
      s.synchronize();
      EXPECT_EQ(std::memcmp(got.data(), layout.data() + e.offset / 4, got.size() * 4), 0) << e.name;
    }
    const auto [begin, end] = store.fp32_part(rank);
    EXPECT_EQ(begin, tiled) << rank;
    EXPECT_LE(begin, end);
    tiled = end;
    if (rank == 1) {
      // The last rank's part ends where the fp32 weights end (the block is whole granules).
      EXPECT_LE(static_cast<uint64_t>(end) * 4, store.fp32_weights_bytes());
      EXPECT_GT(static_cast<uint64_t>(end) * 4 + 256, store.fp32_weights_bytes());
    }

    // A write of bn1's gain and of fc's weight reaches the shard, the fp32 block and the copy.
    for (const char* name : {"bn1.weight", "fc.weight"}) {
      size_t i = 0;
      while (store.params()[i].name != name) ++i;
      const auto& e = store.params()[i];
      std::vector<float> v(static_cast<size_t>(e.desc.shape.numel()));
      for (size_t k = 0; k < v.size(); ++k) v[k] = 0.001f * static_cast<float>(k) + 1.0f / 3;
      store.write_param(i, v.data());
      const auto begin_f = static_cast<int64_t>(e.offset / 4);
      const std::vector<float> m = store.read_masters();
      for (size_t k = 0; k < v.size(); ++k) {
        const int64_t at = begin_f + static_cast<int64_t>(k);
        if (at >= rank * S && at < rank * S + S) {
          ASSERT_EQ(m[static_cast<size_t>(at - rank * S)], v[k]) << name;
        }
      }
      const std::vector<uint16_t> w =
          read_bf16(*device, static_cast<std::byte*>(store.working_at(begin_f)), v.size());
      for (size_t k = 0; k < v.size(); ++k) ASSERT_EQ(w[k], float_to_bf16(v[k]).bits) << name;
    }
  }
  EXPECT_GT(tiled, 0);
}

}  // namespace
}  // namespace ferry
