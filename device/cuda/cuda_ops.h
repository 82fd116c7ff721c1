// The CUDA backend's stateless kernels, one run() overload per KernelArgs alternative it
// supports: each checks its arguments on the host (ConfigError, as the CPU backend), then
// enqueues on `stream` (of the GPU current on this thread) and returns without synchronising.
// CudaKernels (cuda_kernels.cc) dispatches to whichever overloads exist. The reducing kernels
// (batch norm's training forward and backward, the loss forward) also take the GPU's fixed
// reduction scratch (Note [Deterministic multi-block reductions] in kernel_ops.h), as do layer
// norm's backward and the sum of squares.
#pragma once

#include <cuda_runtime_api.h>

#include "device/cuda/elementwise.h"
#include "device/cuda/kernel_ops.h"
#include "device/kernel_checks.h"
#include "device/kernels.h"

namespace ferry::cuda {

void run(const PoolForward& a, cudaStream_t stream);
void run(const PoolBackward& a, cudaStream_t stream);
void run(const AdaptiveAvgPoolForward& a, cudaStream_t stream);
void run(const AdaptiveAvgPoolBackward& a, cudaStream_t stream);
void run(const BatchNormForwardTraining& a, cudaStream_t stream, const ReductionScratch& scratch);
void run(const BatchNormForwardInference& a, cudaStream_t stream);
void run(const BatchNormBackward& a, cudaStream_t stream, const ReductionScratch& scratch);
void run(const ReluForward& a, cudaStream_t stream);
void run(const ReluBackward& a, cudaStream_t stream);
void run(const AddForward& a, cudaStream_t stream);
void run(const Accumulate& a, cudaStream_t stream);
void run(const CopyDevice& a, cudaStream_t stream);  // cudaMemcpyAsync, device to device
void run(const Fill& a, cudaStream_t stream);
void run(const Scale& a, cudaStream_t stream);
void run(const DropoutForward& a, cudaStream_t stream);
void run(const DropoutBackward& a, cudaStream_t stream);
void run(const SoftmaxCrossEntropyForward& a, cudaStream_t stream, const ReductionScratch& scratch);
void run(const SoftmaxCrossEntropyBackward& a, cudaStream_t stream);
void run(const SgdUpdate& a, cudaStream_t stream);
void run(const AdamWUpdate& a, cudaStream_t stream);
// Transformers (transformer.cu); the attention core runs on cuBLAS (attention_cublas.h).
void run(const EmbeddingForward& a, cudaStream_t stream);
void run(const EmbeddingBackward& a, cudaStream_t stream);
void run(const LayerNormForward& a, cudaStream_t stream);
void run(const LayerNormBackward& a, cudaStream_t stream, const ReductionScratch& scratch);
void run(const GeluForward& a, cudaStream_t stream);
void run(const GeluBackward& a, cudaStream_t stream);
void run(const SumOfSquares& a, cudaStream_t stream, const ReductionScratch& scratch);
void run(const ClipByNorm& a, cudaStream_t stream);
// The fused attention core (flash_attention.cu); head widths up to kFlashMaxHead.
void run(const FlashAttentionForward& a, cudaStream_t stream);
void run(const FlashAttentionBackward& a, cudaStream_t stream);
// Llama (llama.cu).
void run(const RmsNormForward& a, cudaStream_t stream);
void run(const RmsNormBackward& a, cudaStream_t stream, const ReductionScratch& scratch);
void run(const RopeQkvForward& a, cudaStream_t stream);
void run(const RopeQkvBackward& a, cudaStream_t stream);
void run(const SwigluForward& a, cudaStream_t stream);
void run(const SwigluBackward& a, cudaStream_t stream);

// The fp32 <-> bf16 conversion (the bf16 working copy of the weights, a bf16 wire): any kernel
// struct shaped as ConvertFloats (n, from, to, x, y). A template because the struct arrives with
// the bf16 runtime (device/kernels.h on its branch): until then nothing matches, and afterwards
// it runs with no further change here; a plain overload can replace it then.
template <typename T>
requires requires(const T& a) {
  a.n;
  a.from;
  a.to;
  a.x;
  a.y;
}
void run(const T& a, cudaStream_t stream) {
  check_element_count(a.n, "convert_floats");
  launch_convert_floats(a.n, a.from, a.to, a.x, a.y, stream);
}

}  // namespace ferry::cuda
