// Batch normalisation on plain NCHW: one block per channel. Statistics and gradient sums are
// accumulated in double per thread, then summed by a fixed tree (launch.cuh), so the results
// are the same bits on every run; two passes (mean, then squared deviations) as the CPU backend.
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"

namespace ferry::cuda {
namespace {

// Threads per channel block: a power of two (block_sum).
constexpr int kBnThreads = 512;

// Element e of a channel's N*HW values, as an offset from the channel's first plane. N*HW fits
// in 32 bits (cuda_ops.cc checks), so the division is the cheap 32-bit one.
__device__ int64_t channel_offset(int64_t e, int64_t hw, int64_t stride) {
  const uint32_t plane = static_cast<uint32_t>(e) / static_cast<uint32_t>(hw);
  return static_cast<int64_t>(plane) * stride + (e - static_cast<int64_t>(plane) * hw);
}

__global__ void __launch_bounds__(kBnThreads)
    bn_forward_training_kernel(BatchNormShape s, float momentum, const float* x, const float* gamma,
                               const float* beta, float* y, float* running_mean, float* running_var,
                               float* save_mean, float* save_var) {
  const int64_t c = blockIdx.x;
  const int64_t count = s.n * s.hw, stride = s.c * s.hw;
  const float* xc = x + c * s.hw;
  double sum = 0.0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    sum += static_cast<double>(xc[channel_offset(e, s.hw, stride)]);
  }
  const double mean = block_sum(sum) / static_cast<double>(count);
  double sq = 0.0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const double d = static_cast<double>(xc[channel_offset(e, s.hw, stride)]) - mean;
    sq += d * d;
  }
  const double var = block_sum(sq) / static_cast<double>(count);
  const double invstd = 1.0 / sqrt(var + static_cast<double>(s.eps));
  const float mean_f = static_cast<float>(mean);
  const float scale = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
  const float shift = beta[c];
  float* yc = y + c * s.hw;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t at = channel_offset(e, s.hw, stride);
    yc[at] = (xc[at] - mean_f) * scale + shift;
  }
  if (threadIdx.x == 0) {
    const double m = momentum;
    const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
    if (save_mean != nullptr) save_mean[c] = mean_f;
    if (save_var != nullptr) save_var[c] = static_cast<float>(var);
    if (running_mean != nullptr) {
      running_mean[c] = static_cast<float>((1.0 - m) * running_mean[c] + m * mean);
    }
    if (running_var != nullptr) {
      running_var[c] = static_cast<float>((1.0 - m) * running_var[c] + m * var * unbias);
    }
  }
}

__global__ void bn_forward_inference_kernel(BatchNormShape s, const float* x, const float* gamma,
                                            const float* beta, const float* running_mean,
                                            const float* running_var, float* y) {
  const int64_t total = s.n * s.c * s.hw;
  FERRY_GRID_STRIDE(q, total) {
    const int64_t c = (q / s.hw) % s.c;
    const double invstd =
        1.0 / sqrt(static_cast<double>(running_var[c]) + static_cast<double>(s.eps));
    const float scale = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
    y[q] = (x[q] - running_mean[c]) * scale + beta[c];
  }
}

__global__ void __launch_bounds__(kBnThreads)
    bn_backward_kernel(BatchNormShape s, const float* x, const float* dy, const float* gamma,
                       const float* save_mean, const float* save_var, float* dx, float* dgamma,
                       float* dbeta) {
  const int64_t c = blockIdx.x;
  const int64_t count = s.n * s.hw, stride = s.c * s.hw;
  const float* xc = x + c * s.hw;
  const float* dyc = dy + c * s.hw;
  const double mean = save_mean[c];
  const double invstd = 1.0 / sqrt(static_cast<double>(save_var[c]) + static_cast<double>(s.eps));
  double a = 0.0, b = 0.0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t at = channel_offset(e, s.hw, stride);
    const double g = static_cast<double>(dyc[at]);
    a += g;
    b += g * (static_cast<double>(xc[at]) - mean);
  }
  const double sum_dy = block_sum(a);
  const double sum_dyx = block_sum(b);
  const double n = static_cast<double>(count);
  const float k1 = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
  const float k2 = static_cast<float>(invstd * invstd * sum_dyx / n);
  const float mean_dy = static_cast<float>(sum_dy / n);
  const float mean_f = save_mean[c];
  float* dxc = dx + c * s.hw;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t at = channel_offset(e, s.hw, stride);
    dxc[at] = (dyc[at] - mean_dy - (xc[at] - mean_f) * k2) * k1;
  }
  if (threadIdx.x == 0) {
    dbeta[c] = static_cast<float>(sum_dy);
    dgamma[c] = static_cast<float>(sum_dyx * invstd);
  }
}

}  // namespace

void launch_batch_norm_forward_training(const BatchNormShape& s, float momentum, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* running_mean, float* running_var, float* save_mean,
                                        float* save_var, cudaStream_t stream) {
  launch_kernel(bn_forward_training_kernel, static_cast<unsigned int>(s.c), kBnThreads, stream, s,
                momentum, x, gamma, beta, y, running_mean, running_var, save_mean, save_var);
}

void launch_batch_norm_forward_inference(const BatchNormShape& s, const float* x,
                                         const float* gamma, const float* beta,
                                         const float* running_mean, const float* running_var,
                                         float* y, cudaStream_t stream) {
  const int64_t total = s.n * s.c * s.hw;
  launch_kernel(bn_forward_inference_kernel, grid_for(total), kThreads, stream, s, x, gamma, beta,
                running_mean, running_var, y);
}

void launch_batch_norm_backward(const BatchNormShape& s, const float* x, const float* dy,
                                const float* gamma, const float* save_mean, const float* save_var,
                                float* dx, float* dgamma, float* dbeta, cudaStream_t stream) {
  launch_kernel(bn_backward_kernel, static_cast<unsigned int>(s.c), kBnThreads, stream, s, x, dy,
                gamma, save_mean, save_var, dx, dgamma, dbeta);
}

}  // namespace ferry::cuda
