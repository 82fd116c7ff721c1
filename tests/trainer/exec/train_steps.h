// A few training steps through a Session with the synthetic data, for the tests that compare
// whole loss trajectories (offload equivalence on the CPU and on the GPU, CUDA/CPU parity):
// the per-step losses, the planned and the measured device peak, what the plan moves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace ferry {

struct TrainRun {
  std::vector<float> losses;  // one per step, read after the step
  uint64_t measured_peak = 0;
  uint64_t planned_peak = 0;
  uint64_t offload_bytes = 0;
  double recompute_flops = 0;
  int conv_recomputes = 0;  // recompute steps that run a convolution or a linear layer again
};

// Runs `steps` steps of `c` (one rank, synthetic data of c.data.samples samples).
TrainRun train_steps(const Config& c, int steps);

// A tight budget for auto: the peak vdnn-all plans (close to the floor) plus a margin; with
// recomputation, halfway from there to everything resident (a rebuild keeps its inputs on
// device, so recomputing needs some room).
uint64_t tight_budget(const Config& c, bool recompute);

// Expects the two loss trajectories to be equal bit for bit, naming `what` and the step.
void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b,
                          const std::string& what);

}  // namespace ferry
