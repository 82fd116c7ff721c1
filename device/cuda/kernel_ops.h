// Host entry points of the CUDA kernels in pool.cu, batchnorm.cu, activation.cu, loss.cu and
// optim.cu. Each enqueues its kernels on `stream` and returns: no host synchronisation, no
// float atomics (every reduction has a fixed order, so results are the same bits run to run).
// Arguments are checked by the caller (cuda_ops.cc); this header stays C++17 for nvcc. A `dtype`
// parameter is the storage of the kernel's bf16-eligible float operands (Note [Storage dtype of a
// kernel] in device/kernels.h; Note [bf16 storage in the CUDA kernels] in storage.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/adamw_scalars.h"
#include "device/batch_norm_order.h"
#include "device/dtype.h"

namespace ferry::cuda {

// ---- reduction scratch ------------------------------------------------------------------------

// Note [Deterministic multi-block reductions]
// Batch norm's statistics and gradient sums and the loss's batch total span many blocks. No
// float atomics: every block writes the partial sum of a fixed piece of the data (double) to its
// own slot of a scratch buffer, and a later kernel adds a channel's partials in slot order. How
// the data is cut into pieces is a function of the shape only (batch_norm_split in
// device/batch_norm_order.h, loss.cu's row pieces), and inside a piece the order is fixed by
// logical lanes, not by blockDim; the grid only decides which block computes which piece. So the
// bits are the same on every run, for every grid (any SM count), and in the host emulation. The
// scratch is one fixed buffer per GPU, allocated with the device block (CudaDevice) and never per
// launch. One launch uses it at a time: the reducing kernels run on the device's compute stream
// only (CudaKernels::launch asserts it), so stream order separates them.

// Partial sums per quantity (two quantities: A and B); batch norm's chunks of all channels fit.
constexpr int64_t kReductionPartials = kBatchNormMaxPartials;
// Channels of the per-channel statistics (four doubles each); batch norm refuses more.
constexpr int64_t kReductionChannels = 4096;
// The scratch: partials A, partials B, then four per-channel statistics, in doubles.
constexpr int64_t kReductionScratchDoubles = 2 * kReductionPartials + 4 * kReductionChannels;
constexpr uint64_t kReductionScratchBytes = kReductionScratchDoubles * sizeof(double);  // 384 KiB

// The scratch a reducing kernel uses, and the GPU's multiprocessor count, which sizes grids only.
struct ReductionScratch {
  double* ptr = nullptr;  // kReductionScratchDoubles doubles of device memory
  int sm_count = 1;
};

// ---- pooling (pool.cu) --------------------------------------------------------------------

// PoolGeom with its output size resolved. Planes are the N*C (H, W) images.
struct PoolShape {
  bool max = true;
  int64_t planes = 1, h = 1, w = 1, oh = 1, ow = 1;
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool count_include_pad = true;
};

// x (planes, H, W) -> y (planes, OH, OW).
void launch_pool_forward(const PoolShape& s, const float* x, float* y, DType dtype,
                         cudaStream_t stream);
// Overwrites dx (planes, H, W) from dy (planes, OH, OW); x is read for max pooling only.
void launch_pool_backward(const PoolShape& s, const float* x, const float* dy, float* dx,
                          DType dtype, cudaStream_t stream);

// x (planes, H, W) -> y (planes, OH, OW), PyTorch's adaptive cells.
void launch_adaptive_avg_pool_forward(int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                      const float* x, float* y, DType dtype, cudaStream_t stream);
// Overwrites dx (planes, H, W).
void launch_adaptive_avg_pool_backward(int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                       const float* dy, float* dx, DType dtype,
                                       cudaStream_t stream);

// ---- batch normalisation (batchnorm.cu) ------------------------------------------------------

struct BatchNormShape {
  int64_t n = 1, c = 1, hw = 1;
  float eps = 1e-5f;
};

// Several blocks per channel, reduced through `scratch` (Note [Deterministic multi-block
// reductions]); s.c <= kReductionChannels. running_* and save_* may each be null (not written).
void launch_batch_norm_forward_training(const BatchNormShape& s, float momentum, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* running_mean, float* running_var, float* save_mean,
                                        float* save_var, DType dtype,
                                        const ReductionScratch& scratch, cudaStream_t stream);
void launch_batch_norm_forward_inference(const BatchNormShape& s, const float* x,
                                         const float* gamma, const float* beta,
                                         const float* running_mean, const float* running_var,
                                         float* y, DType dtype, cudaStream_t stream);
// Several blocks per channel through `scratch`, as the forward; s.c <= kReductionChannels.
void launch_batch_norm_backward(const BatchNormShape& s, const float* x, const float* dy,
                                const float* gamma, const float* save_mean, const float* save_var,
                                float* dx, float* dgamma, float* dbeta, DType dtype,
                                const ReductionScratch& scratch, cudaStream_t stream);

// ---- elementwise (activation.cu) ------------------------------------------------------------

void launch_relu_forward(int64_t n, const float* x, float* y, DType dtype, cudaStream_t stream);
void launch_relu_backward(int64_t n, const float* y, const float* dy, float* dx, DType dtype,
                          cudaStream_t stream);
void launch_add(int64_t n, const float* a, const float* b, float* y, DType dtype,
                cudaStream_t stream);
void launch_accumulate(int64_t n, const float* x, float* y, DType dtype, cudaStream_t stream);
// Inverted dropout with device/counter_rng.h's stream, so the mask equals the CPU backend's.
void launch_dropout_forward(int64_t n, float p, uint64_t seed, uint64_t offset, const float* x,
                            float* y, uint8_t* mask, DType dtype, cudaStream_t stream);
void launch_dropout_backward(int64_t n, float p, const float* dy, const uint8_t* mask, float* dx,
                             DType dtype, cudaStream_t stream);

// ---- loss (loss.cu) ------------------------------------------------------------------------

// Rows spread over blocks, one per thread, in double as the CPU backend; the batch total and the
// correct count summed in row order through `scratch`, as the CPU backend sums them; the total
// is divided by `divisor` (> 0: the caller resolves SoftmaxCrossEntropyForward's 0 to N). A row
// with a negative label adds exactly 0 (padding); a row whose label is >= K gets a NaN loss (and
// NaN probabilities), since the device cannot throw; the loss then reads NaN.
void launch_softmax_cross_entropy_forward(int64_t n, int64_t k, const float* logits,
                                          const int32_t* labels, float* loss, float* probs,
                                          int32_t* correct, double divisor, DType dtype,
                                          const ReductionScratch& scratch, cudaStream_t stream);
// dlogits = (probs - onehot) * factor, factor = scale / divisor; exactly 0 on a row with a
// negative label. A row with a label >= K gets NaN.
void launch_softmax_cross_entropy_backward(int64_t n, int64_t k, float factor, const float* probs,
                                           const int32_t* labels, float* dlogits, DType dtype,
                                           cudaStream_t stream);

// ---- optimizers (optim.cu) -------------------------------------------------------------------

void launch_sgd_update(int64_t n, float lr, float momentum, float weight_decay, bool nesterov,
                       float* param, const float* grad, float* momentum_buf, cudaStream_t stream);

// `s`: the step's scalars from adamw_scalars() (device/adamw_scalars.h), as the CPU backend's.
void launch_adamw_update(int64_t n, const AdamScalars& s, float* param, const float* grad, float* m,
                         float* v, cudaStream_t stream);

}  // namespace ferry::cuda
