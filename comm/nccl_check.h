// NCCL_CHECK: runs an NCCL call once and, when it does not return ncclSuccess, throws
// LibraryError("NCCL", call text, "<ncclGetErrorString>: <ncclGetLastError>", file, line).
// Part of the nccl backend: only built with CUDA (FERRY_HAVE_NCCL).
#pragma once

#include <nccl.h>

namespace ferry::nccl {

[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file,
                                   int line);

}  // namespace ferry::nccl

#define NCCL_CHECK(expr)                                                              \
  do {                                                                                \
    const ncclResult_t ferry_nccl_status_ = (expr);                                   \
    if (ferry_nccl_status_ != ncclSuccess) {                                          \
      ::ferry::nccl::throw_nccl_error(ferry_nccl_status_, #expr, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
