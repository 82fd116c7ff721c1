// PLACEHOLDER until the oneDNN kernels land: every kernel reports unsupported.
#include "device/cpu/cpu_kernels.h"

#include "common/error.h"
#include "device/cpu/cpu_stream.h"

namespace ferry::cpu {

struct CpuKernels::Impl {};

CpuKernels::CpuKernels(int) : impl_(std::make_unique<Impl>()) {}
CpuKernels::~CpuKernels() = default;
bool CpuKernels::supports(KernelKind, DType) const { return false; }
uint64_t CpuKernels::workspace_bytes(const KernelArgs&) { return 0; }
void CpuKernels::run(const KernelArgs& args) {
  throw UnsupportedError(std::string("kernel not implemented yet: ") +
                         std::string(kernel_name(args)));
}
void CpuKernels::launch(const KernelArgs& args, Stream& stream) {
  static_cast<CpuStream&>(stream).enqueue([this, args] { run(args); });
}

}  // namespace ferry::cpu
