// CUDA kernel dispatch: fill and scale go to elementwise.cu; every other kernel is refused with
// an UnsupportedError that names it, never silently skipped.
#include "device/cuda/cuda_kernels.h"

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_stream.h"
#include "device/cuda/elementwise.h"

namespace ferry::cuda {

namespace {

[[noreturn]] void throw_unsupported(const KernelArgs& args) {
  throw UnsupportedError(
      fmt::format("the CUDA backend has no {} kernel yet", kernel_name(args)),
      "set device.backend=cpu; the cuDNN and cuBLAS kernels of the CUDA backend come later");
}

// The CUDA stream behind `stream`, with its GPU made current (kernel launches need both).
cudaStream_t launch_stream(Stream& stream, int ordinal) {
  CudaStream& cuda = as_cuda(stream);
  FERRY_ASSERT(cuda.ordinal() == ordinal, "a kernel was launched on another GPU's stream");
  use_device(ordinal);
  return cuda.handle();
}

}  // namespace

bool CudaKernels::supports(KernelKind kind, DType dtype) const {
  if (dtype != DType::kF32) return false;
  return kind == kernel_kind<Fill>() || kind == kernel_kind<Scale>();
}

uint64_t CudaKernels::workspace_bytes(const KernelArgs& args) {
  if (!supports(args.index(), DType::kF32)) throw_unsupported(args);
  return 0;
}

void CudaKernels::launch(const KernelArgs& args, Stream& stream) {
  if (const auto* fill = std::get_if<Fill>(&args)) {
    FERRY_ASSERT(fill->n >= 0 && (fill->n == 0 || fill->y != nullptr), "fill: bad arguments");
    launch_fill(fill->y, fill->n, fill->value, launch_stream(stream, ordinal_));
    return;
  }
  if (const auto* scale = std::get_if<Scale>(&args)) {
    FERRY_ASSERT(scale->n >= 0 && (scale->n == 0 || scale->y != nullptr), "scale: bad arguments");
    launch_scale(scale->y, scale->n, scale->alpha, launch_stream(stream, ordinal_));
    return;
  }
  throw_unsupported(args);
}

}  // namespace ferry::cuda
