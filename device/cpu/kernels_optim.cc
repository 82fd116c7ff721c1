// Optimizer updates, fused into one pass over the parameters, in float with the operation order
// of torch.optim's single-tensor code (scalars computed in double, as Python does, then rounded).
#include <cmath>

#include "device/adamw_scalars.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

FERRY_SIMD_CLONES void sgd(float* p, const float* g, float* buf, int64_t n, float lr,
                           float momentum, float wd, bool nesterov) {
  const float neg_lr = -lr;
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (wd != 0.0f) d = d + wd * p[i];
    if (momentum != 0.0f) {
      const float b = momentum * buf[i] + d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    p[i] = p[i] + neg_lr * d;
  }
}

FERRY_SIMD_CLONES void adamw(float* p, const float* g, float* m, float* v, int64_t n,
                             AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    const float pi = p[i] * s.decay;
    const float mi = m[i] * s.beta1 + g[i] * s.one_minus_beta1;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / s.bias2_sqrt + s.eps;
    p[i] = pi + s.neg_step_size * (mi / denom);
  }
}

}  // namespace

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
