// CPU device: the memory block (under memory.share, given back to the OS a granule at a time),
// the four streams and copies.
#include "device/cpu/cpu_device.h"

#include <omp.h>
#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/bytes.h"
#include "device/backend_traits.h"
#include "device/host_pages.h"

namespace ferry::cpu {

void* CpuPinnedAllocator::allocate(uint64_t bytes) {
  void* ptr = map_host_pages(bytes);
  if (place_) {
    try {
      place_(ptr, host_page_bytes(bytes));
    } catch (...) {
      unmap_host_pages(ptr, bytes);
      throw;
    }
  }
  return ptr;
}

void CpuPinnedAllocator::deallocate(void* ptr, uint64_t bytes) { unmap_host_pages(ptr, bytes); }

void PageBacking::unback(uint64_t offset, uint64_t bytes) noexcept {
  // Private anonymous pages: dropped now, zero-filled if touched again.
  if (madvise(base_ + offset, bytes, MADV_DONTNEED) != 0) {
    std::fprintf(stderr, "ferry: warning: madvise(MADV_DONTNEED) of %s of device memory failed\n",
                 format_bytes(bytes).c_str());
  }
}

CpuDevice::CpuDevice(const DeviceOptions& options)
    : options_(options), pinned_(options.place_host_memory) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  threads_ = options.cpu.threads > 0 ? options.cpu.threads : std::max(1, cores);
  if (options.memory == 0) throw ConfigError("device.memory must be positive");
  if (options.arbiter) {
    // Note [One hook, two protocols] in device/copy_arbiter.h: a CPU device's copies are paced.
    CopyPacer* pacer = options.arbiter->pacer();
    if (!pacer) {
      throw UnsupportedError("a cpu device's copies are paced, and its copy arbiter does not pace",
                             "give a cpu device a pacing arbiter (links/link_emulator.h)");
    }
    pacer_ = std::shared_ptr<CopyPacer>(options.arbiter, pacer);
  }
  // Reserve address space only; pages are committed when first touched. Mapping on use, the
  // range reaches a whole granule past the capacity from a base aligned to the granule.
  const uint64_t g = kSharedGranule;
  block_bytes_ = options.map_on_use ? (options.memory + g - 1) / g * g + g : options.memory;
  block_ = mmap(nullptr, block_bytes_, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (block_ == MAP_FAILED) {
    block_ = nullptr;
    throw OutOfMemoryError(OutOfMemoryError::Where::kDevice, "device block", options.memory, 0, 0,
                           {}, "lower device.memory: the address space could not be reserved");
  }
  if (options.map_on_use) {
    auto* base =
        reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(block_) + g - 1) / g * g);
    backing_ = std::make_unique<PageBacking>(base);
    heap_ = std::make_unique<DeviceHeap>(base, options.memory, backing_.get());
  } else {
    heap_ = std::make_unique<DeviceHeap>(block_, options.memory);
  }
  kernels_ = std::make_unique<CpuKernels>(threads_);
  const int threads = threads_;
  streams_[0] = std::make_unique<CpuStream>(StreamKind::kCompute,
                                            [threads] { omp_set_num_threads(threads); });
  streams_[1] = std::make_unique<CpuStream>(StreamKind::kDeviceToHost);
  streams_[2] = std::make_unique<CpuStream>(StreamKind::kHostToDevice);
  streams_[3] = std::make_unique<CpuStream>(StreamKind::kComm);
}

CpuDevice::~CpuDevice() {
  for (auto& s : streams_) s.reset();  // drain and join before the memory goes
  kernels_.reset();
  heap_.reset();
  backing_.reset();
  if (block_) munmap(block_, block_bytes_);
}

std::string CpuDevice::name() const {
  return fmt::format(
      "cpu:{} ({} threads, {} device memory{})", options_.ordinal, threads_,
      format_bytes(options_.memory),
      backing_ ? fmt::format(" held on use in {} granules", format_bytes(backing_->granule()))
               : "");
}

Stream& CpuDevice::stream(StreamKind kind) { return *streams_[static_cast<int>(kind)]; }

void CpuDevice::copy_async(void* dst, const void* src, uint64_t bytes, Stream& stream,
                           const CopyDeadline& deadline) {
  if (pacer_) {
    // The direction from the addresses: a copy into the device block goes to the device.
    const auto* d = static_cast<const std::byte*>(dst);
    const auto* base = static_cast<const std::byte*>(block_);
    const bool to_device = d >= base && d < base + options_.memory;
    const uint64_t ticket = pacer_->enqueue(to_device, bytes, deadline);
    std::shared_ptr<CopyPacer> pacer = pacer_;
    static_cast<CpuStream&>(stream).enqueue([dst, src, ticket, pacer] {
      pacer->carry(ticket, [dst, src](uint64_t offset, uint64_t length) {
        std::memcpy(static_cast<std::byte*>(dst) + offset,
                    static_cast<const std::byte*>(src) + offset, length);
      });
    });
    return;
  }
  const double gbps = options_.cpu.link_gbps;
  static_cast<CpuStream&>(stream).enqueue([dst, src, bytes, gbps] {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    if (gbps > 0) {
      const auto link_time =
          std::chrono::duration<double>(static_cast<double>(bytes) / (gbps * 1e9));
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<std::chrono::nanoseconds>(link_time));
    }
  });
}

double CpuDevice::elapsed_ms(Event& start, Event& end) {
  const auto& a = static_cast<CpuEvent&>(start).state();
  const auto& b = static_cast<CpuEvent&>(end).state();
  std::chrono::steady_clock::time_point ta, tb;
  {
    std::lock_guard lock(a->mu);
    ta = a->completed_at;
  }
  {
    std::lock_guard lock(b->mu);
    tb = b->completed_at;
  }
  return std::chrono::duration<double, std::milli>(tb - ta).count();
}

void CpuDevice::synchronize() {
  for (auto& s : streams_) s->synchronize();
}

}  // namespace ferry::cpu
