// Kernel argument structs of gradient clipping and the optimizers (PyTorch's SGD and AdamW).
// Included by kernels.h, whose conventions hold: row-major, device pointers, fp32 elements.
#pragma once

#include <cstdint>

namespace ferry {

// ---- gradient clipping -------------------------------------------------------------------------

// out[0] = sum of x[i]^2 over i < n, a deterministic float sum (the same bits on every run).
struct SumOfSquares {
  int64_t n = 0;
  const float* x = nullptr;
  float* out = nullptr;
};

// torch.nn.utils.clip_grad_norm_'s scaling: y *= min(1, max_norm / (sqrt(sum_sq[0]) + 1e-6)),
// reading sum_sq on the device (no host wait).
struct ClipByNorm {
  int64_t n = 0;
  float max_norm = 1.0f;
  const float* sum_sq = nullptr;
  float* y = nullptr;
};

// ---- optimizers --------------------------------------------------------------------------------

// torch.optim.SGD (dampening 0): d = g + wd * p; buf = momentum * buf + d (buf starts at zero,
// which equals PyTorch's first-step copy); d = nesterov ? d + momentum * buf : buf;
// p -= lr * d. With momentum 0, buf is unused and may be null.
struct SgdUpdate {
  int64_t n = 0;
  float lr = 0.0f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentum_buf = nullptr;
};

// torch.optim.AdamW: p *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), t = step >= 1.
struct AdamWUpdate {
  int64_t n = 0;
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  int64_t step = 1;
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};

}  // namespace ferry
