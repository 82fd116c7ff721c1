// CUDA kernel dispatch: a kernel runs when cuda_ops.h has a run() overload for its arguments
// (the table below is derived from those overloads); every other kernel is refused with an
// UnsupportedError that names it, never silently skipped.
#include "device/cuda/cuda_kernels.h"

#include <array>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_ops.h"
#include "device/cuda/cuda_stream.h"

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

// Whether cuda_ops.h runs kernel arguments of type T.
template <typename T>
concept Stateless = requires(const T& args, cudaStream_t stream) {
  run(args, stream);
};

// The kernel table: kRuns[kernel_kind<T>()] says whether T runs on this backend.
template <size_t... I>
constexpr std::array<bool, sizeof...(I)> runs_table(std::index_sequence<I...>) {
  return {Stateless<std::variant_alternative_t<I, KernelArgs>>...};
}
constexpr auto kRuns = runs_table(std::make_index_sequence<std::variant_size_v<KernelArgs>>{});

}  // namespace

bool CudaKernels::supports(KernelKind kind, DType dtype) const {
  return dtype == DType::kF32 && kind < kRuns.size() && kRuns[kind];
}

uint64_t CudaKernels::workspace_bytes(const KernelArgs& args) {
  if (!supports(args.index(), DType::kF32)) throw_unsupported(args);
  return 0;  // no stateless kernel uses a workspace
}

void CudaKernels::launch(const KernelArgs& args, Stream& stream) {
  std::visit(
      [&](const auto& a) {
        if constexpr (Stateless<std::decay_t<decltype(a)>>) {
          run(a, launch_stream(stream, ordinal_));
        } else {
          throw_unsupported(args);
        }
      },
      args);
}

}  // namespace ferry::cuda
