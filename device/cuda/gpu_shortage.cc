// The out-of-memory error of a GPU that lacks the memory asked for.
#include "device/cuda/gpu_shortage.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "common/bytes.h"

namespace ferry::cuda {

GpuMemory gpu_memory(int ordinal) {
  GpuMemory m;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  m.known = cudaSetDevice(ordinal) == cudaSuccess &&
            cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  (void)cudaGetLastError();  // not sticky; keep it out of later cudaGetLastError() checks
  if (m.known) {
    m.free = free_bytes;
    m.total = total_bytes;
  }
  return m;
}

OutOfMemoryError gpu_shortage(int ordinal, const std::string& label, uint64_t requested,
                              const GpuMemory& memory, const std::string& advice) {
  const std::string have = memory.known
                               ? fmt::format("cuda:{} has {} free of {}", ordinal,
                                             format_bytes(memory.free), format_bytes(memory.total))
                               : fmt::format("cuda:{} did not report its free memory", ordinal);
  return OutOfMemoryError(OutOfMemoryError::Where::kDevice, label, requested,
                          memory.known ? memory.total - memory.free : 0,
                          memory.known ? memory.total : 0, {},
                          fmt::format("{}: {} (other processes may hold the rest)", advice, have));
}

}  // namespace ferry::cuda
