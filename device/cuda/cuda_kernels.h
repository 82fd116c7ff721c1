// The CUDA backend's kernels: every kernel with a run() overload in cuda_ops.h (pooling, batch
// norm, elementwise, dropout, loss, optimizers); convolution and linear (cuDNN, cuBLAS) report
// unsupported until they land, so callers fall back on purpose.
#pragma once

#include "device/kernels.h"

namespace ferry::cuda {

class CudaKernels : public Kernels {
 public:
  // Kernels of GPU `ordinal`; launch() takes a stream of that GPU.
  explicit CudaKernels(int ordinal) : ordinal_(ordinal) {}

  // True on float32 for the kernels cuda_ops.h runs, false for everything else.
  bool supports(KernelKind kind, DType dtype) const override;
  // 0 for the supported kernels; UnsupportedError for the others.
  uint64_t workspace_bytes(const KernelArgs& args) override;
  // Enqueues a supported kernel on `stream`; UnsupportedError naming any other kernel.
  void launch(const KernelArgs& args, Stream& stream) override;

 private:
  int ordinal_;
};

}  // namespace ferry::cuda
