// Applies a RankBinding on this machine through hwloc: thread and process CPU binding, process
// memory binding, and binding of an allocated area (the pinned host pool) to a NUMA node.
// Invariant: only a live HwlocTopology is accepted (Note [Binding needs a live topology]).
#pragma once

#include <cstddef>
#include <vector>

#include "topology/hwloc_topology.h"
#include "topology/placement.h"

// Note [Binding needs a live topology]
// An XML topology's binding hooks silently do nothing, so only a live HwlocTopology is accepted.
// Every failure is a typed error.

namespace ferry {

// Binds the calling thread to binding.cpus. Throws UnsupportedError when `live` is not the
// live machine or the OS cannot bind threads, LibraryError when hwloc refuses the CPU set.
void bind_thread(const HwlocTopology& live, const RankBinding& binding);

// Binds the whole process: CPUs, and memory to binding.numa (HWLOC_MEMBIND_BIND) when the OS
// supports process memory binding; returns false when memory binding was not supported.
bool bind_process(const HwlocTopology& live, const RankBinding& binding);

// Binds [addr, addr + bytes) to NUMA node `numa` (os index), moving pages already touched. Call
// it on the host pool right after allocating it. Returns false when the OS cannot bind areas.
bool bind_memory(const HwlocTopology& live, void* addr, size_t bytes, int numa);

// The PU os indices the calling thread may run on.
std::vector<int> current_thread_cpus(const HwlocTopology& live);

// The NUMA os indices [addr, addr + bytes) is bound to (policy HWLOC_MEMBIND_BIND); empty when
// the area has another policy (the default: first touch) or the OS cannot tell.
std::vector<int> area_binding(const HwlocTopology& live, const void* addr, size_t bytes);

// The NUMA os indices `addr`'s pages (first byte) currently live on; empty when unknown.
std::vector<int> memory_location(const HwlocTopology& live, const void* addr, size_t bytes);

}  // namespace ferry
