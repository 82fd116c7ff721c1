// Fresh, page-aligned host pages for the pinned allocators of every backend, mapped but not yet
// touched, so that a placement policy set on them decides the NUMA node they land on.
// Invariant: a mapping's pages are untouched until map_host_pages returns.

// Note [Pinned pages on a NUMA node]
// Copies between the GPU and pinned memory cross the link from the GPU to that memory's NUMA
// node; memory on the other socket adds the inter-socket link to every copy. A page lands on
// the node of its first touch unless a policy was set before, and pinning touches it
// (cudaHostAlloc pins at once), so a block must be bound before it is pinned: the allocators map
// fresh pages, hand them to DeviceOptions::place_host_memory (the session binds them with hwloc
// to the node local to the rank's GPU; device/ knows nothing of topology), then pin them
// (cudaHostRegister on CUDA; the CPU backend's pages are simply kept). Without a placement the
// CUDA allocator uses cudaHostAlloc and the OS's first-touch placement.
#pragma once

#include <cstdint>

namespace ferry {

// `bytes` rounded up to whole pages (at least one).
uint64_t host_page_bytes(uint64_t bytes);
// A private anonymous mapping of host_page_bytes(bytes), untouched. Throws OutOfMemoryError
// (kHostPool) when the address space cannot be mapped.
void* map_host_pages(uint64_t bytes);
// Unmaps a mapping of map_host_pages(bytes). Never throws.
void unmap_host_pages(void* ptr, uint64_t bytes);

}  // namespace ferry
