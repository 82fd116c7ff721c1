// Host entry points of the Llama kernels in llama.cu (RMSNorm, rotary embeddings into the
// attention's qkv, SwiGLU). As transformer_ops.h: each enqueues on `stream` and returns, no float
// atomics, every reduction in an order fixed by the shape; arguments are checked by the caller.
// `dtype` is the storage of the activations and their gradients (kF32 or kBF16: Note [bf16
// storage in the CUDA kernels] in storage.cuh); RMSNorm's weight, rstd and dweight stay fp32.
// C++17 for nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/cuda/kernel_ops.h"
#include "device/dtype.h"

namespace ferry::cuda {

// One block per row (grid-stride over rows); mean(x^2) in double over logical lanes and a fixed
// tree, so the order depends on C only. y = (x * rstd) * w; rstd (rows) saved.
void launch_rms_norm_forward(int64_t rows, int64_t c, float eps, const float* x, const float* w,
                             float* y, float* rstd, DType dtype, cudaStream_t stream);

// The most columns RMSNorm's backward reduces through the scratch; wider rows are refused.
constexpr int64_t kRmsNormMaxColumns = kReductionPartials;

// dweight: rows cut into chunks by the shape alone, one double partial per (chunk, column) into
// the scratch, added in chunk order; then dx per row. The column sums read dy before dx is
// written, so dx may equal dy. c <= kRmsNormMaxColumns.
void launch_rms_norm_backward(int64_t rows, int64_t c, const float* x, const float* dy,
                              const float* w, const float* rstd, float* dx, float* dw, DType dtype,
                              const ReductionScratch& scratch, cudaStream_t stream);

// Note [Rotary embeddings into the attention's qkv] in device/kernels_llama.h; one thread per
// rotated pair (and per copied v element). segments may be null.
void launch_rope_qkv_forward(int64_t n, int64_t t, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, float theta, const float* q, const float* k,
                             const float* v, const int32_t* segments, float* qkv, DType dtype,
                             cudaStream_t stream);
// dq, dk, dv each may be null (not wanted); dk and dv sum a KV head's repeats in head order.
void launch_rope_qkv_backward(int64_t n, int64_t t, int64_t heads, int64_t kv_heads,
                              int64_t head_dim, float theta, const float* dqkv,
                              const int32_t* segments, float* dq, float* dk, float* dv, DType dtype,
                              cudaStream_t stream);

// y = silu(gate) * up; dgate may equal dy.
void launch_swiglu_forward(int64_t n, const float* gate, const float* up, float* y, DType dtype,
                           cudaStream_t stream);
void launch_swiglu_backward(int64_t n, const float* gate, const float* up, const float* dy,
                            float* dgate, float* dup, DType dtype, cudaStream_t stream);

}  // namespace ferry::cuda
