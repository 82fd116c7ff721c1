// The out-of-memory error when the GPU itself, not the heap, lacks the memory asked for (the
// device block's cudaMalloc, or a piece a sharing device maps): what was asked, what the driver
// reports free (cuMemGetInfo, through cudaMemGetInfo), and what to change. Invariant: the error
// is kDevice and names the GPU, the allocation and the bytes.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"

namespace ferry::cuda {

// The driver's free and total bytes of a GPU; known = false when it did not say.
struct GpuMemory {
  bool known = false;
  uint64_t free = 0;
  uint64_t total = 0;
};

// cudaMemGetInfo on GPU `ordinal` (the current device is set to it), leaving no error behind.
GpuMemory gpu_memory(int ordinal);

// "out of device memory: '<label>' needs <requested>, <total - free> of <total> in use" with the
// hint "<advice>: cuda:N has F free of T (...)". `advice` says what to change.
OutOfMemoryError gpu_shortage(int ordinal, const std::string& label, uint64_t requested,
                              const GpuMemory& memory, const std::string& advice);

}  // namespace ferry::cuda
