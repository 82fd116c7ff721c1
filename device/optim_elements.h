// One element of each optimizer update (SGD, AdamW), included by the CPU loop and the CUDA kernel
// so both backends run the same float operations in the same order (torch.optim's single-tensor
// code) and agree bit for bit. C++17, for nvcc.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/adamw_scalars.h"
#include "device/host_device.h"

namespace ferry {

// SGD on element i: weight decay, then momentum (buf is null when momentum is 0), then the step.
FERRY_HOST_DEVICE inline void sgd_element(float* p, const float* g, float* buf, int64_t i,
                                          float neg_lr, float momentum, float wd, bool nesterov) {
  float d = g[i];
  if (wd != 0.0f) d = d + wd * p[i];
  if (momentum != 0.0f) {
    const float b = momentum * buf[i] + d;
    buf[i] = b;
    d = nesterov ? d + momentum * b : b;
  }
  p[i] = p[i] + neg_lr * d;
}

// AdamW on element i: decoupled weight decay, the two moments, then the bias-corrected step.
FERRY_HOST_DEVICE inline void adamw_element(float* p, const float* g, float* m, float* v, int64_t i,
                                            const AdamScalars& s) {
  const float gi = g[i];
  const float pi = p[i] * s.decay;
  const float mi = m[i] * s.beta1 + gi * s.one_minus_beta1;
  const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float denom = std::sqrt(vi) / s.bias2_sqrt + s.eps;
  p[i] = pi + s.neg_step_size * (mi / denom);
}

}  // namespace ferry
