// Fixture paths and the load-once caches of the topology tests.
#include "tests/topology/fixtures.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "topology/hwloc_topology.h"
#include "topology/synthetic.h"

// Note [Sanitizer runs and hwloc's own leaks]
// Under AddressSanitizer, LeakSanitizer reports two leaks that are hwloc's, not ours; a plain C
// program calling only hwloc reproduces both byte for byte:
// - hwloc 2.9 leaks objects (hwloc_alloc_setup_object) when an XML import fails; suppressed.
// - the hwloc_pci plugin's libpciaccess keeps global state that LSan reports once hwloc
//   dlcloses the plugin at exit ("<unknown module>" frames); keeping libpciaccess loaded
//   (RTLD_NODELETE) lets LSan see that state as still referenced.
#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
extern "C" const char* __lsan_default_suppressions() { return "leak:libhwloc.so\n"; }
namespace {
[[maybe_unused]] void* const kKeepPciAccess = dlopen("libpciaccess.so.0", RTLD_NOW | RTLD_NODELETE);
}  // namespace
#endif

namespace ferry::testing {

std::string real_dir() { return std::string(FERRY_SOURCE_DIR) + "/../shared/topologies/real"; }

bool have_real_dir() { return std::filesystem::is_directory(real_dir()); }

std::string config_path(const std::string& name) {
  return std::string(FERRY_SOURCE_DIR) + "/configs/topologies/" + name;
}

const Topology& real(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Topology>> cache;
  auto& slot = cache[name];
  if (!slot) slot = std::make_unique<Topology>(load_xml(real_dir() + "/" + name));
  return *slot;
}

const Topology& synthetic(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Topology>> cache;
  auto& slot = cache[name];
  if (!slot) slot = std::make_unique<Topology>(load_yaml(config_path(name)));
  return *slot;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace ferry::testing
