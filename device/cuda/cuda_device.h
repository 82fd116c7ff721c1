// The CUDA backend's Device and its entry points (the registry calls device_count() and
// create_cuda_device()). Device memory is ONE cudaMalloc of device.memory bytes cut by a
// DeviceHeap, so the capacity is exact and hard, as on the CPU backend; the kernels' fixed
// reduction scratch sits after it in the same allocation (Note [Reduction scratch beside the
// heap]). Under memory.share it is a reserved range mapped only under live allocations (Note
// [Device memory of a shared GPU]).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "device/cuda/cuda_gated_copy.h"
#include "device/cuda/cuda_kernels.h"
#include "device/cuda/cuda_stream.h"
#include "device/cuda/mapped_range.h"
#include "device/device.h"

namespace ferry::cuda {

// Number of CUDA devices present; 0 when there is no driver or no GPU.
int device_count();

// cudaDeviceGetPCIBusId of each device, by ordinal; empty when there is none.
std::vector<std::string> pci_bus_ids();

// "" when a GPU of compute capability major.minor runs device.precision bf16 (8.0 and newer:
// tensor-core bf16, cuDNN's and cuBLAS's bf16 paths); otherwise the one-line reason naming the
// GPU `name` and its capability, for the ConfigError create_cuda_device throws.
std::string bf16_gpu_gap(int major, int minor, std::string_view name);

// A CudaDevice for options.ordinal. Throws UnsupportedError when that GPU is not present,
// OutOfMemoryError when device.memory bytes cannot be reserved on it, and ConfigError (exit 2)
// for device.precision bf16 on a GPU bf16_gpu_gap refuses.
std::unique_ptr<Device> create_cuda_device(const DeviceOptions& options);

// The CUDA kernels of GPU options.ordinal, without creating the device (for planning).
std::unique_ptr<Kernels> create_cuda_kernels(const DeviceOptions& options);

// Pinned host memory, page-locked and usable by every CUDA context of the process: fresh pages
// placed by `place` and then registered (cudaHostRegister), or, without a placement, from
// cudaHostAlloc(cudaHostAllocPortable) (Note [Pinned pages on a NUMA node] in
// device/host_pages.h).
class CudaPinnedAllocator : public PinnedAllocator {
 public:
  explicit CudaPinnedAllocator(int ordinal, std::function<void(void*, uint64_t)> place = {})
      : ordinal_(ordinal), place_(std::move(place)) {}
  // Throws OutOfMemoryError (kHostPool) when the host cannot pin `bytes` more.
  void* allocate(uint64_t bytes) override;
  // Never throws (the host pool frees from its destructor); a failure is printed.
  void deallocate(void* ptr, uint64_t bytes) override;

 private:
  void* allocate_placed(uint64_t bytes);

  int ordinal_;
  std::function<void(void*, uint64_t)> place_;
};

// Note [Reduction scratch beside the heap]
// Batch norm and the loss reduce through a fixed kReductionScratchBytes (384 KiB, kernel_ops.h)
// of device memory per GPU. CudaDevice allocates it once, in the same cudaMalloc as the heap and
// after its device.memory bytes, and hands it to its kernels; nothing is allocated per launch.
// The heap's capacity stays exactly device.memory, so the planner's budget (which plans the
// heap) is unchanged: the scratch is a fixed cost on top of it, like the library handles', and
// name() reports it ("... device memory + 384.00 KiB kernel scratch"). A device that maps on use
// allocates the scratch alone (Note [Device memory of a shared GPU]).

// Note [Device memory of a shared GPU]
// Jobs sharing a GPU (memory.share) each have a heap of the whole device.memory: the node's job
// ledger, not the heap, keeps each within its grant. One cudaMalloc each would hold device.memory
// per job, and the second job's would fail. With DeviceOptions::map_on_use the heap's range
// is reserved address space (MappedRange) and physical memory is mapped only under live
// allocations, in granules of kSharedGranule (Note [Backing a heap on use] in
// device/heap.h): what the process holds on the GPU follows what its heap holds, MemoryStats::held
// counts it, and the ledger is told that (trainer/share/budget.h). The reduction scratch
// is then a cudaMalloc of its own (384 KiB) for the device's life. A piece the GPU cannot map
// (another process holds the memory) is an OutOfMemoryError with what cuMemGetInfo reports.
// Mapping on use only under memory.share: one cudaMalloc is the path that has run on a GPU, the
// mapped one has not, and a job alone gains nothing from it (its whole device.memory is its own).
// Unmapping waits for the GPU (cuMemUnmap does not) and happens only when an allocation goes,
// which the trainer does between steps once the executor synchronized (the arena at a budget
// switch or growth) and at exit: nothing inside a step maps or unmaps.
class CudaDevice : public Device {
 public:
  explicit CudaDevice(const DeviceOptions& options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  Backend backend() const override { return Backend::kCuda; }
  // "cuda:0 (NVIDIA A100-SXM4-40GB, 40.00 GiB total, 16.00 GiB device memory)".
  std::string name() const override { return name_; }
  DeviceHeap& memory() override { return *heap_; }
  PinnedAllocator& pinned() override { return pinned_; }
  Stream& stream(StreamKind kind) override;
  // A cheap event without timestamps (cudaEventDisableTiming).
  std::unique_ptr<Event> create_event() override;
  // An event that keeps timestamps, for traces: elapsed_ms(start, end).
  std::unique_ptr<Event> create_timing_event() override;
  double elapsed_ms(Event& start, Event& end) override;
  // cudaMemcpyAsync(cudaMemcpyDefault) on `stream`, a stream of this device. Host memory must
  // be pinned (pinned()) for the copy to be asynchronous. With a gating arbiter
  // (DeviceOptions::arbiter), a copy on a copy stream the gate chooses is chunked, each chunk held
  // until its gate opens; the gate decides by the copy's `deadline`.
  using Device::copy_async;
  void copy_async(void* dst, const void* src, uint64_t bytes, Stream& stream,
                  const CopyDeadline& deadline) override;
  Kernels& kernels() override { return kernels_; }
  // cudaStreamSynchronize on each of the four streams.
  void synchronize() override;

  int ordinal() const { return ordinal_; }

 private:
  struct BlockFree {
    int ordinal;
    void operator()(void* ptr) const;
  };
  // Holds the static_asserts of Note [CudaDevice member order]; never called.
  static void check_member_order();

  // Note [CudaDevice member order]
  // Members are destroyed in reverse order of declaration, so everything that uses a stream is
  // declared after streams_: the gated copies enqueue on the copy streams, and the kernels' cuDNN
  // and cuBLAS handles are bound to whichever stream launched last (cudnnDestroy and
  // cublasDestroy may synchronise it). The block and the mapped range are declared first: they
  // are freed last, after every stream has drained, and the heap (which gives its mapped pieces
  // back when it goes) before them. A static_assert in cuda_device.cc keeps this order.
  int ordinal_;
  std::string name_;
  std::unique_ptr<void, BlockFree> block_;  // the one cudaMalloc (mapping on use: the scratch)
  std::unique_ptr<MappedRange> range_;      // mapping on use: the heap's range
  std::unique_ptr<DeviceHeap> heap_;
  CudaPinnedAllocator pinned_;
  std::unique_ptr<CudaStream> streams_[4];  // indexed by StreamKind
  std::unique_ptr<GatedCopies> gated_;      // with DeviceOptions::arbiter; freed once streams drain
  CudaKernels kernels_;                     // handles bound to streams_: destroyed before them
};

}  // namespace ferry::cuda
