// Timing the host optimizer's update on a one-parameter model in host memory.
#include "trainer/plan/host_update_timing.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "device/device.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/graph.h"

namespace ferry {

double time_host_update(const OptimizerOptions& options, int64_t floats) {
  constexpr int64_t kWidth = 1024;
  const int64_t rows = std::max<int64_t>(1, (floats + kWidth - 1) / kWidth);
  // One linear layer without bias: a (rows, 1024) weight, the store's only parameter.
  GraphBuilder b(Shape{1, kWidth, 1, 1}, rows);
  b.loss(b.linear(b.flatten(b.input(), "flatten"), "w", rows, /*bias=*/false));
  const Graph graph = b.finish();
  DeviceOptions cpu;
  cpu.backend = Backend::kCpu;
  cpu.memory = 2 * static_cast<uint64_t>(rows * kWidth) * sizeof(float) + (uint64_t{64} << 20);
  std::unique_ptr<Device> device = create_device(cpu);
  const int slots = optimizer_slots(options);
  StoreLayout layout;
  layout.host_optimizer = true;
  ParameterStore store(*device, graph, slots, layout);
  const int64_t n = store.update_end() - store.update_begin();
  Optimizer::Range r{store.update_begin(), store.update_end(), store.host_params(),
                     store.host_grads()};
  for (int s = 0; s < slots && s < 2; ++s) r.state[s] = store.optimizer_block(s);
  std::fill(store.host_grads(), store.host_grads() + n, 1e-3f);
  Optimizer optimizer(options);
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    optimizer.host_step(store, r, 1e-3f);
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rep > 0) best = std::min(best, t);  // the first run warms the pages and the threads
  }
  const double bytes = (2.0 * slots + 3) * sizeof(float) * static_cast<double>(n);
  return best > 0 ? bytes / best / 1e9 : 0;
}

}  // namespace ferry
