// Optimizer updates, fused into one pass over the parameters, in float with the operation order
// of torch.optim's single-tensor code (scalars computed in double, as Python does, then rounded).
#include <cmath>

#include <fmt/format.h>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"

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

struct AdamScalars {
  float decay;  // 1 - lr * wd
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
};

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
  if (a.n < 0) throw ConfigError(fmt::format("sgd_update: negative element count {}", a.n));
  if (a.momentum != 0.0f && a.momentum_buf == nullptr) {
    throw ConfigError("sgd_update: momentum is set but there is no momentum buffer",
                      "allocate the optimizer state before the first step");
  }
  parallel_chunks(a.n, kParallelGrain, [&](int64_t b, int64_t e) {
    sgd(a.param + b, a.grad + b, a.momentum_buf ? a.momentum_buf + b : nullptr, e - b, a.lr,
        a.momentum, a.weight_decay, a.nesterov);
  });
}

void run(PlanCache&, const AdamWUpdate& a) {
  if (a.n < 0) throw ConfigError(fmt::format("adamw_update: negative element count {}", a.n));
  if (a.step < 1) {
    throw ConfigError(fmt::format("adamw_update: step {} (steps count from 1)", a.step),
                      "pass the number of this update, starting at 1");
  }
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2;
  const double bias1 = 1.0 - std::pow(b1, static_cast<double>(a.step));
  const double bias2 = 1.0 - std::pow(b2, static_cast<double>(a.step));
  AdamScalars s;
  s.decay = static_cast<float>(1.0 - lr * static_cast<double>(a.weight_decay));
  s.beta1 = a.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - b1);
  s.beta2 = a.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - b2);
  s.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  s.eps = a.eps;
  s.neg_step_size = static_cast<float>(-(lr / bias1));
  parallel_chunks(a.n, kParallelGrain, [&](int64_t b, int64_t e) {
    adamw(a.param + b, a.grad + b, a.m + b, a.v + b, e - b, s);
  });
}

}  // namespace ferry::cpu
