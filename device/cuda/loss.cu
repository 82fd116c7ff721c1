// Softmax cross-entropy. Forward: one block, one row per thread in double precision (as the CPU
// backend), the batch's loss and correct count summed on the device by a fixed tree, so the
// loss is the same bits on every run and nothing waits on the host. Backward: one thread per
// logit.
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"

namespace ferry::cuda {
namespace {

// Threads of the forward block: a power of two (block_sum). Rows beyond it loop.
constexpr int kLossThreads = 256;

__global__ void __launch_bounds__(kLossThreads)
    xent_forward_kernel(int64_t n, int64_t k, const float* logits, const int32_t* labels,
                        float* loss, float* probs, int32_t* correct) {
  const double nan = __longlong_as_double(0x7ff8000000000000ll);
  double row_losses = 0.0;
  int hits = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float* z = logits + i * k;
    const int32_t label = labels[i];
    const bool valid = label >= 0 && label < k;
    int64_t argmax = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (z[j] > z[argmax]) argmax = j;
    }
    const double top = z[argmax];
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += exp(static_cast<double>(z[j]) - top);
    const double lse = valid ? top + log(sum) : nan;
    if (probs != nullptr) {
      float* p = probs + i * k;
      for (int64_t j = 0; j < k; ++j) p[j] = static_cast<float>(exp(z[j] - lse));
    }
    row_losses += valid ? lse - static_cast<double>(z[label]) : nan;
    hits += valid && argmax == label ? 1 : 0;
  }
  const double total = block_sum(row_losses);
  const int total_hits = block_sum(hits);
  if (threadIdx.x == 0) {
    loss[0] = static_cast<float>(total / static_cast<double>(n));
    if (correct != nullptr) correct[0] = total_hits;
  }
}

__global__ void xent_backward_kernel(int64_t n, int64_t k, float factor, const float* probs,
                                     const int32_t* labels, float* dlogits) {
  const float nan = __int_as_float(0x7fc00000);
  FERRY_GRID_STRIDE(q, n * k) {
    const int64_t i = q / k, j = q % k;
    const int32_t label = labels[i];
    if (label < 0 || label >= k) {
      dlogits[q] = nan;
      continue;
    }
    dlogits[q] = (probs[q] - (j == label ? 1.0f : 0.0f)) * factor;
  }
}

}  // namespace

void launch_softmax_cross_entropy_forward(int64_t n, int64_t k, const float* logits,
                                          const int32_t* labels, float* loss, float* probs,
                                          int32_t* correct, cudaStream_t stream) {
  launch_kernel(xent_forward_kernel, 1, kLossThreads, stream, n, k, logits, labels, loss, probs,
                correct);
}

void launch_softmax_cross_entropy_backward(int64_t n, int64_t k, float factor, const float* probs,
                                           const int32_t* labels, float* dlogits,
                                           cudaStream_t stream) {
  launch_kernel(xent_backward_kernel, grid_for(n * k), kThreads, stream, n, k, factor, probs,
                labels, dlogits);
}

}  // namespace ferry::cuda
