// CUDA kernel dispatch: convolutions to conv_cudnn, linear layers to linear_cublas, fill and scale
// to elementwise.cu; every other kernel is refused with an UnsupportedError that names it, never
// silently skipped.
#include "device/cuda/cuda_kernels.h"

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/conv_cudnn.h"
#include "device/cuda/cuda_stream.h"
#include "device/cuda/elementwise.h"
#include "device/cuda/linear_cublas.h"

namespace ferry::cuda {

namespace {

[[noreturn]] void throw_unsupported(const KernelArgs& args) {
  throw UnsupportedError(
      fmt::format("the CUDA backend has no {} kernel yet", kernel_name(args)),
      "set device.backend=cpu; the CUDA backend does not run this model's kernels yet");
}

// The CUDA stream behind `stream`, with its GPU made current (kernel launches need both).
cudaStream_t launch_stream(Stream& stream, int ordinal) {
  CudaStream& cuda = as_cuda(stream);
  FERRY_ASSERT(cuda.ordinal() == ordinal, "a kernel was launched on another GPU's stream");
  use_device(ordinal);
  return cuda.handle();
}

DeviceOptions ordinal_options(int ordinal) {
  DeviceOptions options;
  options.backend = Backend::kCuda;
  options.ordinal = ordinal;
  return options;
}

template <typename T, typename... Ts>
constexpr bool is_one_of = (std::is_same_v<T, Ts> || ...);

template <typename T>
constexpr bool is_conv = is_one_of<T, ConvForward, ConvBackwardData, ConvBackwardWeights>;
template <typename T>
constexpr bool is_linear = is_one_of<T, LinearForward, LinearBackwardData, LinearBackwardWeights>;

}  // namespace

CudaKernels::CudaKernels(const DeviceOptions& options)
    : options_(options),
      conv_(std::make_unique<CudnnConv>(options)),
      linear_(std::make_unique<CublasLinear>(options)) {}

CudaKernels::CudaKernels(int ordinal) : CudaKernels(ordinal_options(ordinal)) {}

CudaKernels::~CudaKernels() = default;

bool CudaKernels::supports(KernelKind kind, DType dtype) const {
  if (dtype != DType::kF32) return false;
  return kind == kernel_kind<Fill>() || kind == kernel_kind<Scale>() ||
         kind == kernel_kind<ConvForward>() || kind == kernel_kind<ConvBackwardData>() ||
         kind == kernel_kind<ConvBackwardWeights>() || kind == kernel_kind<LinearForward>() ||
         kind == kernel_kind<LinearBackwardData>() || kind == kernel_kind<LinearBackwardWeights>();
}

uint64_t CudaKernels::workspace_bytes(const KernelArgs& args) {
  if (!supports(args.index(), DType::kF32)) throw_unsupported(args);
  return std::visit(
      [this](const auto& a) -> uint64_t {
        using T = std::decay_t<decltype(a)>;
        if constexpr (is_conv<T>) return conv_->workspace_bytes(a);
        if constexpr (is_linear<T>) return linear_->workspace_bytes(a);
        return 0;
      },
      args);
}

void CudaKernels::launch(const KernelArgs& args, Stream& stream) {
  if (const auto* fill = std::get_if<Fill>(&args)) {
    FERRY_ASSERT(fill->n >= 0 && (fill->n == 0 || fill->y != nullptr), "fill: bad arguments");
    launch_fill(fill->y, fill->n, fill->value, launch_stream(stream, options_.ordinal));
    return;
  }
  if (const auto* scale = std::get_if<Scale>(&args)) {
    FERRY_ASSERT(scale->n >= 0 && (scale->n == 0 || scale->y != nullptr), "scale: bad arguments");
    launch_scale(scale->y, scale->n, scale->alpha, launch_stream(stream, options_.ordinal));
    return;
  }
  const bool done = std::visit(
      [&](const auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (is_conv<T>) {
          conv_->launch(a, launch_stream(stream, options_.ordinal));
          return true;
        } else if constexpr (is_linear<T>) {
          linear_->launch(a, launch_stream(stream, options_.ordinal));
          return true;
        } else {
          return false;
        }
      },
      args);
  if (!done) throw_unsupported(args);
}

}  // namespace ferry::cuda
