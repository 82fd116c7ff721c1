// Error checks for CUDA, cuDNN and cuBLAS calls: each records the call text, file, line and the
// library's own message, and throws ferry::LibraryError. The checked expression runs once.
// CUDNN_CHECK and CUBLAS_CHECK need <cudnn.h> / <cublas_v2.h> included where they are used.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace ferry::cuda {

// "cudaErrorMemoryAllocation: out of memory".
std::string cuda_error_text(cudaError_t error);

// Throw LibraryError(library, call, "<name>[: <detail>]", file, line). `detail` may be null.
[[noreturn]] void throw_library_error(const char* library, const char* call, const char* name,
                                      const char* detail, const char* file, int line);
[[noreturn]] void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line);
// For destructors, which must not throw: prints one warning line to stderr.
void warn_cuda_error(cudaError_t error, const char* call, const char* file, int line);

}  // namespace ferry::cuda

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    const cudaError_t ferry_cuda_status_ = (expr);                                    \
    if (ferry_cuda_status_ != cudaSuccess) {                                          \
      ::ferry::cuda::throw_cuda_error(ferry_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)

// Like CUDA_CHECK, but warns instead of throwing: for destructors and other cleanup paths.
#define CUDA_WARN(expr)                                                              \
  do {                                                                               \
    const cudaError_t ferry_cuda_status_ = (expr);                                   \
    if (ferry_cuda_status_ != cudaSuccess) {                                         \
      ::ferry::cuda::warn_cuda_error(ferry_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

// cuDNN 9 keeps a message for the last failure of the calling thread (which descriptor field
// was rejected, and why): it becomes the detail.
#define CUDNN_CHECK(expr)                                                                          \
  do {                                                                                             \
    const cudnnStatus_t ferry_cudnn_status_ = (expr);                                              \
    if (ferry_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                             \
      char ferry_cudnn_detail_[512] = {};                                                          \
      cudnnGetLastErrorString(ferry_cudnn_detail_, sizeof(ferry_cudnn_detail_));                   \
      ::ferry::cuda::throw_library_error("cuDNN", #expr, cudnnGetErrorString(ferry_cudnn_status_), \
                                         ferry_cudnn_detail_, __FILE__, __LINE__);                 \
    }                                                                                              \
  } while (0)

#define CUBLAS_CHECK(expr)                                                  \
  do {                                                                      \
    const cublasStatus_t ferry_cublas_status_ = (expr);                     \
    if (ferry_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                    \
      ::ferry::cuda::throw_library_error(                                   \
          "cuBLAS", #expr, cublasGetStatusName(ferry_cublas_status_),       \
          cublasGetStatusString(ferry_cublas_status_), __FILE__, __LINE__); \
    }                                                                       \
  } while (0)
