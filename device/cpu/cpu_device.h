// The CPU backend's Device: device memory is one lazily committed block of the configured
// capacity (under memory.share, given back a granule at a time as a GPU's would be); kernels run
// in order on the compute stream's thread (oneDNN with OpenMP); copies run on one thread per
// direction and, when cpu.link_gbps is set, take as long as that link would, or go through the
// copy arbiter's pacer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "device/backend_traits.h"
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

// The emulated device's HeapBacking under memory.share (DeviceOptions::map_on_use): pages commit
// when first touched, and a granule no allocation touches any more goes back to the OS, so the
// emulated device holds what a GPU sharing its memory would (Note [Backing a heap on use] in
// device/heap.h). back() cannot fail: the range is reserved, the pages come on first touch.
class PageBacking final : public HeapBacking {
 public:
  explicit PageBacking(std::byte* base) : base_(base) {}
  uint64_t granule() const override { return kSharedGranule; }
  void back(uint64_t, uint64_t, const std::string&, uint64_t) override {}
  void unback(uint64_t offset, uint64_t bytes) noexcept override;

 private:
  std::byte* base_;
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
  uint64_t block_bytes_ = 0;
  std::unique_ptr<PageBacking> backing_;  // mapping on use; outlives the heap
  std::unique_ptr<DeviceHeap> heap_;
  CpuPinnedAllocator pinned_;
  std::unique_ptr<CpuKernels> kernels_;
  std::unique_ptr<CpuStream> streams_[4];
};

}  // namespace ferry::cpu
