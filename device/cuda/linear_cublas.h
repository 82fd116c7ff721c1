// Fully connected layers on cuBLAS: the row-major products of kernels.h as column-major SGEMMs,
// the bias as a rank-1 update (y += ones * bias^T) and its gradient as dy^T * ones.
// Invariant: every launch hands cuBLAS the workspace workspace_bytes() reported (cuBLAS's own
// scratch, then a vector of ones when a bias needs one), so no hidden allocation happens.
#pragma once

#include <cstdint>
#include <mutex>

#include <cuda_runtime_api.h>

#include "device/device.h"
#include "device/kernels.h"

struct cublasContext;

namespace ferry::cuda {

class CublasLinear {
 public:
  explicit CublasLinear(const DeviceOptions& options);
  ~CublasLinear();
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
  // cuBLAS's workspace per call: its recommended size for this GPU (4 MiB, 32 MiB from Hopper
  // on) within options.workspace_limit, and never below the 16 KiB cuBLAS needs to run.
  uint64_t blas_workspace();
  // Bytes a pass needs in args.ws: blas_workspace(), then `rows` ones when it has a bias.
  uint64_t needed(bool bias, int64_t rows);
  // Hands cuBLAS `stream` and the first blas_workspace() bytes of `ws` (checked).
  cublasContext* bind(cudaStream_t stream, const Workspace& ws, uint64_t need, const char* what);

  DeviceOptions options_;
  std::mutex mutex_;  // guards the handle: its stream and workspace are per call
  cublasContext* handle_ = nullptr;
  uint64_t blas_workspace_ = 0;  // 0 until first asked
};

}  // namespace ferry::cuda
