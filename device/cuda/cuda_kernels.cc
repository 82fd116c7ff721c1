// CUDA kernel dispatch: convolutions to conv_cudnn, linear layers to linear_cublas, the attention
// core to attention_cublas, and every
// kernel with a run() overload in cuda_ops.h to that overload (the table below is derived from
// those overloads); any other kernel is refused with an UnsupportedError that names it, and so is
// a kernel asked for bf16 storage that this backend runs in fp32 only.
#include "device/cuda/cuda_kernels.h"

#include <array>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/attention_cublas.h"
#include "device/cuda/conv_cudnn.h"
#include "device/cuda/cuda_ops.h"
#include "device/cuda/cuda_stream.h"
#include "device/cuda/linear_cublas.h"

namespace ferry::cuda {

namespace {

[[noreturn]] void throw_unsupported(const KernelArgs& args, DType dtype = DType::kF32) {
  if (dtype != DType::kF32) {
    throw UnsupportedError(fmt::format("the CUDA backend has no {} kernel in {} storage",
                                       kernel_name(args), dtype_name(dtype)),
                           "set device.precision=fp32, or device.backend=cpu");
  }
  throw UnsupportedError(fmt::format("the CUDA backend has no {} kernel", kernel_name(args)),
                         "set device.backend=cpu to run this model's kernels on the CPU");
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
template <typename T>
constexpr bool is_attention = is_one_of<T, AttentionForward, AttentionBackward>;

// Whether cuda_ops.h runs kernel arguments of type T (no library handle, no workspace, no
// scratch).
template <typename T>
concept Stateless = requires(const T& args, cudaStream_t stream) {
  run(args, stream);
};

// Whether cuda_ops.h runs T through the reduction scratch (batch norm, the loss forward).
template <typename T>
concept Reducing = requires(const T& args, cudaStream_t stream, const ReductionScratch& scratch) {
  run(args, stream, scratch);
};

template <typename T>
constexpr bool runs = Stateless<T> || Reducing<T> || is_conv<T> || is_linear<T> || is_attention<T>;

// The kernels that run in bf16 storage (Note [bf16 storage in the CUDA kernels] in storage.cuh).
// Convolutions (Note [Convolutions in bf16] in conv_cudnn.cc), linear layers (Note [Linear layers
// in bf16] in linear_cublas.cc) and the attention core (Note [Attention in bf16] in
// attention_cublas.cc) take their bf16 paths in the library classes; the fused attention core's
// (Note [Fused attention in bf16 on CUDA] in flash_attention.cu) is its .cu template.
template <typename T>
constexpr bool runs_bf16 =
    is_conv<T> || is_linear<T> || is_attention<T> ||
    is_one_of<T, FlashAttentionForward, FlashAttentionBackward> ||
    is_one_of<T, PoolForward, PoolBackward, AdaptiveAvgPoolForward, AdaptiveAvgPoolBackward,
              BatchNormForwardTraining, BatchNormForwardInference, BatchNormBackward, ReluForward,
              ReluBackward, AddForward, Accumulate, Fill, Scale, DropoutForward, DropoutBackward,
              SoftmaxCrossEntropyForward, SoftmaxCrossEntropyBackward, EmbeddingForward,
              EmbeddingBackward, LayerNormForward, LayerNormBackward, GeluForward, GeluBackward,
              RmsNormForward, RmsNormBackward, RopeQkvForward, RopeQkvBackward, SwigluForward,
              SwigluBackward>;

// The storage dtype a kernel's arguments ask for (kF32 for kernels without the field).
template <typename T>
DType dtype_of(const T& args) {
  if constexpr (requires { args.dtype; }) {
    return args.dtype;
  } else {
    return DType::kF32;
  }
}

// The kernel table: kRuns[kernel_kind<T>()] says whether T runs on this backend.
template <size_t... I>
constexpr std::array<bool, sizeof...(I)> runs_table(std::index_sequence<I...>) {
  return {runs<std::variant_alternative_t<I, KernelArgs>>...};
}
constexpr auto kRuns = runs_table(std::make_index_sequence<std::variant_size_v<KernelArgs>>{});

template <size_t... I>
constexpr std::array<bool, sizeof...(I)> runs_bf16_table(std::index_sequence<I...>) {
  return {runs_bf16<std::variant_alternative_t<I, KernelArgs>>...};
}
constexpr auto kRunsBf16 =
    runs_bf16_table(std::make_index_sequence<std::variant_size_v<KernelArgs>>{});

}  // namespace

CudaKernels::CudaKernels(const DeviceOptions& options)
    : options_(options),
      conv_(std::make_unique<CudnnConv>(options)),
      linear_(std::make_unique<CublasLinear>(options)),
      attention_(std::make_unique<CublasAttention>(options)) {}

CudaKernels::CudaKernels(int ordinal) : CudaKernels(ordinal_options(ordinal)) {}

CudaKernels::~CudaKernels() = default;

bool kernel_runs(KernelKind kind, DType dtype) {
  if (kind >= kRuns.size() || !kRuns[kind]) return false;
  if (dtype == DType::kF32) return true;
  return dtype == DType::kBF16 && kRunsBf16[kind];
}

bool CudaKernels::supports(KernelKind kind, DType dtype) const { return kernel_runs(kind, dtype); }

uint64_t CudaKernels::workspace_bytes(const KernelArgs& args) {
  const DType dtype = std::visit([](const auto& a) { return dtype_of(a); }, args);
  if (!supports(args.index(), dtype)) throw_unsupported(args, dtype);
  return std::visit(
      [this](const auto& a) -> uint64_t {
        using T = std::decay_t<decltype(a)>;
        if constexpr (is_conv<T>) return conv_->workspace_bytes(a);
        if constexpr (is_linear<T>) return linear_->workspace_bytes(a);
        if constexpr (is_attention<T>) return attention_->workspace_bytes(a);
        return 0;  // no other kernel has a workspace (batch norm, the loss, layer norm's
                   // backward and the sum of squares use the fixed reduction scratch, which
                   // CudaDevice holds outside the heap)
      },
      args);
}

void CudaKernels::launch(const KernelArgs& args, Stream& stream) {
  const DType dtype = std::visit([](const auto& a) { return dtype_of(a); }, args);
  if (dtype != DType::kF32 && !supports(args.index(), dtype)) throw_unsupported(args, dtype);
  std::visit(
      [&](const auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (is_conv<T>) {
          conv_->launch(a, launch_stream(stream, options_.ordinal));
        } else if constexpr (is_linear<T>) {
          linear_->launch(a, launch_stream(stream, options_.ordinal));
        } else if constexpr (is_attention<T>) {
          attention_->launch(a, launch_stream(stream, options_.ordinal));
        } else if constexpr (Stateless<T>) {
          run(a, launch_stream(stream, options_.ordinal));
        } else if constexpr (Reducing<T>) {
          FERRY_ASSERT(stream.kind() == StreamKind::kCompute,
                       "the reducing kernels (batch norm, the loss, layer norm's backward, the "
                       "sum of squares) share one reduction scratch: launch them on the compute "
                       "stream");
          run(a, launch_stream(stream, options_.ordinal), ReductionScratch{scratch_, sm_count_});
        } else {
          throw_unsupported(args);
        }
      },
      args);
}

}  // namespace ferry::cuda
