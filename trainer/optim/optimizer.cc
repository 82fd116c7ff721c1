// SGD / AdamW launches (one per decay run), gradient clipping before them, and the schedules.
//
// Note [Clipping after the all-reduce]
// Session::update enqueues the step after GradientBuckets::finish has made the compute stream
// wait for every bucket's all-reduce, and passes that stream here: the norm is of the averaged
// gradients, the one torch.nn.utils.clip_grad_norm_ sees after DDP's backward, and every rank
// computes the same norm from the same bits (SumOfSquares is deterministic), so the ranks stay
// in step. ClipByNorm reads the sum on the device: no host wait.
#include "trainer/optim/optimizer.h"

#include <algorithm>
#include <cmath>

namespace ferry {

int optimizer_slots(const OptimizerOptions& options) {
  if (options.kind == OptimizerKind::kAdamW) return 2;
  return options.momentum > 0 ? 1 : 0;
}

bool decays(const ParameterStore::Entry& e, WeightDecayGroups groups) {
  return groups != WeightDecayGroups::kMatrices || e.desc.shape.rank() >= 2;
}

std::vector<DecayRun> decay_runs(const std::vector<ParameterStore::Entry>& params, int64_t floats,
                                 WeightDecayGroups groups, float weight_decay) {
  const int64_t n = floats;
  std::vector<DecayRun> runs;
  if (weight_decay == 0.0f || groups != WeightDecayGroups::kMatrices) return {{0, n, true}};
  // Entries are in block order; a run starts at the block's start, then at each parameter that
  // decays unlike the one before.
  for (const ParameterStore::Entry& e : params) {
    const bool d = decays(e, groups);
    const auto at = static_cast<int64_t>(e.offset / sizeof(float));
    if (runs.empty()) {
      runs.push_back({0, n, d});
    } else if (runs.back().decay != d) {
      runs.back().end = at;
      runs.push_back({at, n, d});
    }
  }
  if (runs.empty()) runs.push_back({0, n, true});
  return runs;
}

const std::vector<DecayRun>& Optimizer::runs(const ParameterStore& store) {
  if (runs_of_ != &store) {
    runs_ = decay_runs(store.params(), store.param_floats(), options_.decay, options_.weight_decay);
    runs_of_ = &store;
  }
  return runs_;
}

void Optimizer::step_range(Kernels& kernels, Stream& stream, const ParameterStore& store,
                           const Range& range, float lr) {
  ++steps_;
  launches_ = 0;
  for (const DecayRun& whole : runs(store)) {
    const int64_t b = std::max(whole.begin, range.begin), e = std::min(whole.end, range.end);
    if (b >= e) continue;
    const int64_t n = e - b, at = b - range.begin;
    const float wd = whole.decay ? options_.weight_decay : 0.0f;
    if (options_.kind == OptimizerKind::kSgd) {
      kernels.launch(
          SgdUpdate{n, lr, options_.momentum, wd, options_.nesterov, range.param + at,
                    range.grad + at, options_.momentum > 0 ? range.state[0] + at : nullptr},
          stream);
    } else {
      kernels.launch(
          AdamWUpdate{n, lr, options_.beta1, options_.beta2, options_.eps, wd, steps_,
                      range.param + at, range.grad + at, range.state[0] + at, range.state[1] + at},
          stream);
    }
    ++launches_;
  }
}

void Optimizer::step(Kernels& kernels, Stream& stream, ParameterStore& store, float lr) {
  ++steps_;
  store.mark_weights_changed();  // Note [The bf16 working copy]
  launches_ = 0;
  (void)runs(store);
  if (options_.clip_norm > 0) {
    // Note [Clipping after the all-reduce].
    const int64_t n = store.param_floats();
    kernels.launch(SumOfSquares{n, store.grad_block(), store.grad_sq_address()}, stream);
    kernels.launch(ClipByNorm{n, options_.clip_norm, store.grad_sq_address(), store.grad_block()},
                   stream);
    launches_ += 2;
  }
  for (const DecayRun& r : runs_) {
    const int64_t n = r.end - r.begin;
    const float wd = r.decay ? options_.weight_decay : 0.0f;
    float* param = store.param_block() + r.begin;
    const float* grad = store.grad_block() + r.begin;
    if (options_.kind == OptimizerKind::kSgd) {
      kernels.launch(
          SgdUpdate{n, lr, options_.momentum, wd, options_.nesterov, param, grad,
                    options_.momentum > 0 ? store.optimizer_block(0) + r.begin : nullptr},
          stream);
    } else {
      kernels.launch(
          AdamWUpdate{n, lr, options_.beta1, options_.beta2, options_.eps, wd, steps_, param, grad,
                      store.optimizer_block(0) + r.begin, store.optimizer_block(1) + r.begin},
          stream);
    }
    ++launches_;
  }
}

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  const int64_t after = step - warmup_steps;
  switch (kind) {
    case ScheduleKind::kConstant:
      return base_lr;
    case ScheduleKind::kStep:
      return base_lr * std::pow(gamma, static_cast<float>(after / std::max<int64_t>(step_size, 1)));
    case ScheduleKind::kCosine: {
      // The last update (number total_steps - 1) is at min_lr.
      const int64_t span = std::max<int64_t>(total_steps - 1 - warmup_steps, 1);
      const double progress = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
      return static_cast<float>(min_lr +
                                (base_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return base_lr;
}

}  // namespace ferry
