// The CPU backend's Device: device memory is one lazily committed block of the configured
// capacity; kernels run in order on the compute stream's thread (oneDNN with OpenMP); copies
// run on one thread per direction and, when cpu.link_gbps is set, take as long as that link
// would, or go through the copy arbiter's pacer.
#pragma once

#include <memory>

#include "device/cpu/cpu_kernels.h"
#include "device/cpu/cpu_stream.h"
#include "device/device.h"

namespace ferry::cpu {

// Page-aligned host pages, placed by DeviceOptions::place_host_memory before they are first
// touched (Note [Pinned pages on a NUMA node] in device/host_pages.h).
class CpuPinnedAllocator : public PinnedAllocator {
 public:
  explicit CpuPinnedAllocator(std::function<void(void*, uint64_t)> place = {})
      : place_(std::move(place)) {}
  void* allocate(uint64_t bytes) override;
  void deallocate(void* ptr, uint64_t bytes) override;

 private:
  std::function<void(void*, uint64_t)> place_;
};

class CpuDevice : public Device {
 public:
  explicit CpuDevice(const DeviceOptions& options);
  ~CpuDevice() override;

  Backend backend() const override { return Backend::kCpu; }
  std::string name() const override;
  DeviceHeap& memory() override { return *heap_; }
  PinnedAllocator& pinned() override { return pinned_; }
  Stream& stream(StreamKind kind) override;
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  // Every CPU event keeps its completion time.
  std::unique_ptr<Event> create_timing_event() override { return std::make_unique<CpuEvent>(); }
  double elapsed_ms(Event& start, Event& end) override;
  using Device::copy_async;
  void copy_async(void* dst, const void* src, uint64_t bytes, Stream& stream,
                  const CopyDeadline& deadline) override;
  Kernels& kernels() override { return *kernels_; }
  void synchronize() override;

  int threads() const { return threads_; }

 private:
  DeviceOptions options_;
  std::shared_ptr<CopyPacer> pacer_;  // options_.arbiter's, when set
  int threads_;
  void* block_ = nullptr;
  std::unique_ptr<DeviceHeap> heap_;
  CpuPinnedAllocator pinned_;
  std::unique_ptr<CpuKernels> kernels_;
  std::unique_ptr<CpuStream> streams_[4];
};

}  // namespace ferry::cpu
