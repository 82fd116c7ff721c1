// Matching the GPUs of the topology (hwloc's PCI devices) to CUDA's enumeration by PCI bus id,
// never by index (Note [Why GPUs match by bus id]). Invariant: a match pairs two names of the
// same PCI function (domain, bus, device, function).
#pragma once

#include <string>
#include <vector>

#include "topology/pci.h"

// Note [Why GPUs match by bus id]
// CUDA orders GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES
// hides some, while hwloc lists every GPU in PCI order: an index is never an ordinal.

namespace ferry {

// For each CUDA ordinal, the index into `topology_gpus` of the GPU at its bus id
// (cudaDeviceGetPCIBusId's "0000:3B:00.0", any case, 4- or 8-digit domain), or -1 when the
// topology has no GPU there or the id does not parse.
std::vector<int> topology_gpus_of_cuda(const std::vector<PciAddress>& topology_gpus,
                                       const std::vector<std::string>& cuda_bus_ids);

}  // namespace ferry
