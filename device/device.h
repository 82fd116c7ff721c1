// A Device: memory with a hard capacity, pinned host memory, streams, events, asynchronous
// copies and kernels. The CPU backend (oneDNN, copy threads) and the CUDA backend (cuDNN,
// cuBLAS, CUDA streams) both satisfy it; everything above device/ sees only this.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/copy_arbiter.h"
#include "device/copy_deadline.h"
#include "device/heap.h"
#include "device/host_pool.h"
#include "device/kernels.h"
#include "device/precision.h"
#include "device/stream.h"

namespace ferry {

enum class Backend { kCpu, kCuda };

// How the cuda backend chooses a convolution's algorithm (device.algorithms): kTimed runs every
// candidate once (cudnnFind) and keeps the fastest; kHeuristic takes cuDNN's heuristic ranking
// (cudnnGet*_v7) and runs nothing, so the choice is the same in every process (PyTorch's
// choice under deterministic && !benchmark). Either way the filters of Note [Choosing
// convolution algorithms] (device/cuda/conv_cudnn.h) apply.
enum class AlgorithmSearch { kTimed, kHeuristic };

std::string_view backend_name(Backend b);

// The cpu backend's own options (Note [Backend options] below).
struct CpuDeviceOptions {
  int threads = 0;  // device.threads: threads for kernels, 0 = every core
  // The emulated link's rate for host<->device copies, GB/s (device.copy_gbps, or a described
  // server's path under emulation); 0 = unlimited. An arbiter, when set, paces copies instead.
  double link_gbps = 0;
};

// The cuda backend's own options: kernel numerics and how algorithms are chosen (Note [TF32 and
// determinism] in device/cuda/cuda_kernels.h).
struct CudaDeviceOptions {
  bool conv_tf32 = true;       // device.tf32: convolutions may use TF32 tensor cores
  bool matmul_tf32 = false;    // device.tf32_matmul: linear layers may use TF32 tensor cores
  bool deterministic = false;  // device.deterministic: bitwise-repeatable kernels
  // How convolution algorithms are chosen; offline planning takes the heuristics.
  AlgorithmSearch algorithms = AlgorithmSearch::kTimed;
  // Where choices persist across processes (Note [Timed choices across processes] in
  // device/cuda/algorithm_cache.h); empty: they live for the process only.
  std::string algorithm_file;
};

// Note [Backend options]
// DeviceOptions holds what every backend reads (capacity, ordinal, scratch limit, the copy
// arbiter, host-memory placement, mapping on use) and one part per backend, which only that backend
// reads: a config fills both parts from its device.* keys, and the backend it names ignores the
// other.
struct DeviceOptions {
  Backend backend = Backend::kCpu;
  uint64_t memory = 0;  // device.memory: the hard capacity of device memory, in bytes
  int ordinal = 0;      // which GPU (cuda); which emulated device (cpu)
  uint64_t workspace_limit = uint64_t{64} << 20;  // most scratch bytes one kernel may ask for
  // When set, governs the copies of the copy streams: it must speak the backend's protocol
  // (Note [One hook, two protocols] in device/copy_arbiter.h). Empty: plain copies.
  std::shared_ptr<CopyArbiter> arbiter;
  // Places each new pinned host block [addr, addr + bytes) before its pages are first touched:
  // the session binds them to the GPU's NUMA node (Note [Pinned pages on a NUMA node] in
  // device/host_pages.h). Empty: the OS places pages where they are first touched.
  std::function<void(void* addr, uint64_t bytes)> place_host_memory;
  // memory.share: the device holds memory only under live allocations, in granules of
  // BackendTraits::shared_granule (Note [Backing a heap on use] in device/heap.h): cuda maps them
  // into a reserved range (Note [Device memory of a shared GPU] in device/cuda/cuda_device.h),
  // cpu gives the pages of a granule back to the OS once no allocation touches it. Otherwise
  // the whole device.memory is held from the start (cuda: one cudaMalloc).
  bool map_on_use = false;
  // device.precision: bf16 needs avx512_bf16 (cpu) or sm_80 (cuda), checked when the device is
  // made.
  Precision precision = Precision::kFp32;
  CpuDeviceOptions cpu;
  CudaDeviceOptions cuda;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Backend backend() const = 0;
  // "cpu:0 (oneDNN 2.6.3, 2 threads)", "cuda:1 (NVIDIA A100-SXM4-40GB)".
  virtual std::string name() const = 0;

  // Device memory: one block of the configured capacity.
  virtual DeviceHeap& memory() = 0;
  // Pinned (page-locked) host memory, the source and target of asynchronous copies.
  virtual PinnedAllocator& pinned() = 0;

  // The device's own streams, one per kind; each runs its work in order.
  virtual Stream& stream(StreamKind kind) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // An event that keeps the time its work completed, for traces.
  virtual std::unique_ptr<Event> create_timing_event() = 0;
  // Milliseconds from `start`'s completion to `end`'s (both timing events, both completed).
  virtual double elapsed_ms(Event& start, Event& end) = 0;

  // Copies `bytes` from src to dst, ordered on `stream`. Either side may be device memory or
  // pinned host memory; the ranges must not overlap. Offloads and prefetches come here from
  // ResidentTensor with their deadline, which the copy arbiter (DeviceOptions::arbiter) receives
  // with the copy (Note [Life of an offloaded activation] in trainer/exec/executor.h, step 6).
  virtual void copy_async(void* dst, const void* src, uint64_t bytes, Stream& stream,
                          const CopyDeadline& deadline) = 0;
  // A copy without a schedule (an input, a parameter, a metric): never arbitrated.
  void copy_async(void* dst, const void* src, uint64_t bytes, Stream& stream) {
    copy_async(dst, src, bytes, stream, CopyDeadline{});
  }

  virtual Kernels& kernels() = 0;

  // Blocks the host until every stream of this device is idle.
  virtual void synchronize() = 0;
};

// Whether this build has `backend`, and (cuda) whether a device is present.
bool backend_built(Backend backend);
int cuda_device_count();
// The PCI bus id of each CUDA device, by ordinal, as cudaDeviceGetPCIBusId writes it
// ("0000:3B:00.0"); empty without the CUDA backend or a GPU.
std::vector<std::string> cuda_pci_bus_ids();

// The kernels of options.backend without a device (no memory reserved): for planning, which
// asks kernels for workspace sizes. Throws UnsupportedError when that backend was not built.
std::unique_ptr<Kernels> create_kernels(const DeviceOptions& options);

// Creates a device of options.backend. Throws UnsupportedError when that backend was not built
// or no such device is present, OutOfMemoryError when the capacity cannot be reserved.
std::unique_ptr<Device> create_device(const DeviceOptions& options);

}  // namespace ferry
