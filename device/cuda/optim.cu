// Optimizer updates fused into one pass over the parameter block, with the operation order of
// the CPU backend (device/cpu/kernels_optim.cc, torch.optim's single-tensor code); this target
// builds with --fmad=false, like the CPU's -ffp-contract=off, so the two round alike.
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"

namespace ferry::cuda {
namespace {

__global__ void sgd_kernel(int64_t n, float neg_lr, float momentum, float wd, bool nesterov,
                           float* p, const float* g, float* buf) {
  FERRY_GRID_STRIDE(i, n) {
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

__global__ void adamw_kernel(int64_t n, AdamScalars s, float* p, const float* g, float* m,
                             float* v) {
  FERRY_GRID_STRIDE(i, n) {
    const float gi = g[i];
    const float pi = p[i] * s.decay;
    const float mi = m[i] * s.beta1 + gi * s.one_minus_beta1;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / s.bias2_sqrt + s.eps;
    p[i] = pi + s.neg_step_size * (mi / denom);
  }
}

}  // namespace

void launch_sgd_update(int64_t n, float lr, float momentum, float weight_decay, bool nesterov,
                       float* param, const float* grad, float* momentum_buf, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(sgd_kernel, grid_for(n), kThreads, stream, n, -lr, momentum, weight_decay, nesterov,
                param, grad, momentum_buf);
}

void launch_adamw_update(int64_t n, const AdamScalars& s, float* param, const float* grad, float* m,
                         float* v, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(adamw_kernel, grid_for(n), kThreads, stream, n, s, param, grad, m, v);
}

}  // namespace ferry::cuda
