// A reserved range of one GPU's virtual addresses, backed by physical memory only in the pieces a
// DeviceHeap asks for (Note [Backing a heap on use] in device/heap.h): a CUDA device sharing its
// GPU (memory.share) holds what its heap holds, not its whole device.memory. Invariant: every
// piece backed is its own physical allocation, mapped read-write for this GPU, and is unmapped
// whole once the GPU is idle; the reservation is freed last.
#pragma once

#include <cstdint>
#include <string>

#include "device/heap.h"

namespace ferry::cuda {

// Note [The driver through the runtime]
// Virtual memory management is the driver API's (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemGetAllocationGranularity). ferry links the CUDA
// runtime only, never libcuda, so that its binaries load on machines without a driver; the
// runtime hands out the driver's entry points (cudaGetDriverEntryPointByVersion, asking for the
// ABI of CUDA 12.0), loaded once per process on first use. A driver without them, or a GPU
// without CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, is an UnsupportedError that
// says to turn memory.share off.

class MappedRange final : public HeapBacking {
 public:
  // Reserves `bytes` rounded up to the granule of GPU `ordinal`'s address space, mapping
  // nothing. `granule` must be a multiple of the driver's allocation granularity there (2 MiB on
  // every GPU since Pascal); UnsupportedError otherwise, or without virtual memory management.
  MappedRange(int ordinal, uint64_t bytes, uint64_t granule);
  // Frees the reservation; nothing may be mapped any more (the heap gave everything back).
  ~MappedRange() override;
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;

  void* base() const { return reinterpret_cast<void*>(base_); }
  uint64_t reserved() const { return reserved_; }
  // Bytes mapped now.
  uint64_t mapped() const { return mapped_; }

  uint64_t granule() const override { return granule_; }
  // cuMemCreate of the piece on this GPU, cuMemMap at its offset, read-write access for this
  // GPU; the handle is released at once (the mapping keeps the memory). Throws OutOfMemoryError
  // naming the allocation and what cuMemGetInfo reports when the GPU has not the memory (another
  // process holds it), with nothing of the piece left mapped.
  void back(uint64_t offset, uint64_t bytes, const std::string& label, uint64_t asked) override;
  // Waits for the GPU (cudaDeviceSynchronize: the driver does not wait for work that may still
  // use the piece), then cuMemUnmap, which frees its memory. A failure is printed.
  void unback(uint64_t offset, uint64_t bytes) noexcept override;

 private:
  int ordinal_;
  uint64_t granule_;
  uint64_t reserved_ = 0;
  uint64_t base_ = 0;  // a CUdeviceptr
  uint64_t mapped_ = 0;
};

}  // namespace ferry::cuda
