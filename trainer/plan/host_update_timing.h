// The host optimizer's update timed on this machine (memory.optimizer host): the rate the
// measured cost model gives it instead of CostModel's default. Invariant: the bytes counted are
// the update's own streams, (2 * slots + 3) floats per parameter.
#pragma once

#include <cstdint>

#include "trainer/optim/optimizer.h"

namespace ferry {

// Note [A timed host update]
// The update the host optimizer runs (Optimizer::host_step: OpenMP over fixed chunks, the
// device's element math) over `floats` parameters in host memory, with `options`' kind and state
// blocks: the best of 3 runs after one warm-up. Returns GB/s of (2 * slots + 3) * 4 bytes per
// parameter: every array read (weights, gradients, each state block) and written (weights, each
// state block), what model_state_seconds charges (trainer/plan/model_state.h). `floats` is
// rounded up to a multiple of 1024; take it well above the last-level cache (the default, 8M
// floats, streams 224 MB for AdamW) so the rate is memory's, as a model's shard is.
double time_host_update(const OptimizerOptions& options, int64_t floats = int64_t{1} << 23);

}  // namespace ferry
