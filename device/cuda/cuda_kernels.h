// The CUDA backend's kernels: convolutions on cuDNN (conv_cudnn.h), linear layers and the
// attention core on cuBLAS (linear_cublas.h, attention_cublas.h), and the kernels with a run()
// overload in cuda_ops.h (pooling, batch norm, elementwise, dropout, loss, optimizers,
// embedding, layer norm, GELU, gradient clipping). workspace_bytes(args) is exactly what
// launch(args) uses.
#pragma once

#include <memory>

#include "device/device.h"
#include "device/kernels.h"

namespace ferry::cuda {

// Note [TF32 and determinism]
// Defaults follow PyTorch: convolutions may use TF32 tensor cores (torch.backends.cudnn.
// allow_tf32 = True: cuDNN's default math; off = CUDNN_FMA_MATH, and only algorithms that ran
// with FMA math are accepted), matrix products may not (torch.backends.cuda.matmul.allow_tf32 =
// False: CUBLAS_DEFAULT_MATH; on = CUBLAS_TF32_TENSOR_OP_MATH). TF32 keeps 10 mantissa bits, so
// tests that compare against float64 turn both off. `deterministic` keeps only the cuDNN
// algorithms that report CUDNN_DETERMINISTIC (as torch.backends.cudnn.deterministic); cuBLAS
// is bitwise repeatable on one stream with a fixed workspace, which every launch gives it.

class CudnnConv;
class CublasLinear;
class CublasAttention;

// Whether this backend runs kernel `kind` in `dtype` storage: its kernel table (the kernels with
// a run() overload or a library class, and those of them with a bf16 path), a pure function that
// needs no GPU. CudaKernels::supports answers it; planning without a GPU asks it directly (Note
// [Workspaces without a GPU] in device/planning_kernels.cc).
bool kernel_runs(KernelKind kind, DType dtype);

class CudaKernels : public Kernels {
 public:
  // Kernels of GPU options.ordinal with its numerics and workspace limit; launch() takes a
  // stream of that GPU. Creating them touches no GPU (library handles are made at first use).
  explicit CudaKernels(const DeviceOptions& options);
  // Kernels of GPU `ordinal` with the default options.
  explicit CudaKernels(int ordinal);
  ~CudaKernels() override;

  // True on float32 for every kernel of KernelArgs this backend runs.
  bool supports(KernelKind kind, DType dtype) const override;
  // The chosen algorithm's scratch bytes (a convolution's cuDNN algorithm is found the first time
  // its geometry is asked for); UnsupportedError for kernels this backend does not run.
  uint64_t workspace_bytes(const KernelArgs& args) override;
  // Enqueues a supported kernel on `stream`; UnsupportedError naming any other kernel.
  void launch(const KernelArgs& args, Stream& stream) override;

  // The GPU's reduction scratch (kReductionScratchBytes, kernel_ops.h) that batch norm and the
  // loss reduce through, and its multiprocessor count, which sizes their grids (never their
  // results). Set by CudaDevice, which owns the memory; kernels without it cannot launch those.
  void set_reduction_scratch(double* scratch, int sm_count) {
    scratch_ = scratch;
    sm_count_ = sm_count;
  }
  double* reduction_scratch() const { return scratch_; }
  int sm_count() const { return sm_count_; }

 private:
  DeviceOptions options_;
  double* scratch_ = nullptr;
  int sm_count_ = 1;
  std::unique_ptr<CudnnConv> conv_;
  std::unique_ptr<CublasLinear> linear_;
  std::unique_ptr<CublasAttention> attention_;
};

}  // namespace ferry::cuda
