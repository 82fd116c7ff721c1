// Optimizers and learning-rate schedules. The update is one fused kernel launch over the
// whole parameter block (parameters, gradients and state share one layout), so its cost does
// not grow with the number of layers; decay groups (optim.decay) cut it into one launch per run
// of neighbouring parameters that decay alike, and gradient clipping (optim.clip_norm) adds two
// launches before it, all on the stream the caller passes, so nothing waits on the host.
#pragma once

#include <cstdint>
#include <vector>

#include "device/kernels.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/optim/kinds.h"

namespace ferry {

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  // Which parameters weight_decay applies to: kMatrices or kAll (kAuto is resolved by the caller
  // from the model; here it means kAll).
  WeightDecayGroups decay = WeightDecayGroups::kAll;
  // > 0: before the update, scale every gradient by min(1, clip_norm / (norm + 1e-6)), norm the
  // L2 norm of all gradients together (torch.nn.utils.clip_grad_norm_).
  float clip_norm = 0.0f;
};

// State blocks the optimizer needs: SGD with momentum 1, SGD without 0, AdamW 2.
int optimizer_slots(const OptimizerOptions& options);

// Whether parameter `e` is decayed under `groups`: always, or (kMatrices) when it has 2+
// dimensions.
bool decays(const ParameterStore::Entry& e, WeightDecayGroups groups);

// A range of the parameter block [begin, end) in floats, decayed or not.
struct DecayRun {
  int64_t begin = 0, end = 0;
  bool decay = true;
};

// A parameter block of `floats` floats holding `params` (in block order) cut into maximal runs of
// neighbouring parameters that decay alike (the padding after a parameter goes with it),
// covering [0, floats). One run when every parameter decays alike or `weight_decay` is 0.
std::vector<DecayRun> decay_runs(const std::vector<ParameterStore::Entry>& params, int64_t floats,
                                 WeightDecayGroups groups, float weight_decay);

class Optimizer {
 public:
  explicit Optimizer(const OptimizerOptions& options) : options_(options) {}
  // Enqueues one update of every parameter with learning rate `lr` on `stream`: with clipping,
  // first the gradients' sum of squares into store.grad_sq_address() and the scaling by it. Call
  // after the gradients are final on `stream` (averaged over ranks: GradientBuckets::finish).
  void step(Kernels& kernels, Stream& stream, ParameterStore& store, float lr);
  // The update of the floats [begin, end) of the parameter block only (ZeRO: the rank's shard),
  // with the same decay runs cut to that range. `param`, `grad` and `state[slot]` point at
  // element `begin`. No clipping here (the caller scales the gradients first). On the device,
  // through `kernels`; host_step runs the same element math on the host (host_update.h).
  struct Range {
    int64_t begin = 0, end = 0;
    float* param = nullptr;
    const float* grad = nullptr;
    float* state[2] = {nullptr, nullptr};
  };
  void step_range(Kernels& kernels, Stream& stream, const ParameterStore& store, const Range& r,
                  float lr);
  void host_step(const ParameterStore& store, const Range& r, float lr);
  // On the host, ClipByNorm's element math over `grad` (n floats) given the gradients' summed
  // squares: the same bits as the device's clipping (memory.optimizer host).
  static void host_clip_by_norm(float* grad, int64_t n, float sum_sq, float max_norm);
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  const OptimizerOptions& options() const { return options_; }
  // Whether step() measures the gradients' norm (into store.grad_sq_address()).
  bool measures_grad_norm() const { return options_.clip_norm > 0; }
  // Kernel launches of the last step() (clipping included).
  int launches() const { return launches_; }

 private:
  OptimizerOptions options_;
  int64_t steps_ = 0;
  int launches_ = 0;
  // The decay runs of `store`, cut once per store.
  const std::vector<DecayRun>& runs(const ParameterStore& store);
  std::vector<DecayRun> runs_;  // of the store seen first (one store per optimizer)
  const ParameterStore* runs_of_ = nullptr;
};

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::kConstant;
  float base_lr = 0.1f;
  int64_t warmup_steps = 0;  // linear warm-up from base_lr / warmup_steps
  int64_t step_size = 30;    // kStep: multiply by gamma every step_size steps after warm-up
  float gamma = 0.1f;
  float min_lr = 0.0f;  // kCosine: the floor reached at total_steps
  int64_t total_steps = 1;

  // The rate for update number `step` (0-based).
  float at(int64_t step) const;
};

}  // namespace ferry
