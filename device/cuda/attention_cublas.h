// GPT-2's causal attention core on cuBLAS: per (n, head) products as strided-batched SGEMMs that
// read q, k and v in place out of the fused qkv (leading dimension 3C), with attention.cu's
// softmax, mask and dropout between them. Invariant: every launch uses exactly the workspace
// workspace_bytes() reported: cuBLAS's own scratch, then the (N, heads, T, T) buffers the pass
// needs (Note [Attention's workspace] in attention_cublas.cc); nothing is allocated per launch.
#pragma once

#include <cstdint>
#include <mutex>

#include <cuda_runtime_api.h>

#include "device/cuda/cublas_handle.h"
#include "device/device.h"
#include "device/kernels.h"

struct cublasContext;

namespace ferry::cuda {

class CublasAttention {
 public:
  explicit CublasAttention(const DeviceOptions& options);
  CublasAttention(const CublasAttention&) = delete;
  CublasAttention& operator=(const CublasAttention&) = delete;

  uint64_t workspace_bytes(const AttentionForward& args);
  uint64_t workspace_bytes(const AttentionBackward& args);

  // Enqueue on `stream` (of options.ordinal's GPU, current on the calling thread). Throw
  // ConfigError for an invalid geometry and UnsupportedError when args.ws is too small.
  void launch(const AttentionForward& args, cudaStream_t stream);
  void launch(const AttentionBackward& args, cudaStream_t stream);

 private:
  CublasHandle blas_;
  std::mutex mutex_;  // guards the handle: its stream and workspace are per call
};

}  // namespace ferry::cuda
