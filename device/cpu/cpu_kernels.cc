// CpuKernels: dispatch of the kernel variant to the families in kernels_*.cc, on the caller's
// thread (run) or on a CpuStream's worker (launch). Every kernel supports fp32 (labels int32);
// those with a dtype field also bf16 storage on a CPU with avx512_bf16.
#include "device/cpu/cpu_kernels.h"

#include <concepts>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/cpu_stream.h"

namespace ferry::cpu {
namespace {

// Kernels with a Workspace declare a workspace() overload; the rest need none.
template <typename Args>
concept HasWorkspace = requires(PlanCache& plans, const Args& a) {
  { workspace(plans, a) } -> std::same_as<uint64_t>;
};

// Kernels that run in bf16 storage by widening (kernels_bf16.cc); the rest with a dtype field
// (convolution, linear) read it themselves.
template <typename Args>
concept Widened = requires(PlanCache& plans, const Args& a) {
  run_widened(plans, a);
};

template <typename Args>
concept HasDType = requires(const Args& a) {
  { a.dtype } -> std::convertible_to<DType>;
};

template <typename Args>
void dispatch(PlanCache& plans, const Args& a) {
  if constexpr (Widened<Args>) {
    if (a.dtype == DType::kBF16) {
      run_widened(plans, a);
      return;
    }
  }
  run(plans, a);
}

}  // namespace

CpuKernels::CpuKernels(int threads, Bf16Products bf16_products)
    : impl_(std::make_unique<Impl>(threads,
                                   bf16_products == Bf16Products::kWidened ||
                                       (bf16_products == Bf16Products::kAuto && !cpu_has_amx()))) {}
CpuKernels::~CpuKernels() = default;

bool CpuKernels::supports(KernelKind kind, DType dtype) const {
  if (kind >= std::variant_size_v<KernelArgs>) return false;
  if (dtype == DType::kF32) return true;
  if (dtype != DType::kBF16 || !cpu_has_bf16()) return false;
  // The kinds with a dtype field (Note [Storage dtype of a kernel] in device/kernels.h).
  bool has = false;
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((I == kind ? (has = HasDType<std::variant_alternative_t<I, KernelArgs>>) : false), ...);
  }
  (std::make_index_sequence<std::variant_size_v<KernelArgs>>{});
  return has;
}

uint64_t CpuKernels::workspace_bytes(const KernelArgs& args) {
  return std::visit(
      [this](const auto& a) -> uint64_t {
        if constexpr (HasWorkspace<std::decay_t<decltype(a)>>) {
          return workspace(impl_->plans, a);
        } else {
          return 0;
        }
      },
      args);
}

void CpuKernels::run(const KernelArgs& args) {
  OmpThreadsScope threads(impl_->plans.threads());
  std::visit([this](const auto& a) { dispatch(impl_->plans, a); }, args);
}

void CpuKernels::launch(const KernelArgs& args, Stream& stream) {
  auto* cpu_stream = dynamic_cast<CpuStream*>(&stream);
  if (cpu_stream == nullptr) {
    throw UnsupportedError(
        fmt::format("{}: the CPU kernels run only on a CPU stream", kernel_name(args)),
        "launch on a stream of the cpu device");
  }
  cpu_stream->enqueue([this, args] { run(args); });
}

}  // namespace ferry::cpu
