// A few training steps through a Session with the synthetic data, for the tests that compare
// whole loss trajectories (offload equivalence on the CPU and on the GPU, CUDA/CPU parity):
// the per-step losses, the planned and the measured device peak, what the plan moves.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/config/config.h"

namespace ferry {

struct TrainRun {
  std::vector<float> losses;  // one per step, read after the step
  uint64_t measured_peak = 0;
  uint64_t planned_peak = 0;
  uint64_t offload_bytes = 0;
  double recompute_flops = 0;
};

// Runs `steps` steps of `c` (one rank, synthetic data of c.data.samples samples).
TrainRun train_steps(const Config& c, int steps);

}  // namespace ferry
