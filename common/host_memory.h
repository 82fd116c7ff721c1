// How much host memory the machine can still give (MemAvailable of /proc/meminfo).
#pragma once

#include <cstdint>
#include <optional>

namespace ferry {

// Bytes available for new allocations without swapping, or nullopt where unknown.
std::optional<uint64_t> available_host_memory();

}  // namespace ferry
