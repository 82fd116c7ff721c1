// Optimizer updates, fused into one pass over the parameters, in float with the operation order
// of torch.optim's single-tensor code (scalars computed in double, as Python does, then rounded),
// and gradient clipping by global norm (Note [A deterministic sum of squares]).
#include <algorithm>
#include <cmath>
#include <vector>

#include "device/adamw_scalars.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"
#include "device/optim_elements.h"

namespace ferry::cpu {
namespace {

// Note [A deterministic sum of squares]
// SumOfSquares cuts x into fixed chunks of kSumChunk values (a function of n only, never of the
// thread count), each summed by one task: lane l of kSumLanes adds the squares of the chunk's
// values l, l + kSumLanes, ... in double, in order, and the lanes are added by a pairwise tree.
// The chunks' sums are then added in chunk order, in double, and the total rounded to float once.
// So the bits depend on the values alone, whatever the threads and their timing.
constexpr int kSumLanes = 16;
constexpr int64_t kSumChunk = int64_t{1} << 16;

FERRY_SIMD_CLONES double chunk_sum_of_squares(const float* x, int64_t n) {
  double acc[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      acc[l] += v * v;
    }
  }
  for (int l = 0; i + l < n; ++l) {
    const double v = static_cast<double>(x[i + l]);
    acc[l] += v * v;
  }
  for (int half = kSumLanes / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; ++l) acc[l] += acc[l + half];
  }
  return acc[0];
}

FERRY_SIMD_CLONES void scale(float* y, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * s;
}

FERRY_SIMD_CLONES void sgd(float* p, const float* g, float* buf, int64_t n, float lr,
                           float momentum, float wd, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) sgd_element(p, g, buf, i, -lr, momentum, wd, nesterov);
}

FERRY_SIMD_CLONES void adamw(float* p, const float* g, float* m, float* v, int64_t n,
                             AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p, g, m, v, i, s);
}

}  // namespace

void run(PlanCache&, const SumOfSquares& a) {
  check_element_count(a.n, "sum_of_squares");
  const int64_t chunks = (a.n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  parallel_items(chunks, a.n, [&](int64_t c) {
    const int64_t begin = c * kSumChunk;
    partial[c] = chunk_sum_of_squares(a.x + begin, std::min(a.n, begin + kSumChunk) - begin);
  });
  double total = 0.0;
  for (double p : partial) total += p;
  a.out[0] = static_cast<float>(total);
}

void run(PlanCache&, const ClipByNorm& a) {
  check_element_count(a.n, "clip_by_norm");
  // torch.nn.utils.clip_grad_norm_ in float32 tensors: total_norm + 1e-6, max_norm / that (which
  // Tensor.__rtruediv__ computes as reciprocal() * max_norm), clamp(max=1.0), which keeps NaN.
  const float total = std::sqrt(a.sum_sq[0]);
  const float coef = (1.0f / (total + 1e-6f)) * a.max_norm;
  const float clamped = coef > 1.0f ? 1.0f : coef;
  if (clamped == 1.0f) return;  // y * 1 == y: the pass would change no bit
  parallel_chunks(a.n, kParallelGrain,
                  [&](int64_t b, int64_t e) { scale(a.y + b, e - b, clamped); });
}

void run(PlanCache&, const SgdUpdate& a) {
  check_sgd_update(a);
  parallel_chunks(a.n, kParallelGrain, [&](int64_t b, int64_t e) {
    sgd(a.param + b, a.grad + b, a.momentum_buf ? a.momentum_buf + b : nullptr, e - b, a.lr,
        a.momentum, a.weight_decay, a.nesterov);
  });
}

void run(PlanCache&, const AdamWUpdate& a) {
  check_adamw_update(a);
  const AdamScalars s = adamw_scalars(a);
  parallel_chunks(a.n, kParallelGrain, [&](int64_t b, int64_t e) {
    adamw(a.param + b, a.grad + b, a.m + b, a.v + b, e - b, s);
  });
}

}  // namespace ferry::cpu
