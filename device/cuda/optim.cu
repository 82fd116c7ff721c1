// Optimizer updates fused into one pass over the parameter block; the element code is the CPU
// backend's (device/optim_elements.h), and this target builds with --fmad=false, like the CPU's
// -ffp-contract=off, so the two round alike.
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"
#include "device/optim_elements.h"

namespace ferry::cuda {
namespace {

__global__ void sgd_kernel(int64_t n, float neg_lr, float momentum, float wd, bool nesterov,
                           float* p, const float* g, float* buf) {
  FERRY_GRID_STRIDE(i, n) { sgd_element(p, g, buf, i, neg_lr, momentum, wd, nesterov); }
}

__global__ void adamw_kernel(int64_t n, AdamScalars s, float* p, const float* g, float* m,
                             float* v) {
  FERRY_GRID_STRIDE(i, n) { adamw_element(p, g, m, v, i, s); }
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
