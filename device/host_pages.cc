// Anonymous page mappings for pinned host blocks.
#include "device/host_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.h"

namespace ferry {

uint64_t host_page_bytes(uint64_t bytes) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (std::max<uint64_t>(bytes, 1) + page - 1) / page * page;
}

void* map_host_pages(uint64_t bytes) {
  void* ptr = mmap(nullptr, host_page_bytes(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) {
    throw OutOfMemoryError(OutOfMemoryError::Where::kHostPool, "pinned block", bytes, 0, 0, {},
                           "the machine is out of host memory: lower memory.host_limit");
  }
  return ptr;
}

void unmap_host_pages(void* ptr, uint64_t bytes) {
  if (ptr != nullptr) munmap(ptr, host_page_bytes(bytes));
}

}  // namespace ferry
