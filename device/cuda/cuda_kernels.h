// The CUDA backend's kernels. Today only fill and scale (elementwise.cu) run; everything else
// reports unsupported, so callers fall back on purpose. cuDNN and cuBLAS kernels come later.
#pragma once

#include "device/kernels.h"

namespace ferry::cuda {

class CudaKernels : public Kernels {
 public:
  // Kernels of GPU `ordinal`; launch() takes a stream of that GPU.
  explicit CudaKernels(int ordinal) : ordinal_(ordinal) {}

  // True for Fill and Scale on float32, false for everything else.
  bool supports(KernelKind kind, DType dtype) const override;
  // 0 for the supported kernels; UnsupportedError for the others.
  uint64_t workspace_bytes(const KernelArgs& args) override;
  // Enqueues a supported kernel on `stream`; UnsupportedError naming any other kernel.
  void launch(const KernelArgs& args, Stream& stream) override;

 private:
  int ordinal_;
};

}  // namespace ferry::cuda
