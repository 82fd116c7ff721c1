// The CPU kernels: oneDNN primitives (cached by geometry) where oneDNN has the operation,
// plain loops where it has none. Each kernel runs on the compute stream's worker thread.
#pragma once

#include <memory>

#include "device/kernels.h"

namespace ferry::cpu {

// How bf16 convolutions and linear layers multiply (Note [bf16 products in fp32] in
// device/cpu/widened_matmul.cc): oneDNN's bf16 primitives, or its fp32 primitives on the bf16
// values widened; kAuto picks native only where oneDNN uses AMX.
enum class Bf16Products { kAuto, kNative, kWidened };

class CpuKernels : public Kernels {
 public:
  // `threads`: the OpenMP thread count every kernel runs with (oneDNN fixes its partitioning
  // from it when a primitive is created, so results do not depend on the calling thread).
  explicit CpuKernels(int threads, Bf16Products bf16_products = Bf16Products::kAuto);
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
