// A few training steps through a Session with the configured data (synthetic images, a token
// file), for the tests that compare
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
  int conv_recomputes = 0;       // recompute steps that run a convolution or a linear layer again
  int attention_recomputes = 0;  // recompute steps that rebuild attention probabilities
  // device.precision bf16: times the weights were narrowed into their bf16 working copy.
  uint64_t working_refreshes = 0;
};

// A token file's bytes (the tokens format: header, then uint16 tokens): 4096 tokens of a
// repeating pattern over a 64-word vocabulary, for the small GPTs and Llamas these tests train.
std::string small_token_file();

// Runs `steps` steps of `c` (one rank, the configured dataset, shuffled by run.seed).
TrainRun train_steps(const Config& c, int steps);

// A tight budget for auto: the peak vdnn-all plans (close to the floor) plus a margin; with
// recomputation, halfway from there to everything resident (a rebuild keeps its inputs on
// device, so recomputing needs some room).
uint64_t tight_budget(const Config& c, bool recompute);

// Expects the two loss trajectories to be equal bit for bit, naming `what` and the step.
void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b,
                          const std::string& what);

// One memory policy the offload-equivalence tests train under: at `base`'s budget or a tight
// one, with or without recomputation.
struct PolicyVariant {
  std::string name;
  MemoryPolicy policy = MemoryPolicy::kNone;
  bool tight = false;
  bool recompute = false;
};

// vdnn-conv, vdnn-all, auto at a tight budget, and auto at a tight budget with recompute.
std::vector<PolicyVariant> offload_policy_variants();

// Trains each variant of `base` for as many steps as `reference` has losses, in poison mode,
// and expects the losses bitwise equal to the reference's, the measured peak equal to the
// planned one and within budget; a variant that offloads plans a lower peak than the reference
// and moves or rebuilds something, and one with recompute rebuilds something.
void expect_policies_train_alike(const Config& base, const TrainRun& reference,
                                 const std::vector<PolicyVariant>& variants);

}  // namespace ferry
