// The CPU kernels: oneDNN primitives (cached by geometry) where oneDNN has the operation,
// plain loops where it has none. Each kernel runs on the compute stream's worker thread.
#pragma once

#include <memory>

#include "device/kernels.h"

namespace ferry::cpu {

class CpuKernels : public Kernels {
 public:
  // `threads`: the OpenMP thread count every kernel runs with (oneDNN fixes its partitioning
  // from it when a primitive is created, so results do not depend on the calling thread).
  explicit CpuKernels(int threads);
  ~CpuKernels() override;

  bool supports(KernelKind kind, DType dtype) const override;
  uint64_t workspace_bytes(const KernelArgs& args) override;
  void launch(const KernelArgs& args, Stream& stream) override;

  // Runs `args` now on the calling thread (used by launch() on the worker, and by tests).
  void run(const KernelArgs& args);

 private:
  struct Impl;  // the primitive plan cache (cpu_kernels_impl.h)
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::cpu
