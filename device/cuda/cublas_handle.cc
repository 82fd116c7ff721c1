// See cublas_handle.h.
#include "device/cuda/cublas_handle.h"

#include <cublas_v2.h>

#include <algorithm>

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/kernel_checks.h"

namespace ferry::cuda {

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) {
    CUDA_WARN(cudaSetDevice(options_.ordinal));
    (void)cublasDestroy(handle_);
  }
}

uint64_t CublasHandle::workspace() {
  if (workspace_ == 0) {
    constexpr uint64_t kMinimum = uint64_t{16} << 10;
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options_.ordinal));
    const uint64_t recommended = (major >= 9 ? uint64_t{32} : uint64_t{4}) << 20;
    workspace_ = aligned(std::max(kMinimum, std::min(recommended, options_.workspace_limit)));
  }
  return workspace_;
}

cublasContext* CublasHandle::bind(cudaStream_t stream, const Workspace& ws, uint64_t need,
                                  const char* what) {
  check_workspace(ws, need, what);
  FERRY_ASSERT(reinterpret_cast<uintptr_t>(ws.ptr) % kAlign == 0,
               "a cuBLAS workspace must be 256-byte aligned");
  if (handle_ == nullptr) {
    CUBLAS_CHECK(cublasCreate(&handle_));
    CUBLAS_CHECK(cublasSetMathMode(
        handle_, options_.cuda.matmul_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }
  // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
  CUBLAS_CHECK(cublasSetStream(handle_, stream));
  CUBLAS_CHECK(cublasSetWorkspace(handle_, ws.ptr, workspace()));
  return handle_;
}

}  // namespace ferry::cuda
