// memory.optimizer host: the host weights, gradient landing area and optimizer state are pinned
// blocks of the device's allocator, each placed (bound to the rank's NUMA node) before its first
// touch, zeroed, and given back when the store goes.
#include "trainer/exec/parameter_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "device/device.h"
#include "tests/trainer/golden/golden_net.h"

namespace ferry {
namespace {

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

}  // namespace
}  // namespace ferry
