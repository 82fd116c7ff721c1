// The out-of-line halves of CUDA_CHECK, CUDNN_CHECK and CUBLAS_CHECK: message formatting and
// the throw, kept here so the macros stay small at every call site.
#include "device/cuda/cuda_check.h"

#include <cstdio>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry::cuda {

std::string cuda_error_text(cudaError_t error) {
  return fmt::format("{}: {}", cudaGetErrorName(error), cudaGetErrorString(error));
}

void throw_library_error(const char* library, const char* call, const char* name,
                         const char* detail, const char* file, int line) {
  std::string message = name != nullptr ? name : "unknown status";
  if (detail != nullptr && *detail != '\0') message += fmt::format(": {}", detail);
  throw LibraryError(library, call, message, file, line);
}

void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line) {
  throw LibraryError("CUDA", call, cuda_error_text(error), file, line);
}

void warn_cuda_error(cudaError_t error, const char* call, const char* file, int line) {
  std::fprintf(stderr, "ferry: warning: CUDA call failed during cleanup: %s: %s (%s:%d)\n", call,
               cuda_error_text(error).c_str(), file, line);
}

}  // namespace ferry::cuda
