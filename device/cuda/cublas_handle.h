// One cuBLAS handle per library class (linear layers, attention) and GPU, with cuBLAS's own
// workspace carved from the front of each call's Workspace. Invariant: the handle's stream and
// workspace are set on every call, under the owner's lock.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/device.h"
#include "device/kernels.h"

struct cublasContext;

namespace ferry::cuda {

class CublasHandle {
 public:
  explicit CublasHandle(const DeviceOptions& options) : options_(options) {}
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  // cuBLAS's workspace per call: its recommended size for this GPU (4 MiB, 32 MiB from Hopper
  // on) within options.workspace_limit, never below the 16 KiB cuBLAS needs to run.
  uint64_t workspace();
  // The handle on `stream`, cuBLAS's workspace the first workspace() bytes of `ws`, after
  // checking `ws` holds `need` bytes (UnsupportedError naming `what`) at 256-byte alignment.
  // FP32 products unless device.tf32_matmul (Note [TF32 and determinism] in cuda_kernels.h).
  cublasContext* bind(cudaStream_t stream, const Workspace& ws, uint64_t need, const char* what);

  // `bytes` rounded up to cuBLAS's 256-byte workspace alignment.
  static uint64_t aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  static constexpr uint64_t kAlign = 256;

  DeviceOptions options_;
  cublasContext* handle_ = nullptr;
  uint64_t workspace_ = 0;  // 0 until first asked
};

}  // namespace ferry::cuda
