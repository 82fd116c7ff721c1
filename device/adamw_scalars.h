// AdamW's per-step scalars, computed once on the host for every backend's update kernel, so the
// CPU loop and the CUDA kernel start from the same floats. Invariant: computed in double, as
// torch.optim does in Python, then rounded to float once. Stays C++17 (CUDA's kernel_ops.h).
#pragma once

namespace ferry {

struct AdamWUpdate;

struct AdamScalars {
  float decay;  // 1 - lr * wd
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
};

// The scalars of update `a` (a.step >= 1: check_adamw_update, kernel_checks.h).
AdamScalars adamw_scalars(const AdamWUpdate& a);

}  // namespace ferry
