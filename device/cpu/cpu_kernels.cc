// CpuKernels: dispatch of the kernel variant to the families in kernels_*.cc, on the caller's
// thread (run) or on a CpuStream's worker (launch). Every kernel supports fp32 (labels int32).
#include "device/cpu/cpu_kernels.h"

#include <concepts>
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

}  // namespace

CpuKernels::CpuKernels(int threads) : impl_(std::make_unique<Impl>(threads)) {}
CpuKernels::~CpuKernels() = default;

bool CpuKernels::supports(KernelKind kind, DType dtype) const {
  return kind < std::variant_size_v<KernelArgs> && dtype == DType::kF32;
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
  std::visit([this](const auto& a) { ferry::cpu::run(impl_->plans, a); }, args);
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
