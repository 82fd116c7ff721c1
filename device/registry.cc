// The one place backends are chosen: build-time guards, no static registration tricks.
#include <thread>

#include <fmt/format.h>

#include "device/backend_traits.h"
#include "device/cpu/bf16_support.h"
#include "device/cpu/cpu_device.h"
#include "device/device.h"
#if FERRY_HAVE_CUDA
#include "device/cuda/cuda_device.h"
#include "device/cuda/cuda_kernels.h"
#endif

namespace ferry {

std::string_view backend_name(Backend b) { return b == Backend::kCpu ? "cpu" : "cuda"; }

BackendTraits backend_traits(Backend backend) {
  BackendTraits t;
  switch (backend) {
    case Backend::kCpu:
      t.arbitration = CopyArbitration::kPaced;
      t.real_gpus = false;
      t.shared_granule = kSharedGranule;
      break;
    case Backend::kCuda:
      t.arbitration = CopyArbitration::kGated;
      t.real_gpus = true;
      t.shared_granule = kSharedGranule;
      break;
  }
  return t;
}

bool device_present(const DeviceOptions& options) {
  if (!backend_built(options.backend)) return false;
  return options.backend != Backend::kCuda || options.ordinal < cuda_device_count();
}

DeviceRates default_device_rates(const DeviceOptions& options) {
  // Note [Default device rates] in device/backend_traits.h.
  DeviceRates r;
  if (options.backend == Backend::kCuda) {
    r.compute_flops = 1e13;
    r.memory_gbps = 700;
    r.link_gbps = 12;
  } else {
    const int64_t cores = options.cpu.threads > 0
                              ? options.cpu.threads
                              : static_cast<int64_t>(std::thread::hardware_concurrency());
    r.compute_flops = 5e10 * static_cast<double>(std::max<int64_t>(cores, 1));
    r.memory_gbps = 10;
    r.link_gbps = 8;
  }
  if (options.cpu.link_gbps > 0) r.link_gbps = options.cpu.link_gbps;
  return r;
}

bool keeps_algorithm_choices(const DeviceOptions& options) {
  return options.backend == Backend::kCuda && options.cuda.deterministic &&
         options.cuda.algorithms == AlgorithmSearch::kTimed;
}

bool backend_built(Backend backend) {
  if (backend == Backend::kCpu) return true;
#if FERRY_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if FERRY_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool cuda_kernel_runs(KernelKind kind, DType dtype) {
#if FERRY_HAVE_CUDA
  return cuda::kernel_runs(kind, dtype);
#else
  (void)kind;
  (void)dtype;
  return false;
#endif
}

std::vector<std::string> cuda_pci_bus_ids() {
#if FERRY_HAVE_CUDA
  return cuda::pci_bus_ids();
#else
  return {};
#endif
}

std::unique_ptr<Kernels> create_kernels(const DeviceOptions& options) {
  if (options.backend == Backend::kCpu) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    return std::make_unique<cpu::CpuKernels>(options.cpu.threads > 0 ? options.cpu.threads
                                                                     : std::max(1, cores));
  }
#if FERRY_HAVE_CUDA
  return cuda::create_cuda_kernels(options);
#else
  throw UnsupportedError("device.backend is cuda but this build has no CUDA backend",
                         "install the CUDA toolkit with cuDNN and NCCL and rebuild, or set "
                         "device.backend=cpu");
#endif
}

std::unique_ptr<Device> create_device(const DeviceOptions& options) {
  if (options.backend == Backend::kCpu) {
    if (options.precision == Precision::kBf16) cpu::check_bf16_support();
    return std::make_unique<cpu::CpuDevice>(options);
  }
#if FERRY_HAVE_CUDA
  const int count = cuda::device_count();
  if (options.ordinal >= count) {
    throw UnsupportedError(
        fmt::format("device.backend is cuda but {} CUDA device(s) are present (wanted ordinal {})",
                    count, options.ordinal),
        "set device.backend=cpu on a machine without a GPU");
  }
  return cuda::create_cuda_device(options);
#else
  throw UnsupportedError("device.backend is cuda but this build has no CUDA backend",
                         "install the CUDA toolkit with cuDNN and NCCL and rebuild, or set "
                         "device.backend=cpu");
#endif
}

}  // namespace ferry
