// Path classes (Note [Path classes]) by an explicit common-ancestor walk over the model's PCI
// tree. The walk is bounded by the tree depth: validation guarantees parents precede children.
#include "topology/paths.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

bool intersects(const std::vector<int>& a, const std::vector<int>& b) {
  auto i = a.begin();
  auto j = b.begin();
  while (i != a.end() && j != b.end()) {
    if (*i == *j) return true;
    if (*i < *j) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

// Bridges strictly between `node` and its ancestor `lca`.
int bridges_between(const Topology& t, int node, int lca) {
  int count = 0;
  for (int a = t.pci()[node].parent; a >= 0 && a != lca; a = t.pci()[a].parent) {
    if (t.pci()[a].kind == PciKind::kBridge) ++count;
  }
  return count;
}

void check_index(const char* what, int index, size_t count, const Topology& t) {
  if (index < 0 || index >= static_cast<int>(count)) {
    throw ConfigError(
        fmt::format("{} {} does not exist: topology '{}' has {}", what, index, t.name(), count),
        fmt::format("use a {} index below {}", what, count));
  }
}

}  // namespace

const char* path_class_name(PathClass c) {
  switch (c) {
    case PathClass::kPix:
      return "PIX";
    case PathClass::kPxb:
      return "PXB";
    case PathClass::kPhb:
      return "PHB";
    case PathClass::kNode:
      return "NODE";
    case PathClass::kSys:
      return "SYS";
  }
  return "SYS";
}

std::optional<PathClass> parse_path_class(std::string_view name) {
  for (PathClass c :
       {PathClass::kPix, PathClass::kPxb, PathClass::kPhb, PathClass::kNode, PathClass::kSys}) {
    if (name == path_class_name(c)) return c;
  }
  return std::nullopt;
}

const char* path_class_legend(PathClass c) {
  switch (c) {
    case PathClass::kPix:
      return "Connection traversing at most a single PCIe bridge";
    case PathClass::kPxb:
      return "Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
             "Bridge)";
    case PathClass::kPhb:
      return "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)";
    case PathClass::kNode:
      return "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
             "within a NUMA node";
    case PathClass::kSys:
      return "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
             "(e.g., QPI/UPI)";
  }
  return "";
}

std::optional<PathClass> path_class(const Topology& t, int a, int b) {
  const int n = static_cast<int>(t.pci().size());
  FERRY_ASSERT(a >= 0 && a < n && b >= 0 && b < n, "PCI node index out of range");
  if (a == b) return std::nullopt;
  const int rc_a = t.root_complex_of(a);
  const int rc_b = t.root_complex_of(b);
  if (rc_a != rc_b) {
    const auto& la = t.root_complexes()[rc_a].locality.numa;
    const auto& lb = t.root_complexes()[rc_b].locality.numa;
    return intersects(la, lb) ? PathClass::kNode : PathClass::kSys;
  }
  // Lowest common ancestor: mark a's ancestors (including a), then climb from b.
  std::vector<int> chain;
  for (int x = a; x >= 0; x = t.pci()[x].parent) chain.push_back(x);
  int lca = -1;
  for (int y = b; y >= 0 && lca < 0; y = t.pci()[y].parent) {
    if (std::find(chain.begin(), chain.end(), y) != chain.end()) lca = y;
  }
  FERRY_ASSERT(lca >= 0, "nodes under one root complex without a common ancestor");
  if (t.pci()[lca].kind == PciKind::kHostBridge) return PathClass::kPhb;
  const int between = std::max(bridges_between(t, a, lca), bridges_between(t, b, lca));
  return between <= 1 ? PathClass::kPix : PathClass::kPxb;
}

PathClass gpu_pair_class(const Topology& t, int gpu_a, int gpu_b) {
  check_index("GPU", gpu_a, t.gpus().size(), t);
  check_index("GPU", gpu_b, t.gpus().size(), t);
  if (gpu_a == gpu_b) {
    throw ConfigError(fmt::format("GPU {} paired with itself", gpu_a),
                      "ask for the class of two different GPUs");
  }
  return *path_class(t, t.gpus()[gpu_a].node, t.gpus()[gpu_b].node);
}

PathClass gpu_nic_class(const Topology& t, int gpu, int nic) {
  check_index("GPU", gpu, t.gpus().size(), t);
  check_index("NIC", nic, t.nics().size(), t);
  return *path_class(t, t.gpus()[gpu].node, t.nics()[nic].node);
}

std::vector<std::vector<std::string>> class_matrix(const Topology& t) {
  std::vector<int> nodes;
  for (const auto& g : t.gpus()) nodes.push_back(g.node);
  for (const auto& nic : t.nics()) nodes.push_back(nic.node);
  std::vector<std::vector<std::string>> m(nodes.size(), std::vector<std::string>(nodes.size()));
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (size_t j = 0; j < nodes.size(); ++j) {
      const auto c = path_class(t, nodes[i], nodes[j]);
      m[i][j] = c ? path_class_name(*c) : "X";
    }
  }
  return m;
}

}  // namespace ferry
