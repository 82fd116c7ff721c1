// Fully connected layers on cuBLAS: the row-major products of kernels.h as column-major SGEMMs,
// the bias as a rank-1 update (y += ones * bias^T) and its gradient as dy^T * ones.
// Invariant: every launch hands cuBLAS the workspace workspace_bytes() reported (cuBLAS's own
// scratch, then a vector of ones when a bias needs one), so no hidden allocation happens.
#pragma once

#include <cstdint>
#include <mutex>

#include <cuda_runtime_api.h>

#include "device/cuda/cublas_handle.h"
#include "device/device.h"
#include "device/kernels.h"

struct cublasContext;

namespace ferry::cuda {

class CublasLinear {
 public:
  explicit CublasLinear(const DeviceOptions& options);
  CublasLinear(const CublasLinear&) = delete;
  CublasLinear& operator=(const CublasLinear&) = delete;

  uint64_t workspace_bytes(const LinearForward& args);
  uint64_t workspace_bytes(const LinearBackwardData& args);
  uint64_t workspace_bytes(const LinearBackwardWeights& args);

  // Enqueue on `stream` (of options.ordinal's GPU, current on the calling thread). Throw
  // ConfigError for an invalid shape and UnsupportedError when args.ws is too small.
  void launch(const LinearForward& args, cudaStream_t stream);
  void launch(const LinearBackwardData& args, cudaStream_t stream);
  void launch(const LinearBackwardWeights& args, cudaStream_t stream);

 private:
  // Bytes a pass needs in args.ws: blas_.workspace(), then `rows` ones when it has a bias.
  uint64_t needed(bool bias, int64_t rows);

  CublasHandle blas_;
  std::mutex mutex_;  // guards the handle: its stream and workspace are per call
};

}  // namespace ferry::cuda
