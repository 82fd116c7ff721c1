// topology_gpus_of_cuda: CUDA ordinals to topology GPUs by PCI bus id (bus_ids.h).
#include "topology/bus_ids.h"

#include <optional>

namespace ferry {

std::vector<int> topology_gpus_of_cuda(const std::vector<PciAddress>& topology_gpus,
                                       const std::vector<std::string>& cuda_bus_ids) {
  std::vector<int> out;
  out.reserve(cuda_bus_ids.size());
  for (const std::string& id : cuda_bus_ids) {
    const std::optional<PciAddress> addr = PciAddress::parse(id);
    int found = -1;
    for (size_t i = 0; addr && i < topology_gpus.size(); ++i) {
      if (topology_gpus[i] == *addr) {
        found = static_cast<int>(i);
        break;
      }
    }
    out.push_back(found);
  }
  return out;
}

}  // namespace ferry
