// memory.optimizer host: the optimizer update on the host, multi-threaded over fixed chunks and
// vectorized, with the element math of device/optim_elements.h and this file built like the CPU
// backend's kernels (-ffp-contract=off), so its bits equal the device update's.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "device/adamw_scalars.h"
#include "device/kernels.h"
#include "device/optim_elements.h"
#include "trainer/optim/optimizer.h"

namespace ferry {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FERRY_HOST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FERRY_HOST_CLONES
#endif

constexpr int64_t kChunk = int64_t{1} << 15;

FERRY_HOST_CLONES void sgd_loop(float* p, const float* g, float* buf, int64_t n, float lr,
                                float momentum, float wd, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) sgd_element(p, g, buf, i, -lr, momentum, wd, nesterov);
}

FERRY_HOST_CLONES void adamw_loop(float* p, const float* g, float* m, float* v, int64_t n,
                                  AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p, g, m, v, i, s);
}

// body(begin, end) over fixed chunks of [0, n), in parallel.
template <typename Body>
void chunks(int64_t n, const Body& body) {
  const int64_t count = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t c = 0; c < count; ++c) body(c * kChunk, std::min(n, (c + 1) * kChunk));
}

FERRY_HOST_CLONES void scale_loop(float* y, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * s;
}

}  // namespace

// The CPU backend's ClipByNorm (device/cpu/kernels_optim.cc): torch's clip_grad_norm_ in float32.
void Optimizer::host_clip_by_norm(float* grad, int64_t n, float sum_sq, float max_norm) {
  const float total = std::sqrt(sum_sq);
  const float coef = (1.0f / (total + 1e-6f)) * max_norm;
  const float clamped = coef > 1.0f ? 1.0f : coef;
  if (clamped == 1.0f) return;  // y * 1 == y
  chunks(n, [&](int64_t b, int64_t e) { scale_loop(grad + b, e - b, clamped); });
}

void Optimizer::host_step(const ParameterStore& store, const Range& range, float lr) {
  ++steps_;
  launches_ = 0;
  for (const DecayRun& whole : runs(store)) {
    const int64_t b = std::max(whole.begin, range.begin), e = std::min(whole.end, range.end);
    if (b >= e) continue;
    const int64_t n = e - b, at = b - range.begin;
    const float wd = whole.decay ? options_.weight_decay : 0.0f;
    float* p = range.param + at;
    const float* g = range.grad + at;
    if (options_.kind == OptimizerKind::kSgd) {
      float* buf = options_.momentum > 0 ? range.state[0] + at : nullptr;
      chunks(n, [&](int64_t cb, int64_t ce) {
        sgd_loop(p + cb, g + cb, buf ? buf + cb : nullptr, ce - cb, lr, options_.momentum, wd,
                 options_.nesterov);
      });
    } else {
      const AdamScalars s =
          adamw_scalars(AdamWUpdate{n, lr, options_.beta1, options_.beta2, options_.eps, wd, steps_,
                                    p, g, range.state[0] + at, range.state[1] + at});
      float* m = range.state[0] + at;
      float* v = range.state[1] + at;
      chunks(n, [&](int64_t cb, int64_t ce) {
        adamw_loop(p + cb, g + cb, m + cb, v + cb, ce - cb, s);
      });
    }
  }
}

}  // namespace ferry
