// hwloc CPU and memory binding for rank placement. Bitmaps are owned by a small RAII holder so
// that a throwing check never leaks one.
#include "topology/binding.h"

#include <hwloc.h>

#include <fmt/format.h>

#include "common/error.h"
#include "topology/hwloc_check.h"

namespace ferry {

namespace {

class Bitmap {
 public:
  Bitmap() : b_(hwloc_bitmap_alloc()) {
    if (!b_)
      throw LibraryError("hwloc", "hwloc_bitmap_alloc()", "out of memory", __FILE__, __LINE__);
  }
  ~Bitmap() { hwloc_bitmap_free(b_); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  hwloc_bitmap_t get() const { return b_; }

 private:
  hwloc_bitmap_t b_;
};

std::vector<int> bits(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (int i = hwloc_bitmap_first(set); i >= 0 && i <= (1 << 20); i = hwloc_bitmap_next(set, i)) {
    out.push_back(i);
  }
  return out;
}

void require_live(const HwlocTopology& live) {
  if (!live.is_live()) {
    throw UnsupportedError(
        fmt::format("cannot bind to topology '{}': bindings apply only to the live machine",
                    live.source()),
        "place ranks with a topology from HwlocTopology::live() to bind them");
  }
}

// The CPU set of a binding, checked against the CPUs this process may use.
void cpuset_of(const HwlocTopology& live, const RankBinding& b, Bitmap& set) {
  if (b.cpus.empty()) {
    throw ConfigError(fmt::format("rank {} has no CPUs to bind to", b.local_rank),
                      "place ranks with place_ranks()");
  }
  for (int cpu : b.cpus) HWLOC_CHECK(hwloc_bitmap_set(set.get(), static_cast<unsigned>(cpu)));
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(live.get());
  if (!hwloc_bitmap_isincluded(set.get(), allowed)) {
    throw ConfigError(
        fmt::format("rank {}'s CPUs {} are not all available to this process (allowed: {})",
                    b.local_rank, format_index_list(b.cpus), format_index_list(bits(allowed))),
        "place ranks with the live topology, or widen the process's CPU set (taskset, cgroups)");
  }
}

void nodeset_of(const HwlocTopology& live, int numa, Bitmap& set) {
  if (!hwloc_get_numanode_obj_by_os_index(live.get(), static_cast<unsigned>(numa))) {
    throw ConfigError(fmt::format("NUMA node {} does not exist on this machine", numa),
                      "place ranks with the live topology");
  }
  HWLOC_CHECK(hwloc_bitmap_set(set.get(), static_cast<unsigned>(numa)));
}

}  // namespace

void bind_thread(const HwlocTopology& live, const RankBinding& binding) {
  require_live(live);
  const auto* support = hwloc_topology_get_support(live.get());
  if (!support->cpubind->set_thisthread_cpubind) {
    throw UnsupportedError("this OS cannot bind threads to CPUs through hwloc",
                           "run without CPU binding");
  }
  Bitmap set;
  cpuset_of(live, binding, set);
  HWLOC_CHECK(hwloc_set_cpubind(live.get(), set.get(), HWLOC_CPUBIND_THREAD));
}

bool bind_process(const HwlocTopology& live, const RankBinding& binding) {
  require_live(live);
  const auto* support = hwloc_topology_get_support(live.get());
  Bitmap cpus;
  cpuset_of(live, binding, cpus);
  if (support->cpubind->set_thisproc_cpubind) {
    HWLOC_CHECK(hwloc_set_cpubind(live.get(), cpus.get(), HWLOC_CPUBIND_PROCESS));
  } else if (support->cpubind->set_thisthread_cpubind) {
    HWLOC_CHECK(hwloc_set_cpubind(live.get(), cpus.get(), HWLOC_CPUBIND_THREAD));
  } else {
    throw UnsupportedError("this OS cannot bind processes to CPUs through hwloc",
                           "run without CPU binding");
  }
  Bitmap nodes;
  nodeset_of(live, binding.numa, nodes);
  const auto* mem = support->membind;
  if (!mem->bind_membind || !(mem->set_thisproc_membind || mem->set_thisthread_membind)) {
    return false;
  }
  // Neither PROCESS nor THREAD: hwloc binds the process where the OS can, else this thread
  // (Linux), whose policy threads created later inherit.
  HWLOC_CHECK(
      hwloc_set_membind(live.get(), nodes.get(), HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET));
  return true;
}

bool bind_memory(const HwlocTopology& live, void* addr, size_t bytes, int numa) {
  require_live(live);
  if (!addr || bytes == 0) {
    throw ConfigError("cannot bind an empty memory area", "bind the pool after allocating it");
  }
  Bitmap nodes;
  nodeset_of(live, numa, nodes);
  const auto* mem = hwloc_topology_get_support(live.get())->membind;
  if (!mem->set_area_membind || !mem->bind_membind) return false;
  int flags = HWLOC_MEMBIND_BYNODESET;
  if (mem->migrate_membind) flags |= HWLOC_MEMBIND_MIGRATE;
  HWLOC_CHECK(
      hwloc_set_area_membind(live.get(), addr, bytes, nodes.get(), HWLOC_MEMBIND_BIND, flags));
  return true;
}

std::vector<int> current_thread_cpus(const HwlocTopology& live) {
  require_live(live);
  Bitmap set;
  HWLOC_CHECK(hwloc_get_cpubind(live.get(), set.get(), HWLOC_CPUBIND_THREAD));
  return bits(set.get());
}

std::vector<int> area_binding(const HwlocTopology& live, const void* addr, size_t bytes) {
  require_live(live);
  Bitmap set;
  hwloc_membind_policy_t policy = HWLOC_MEMBIND_DEFAULT;
  if (hwloc_get_area_membind(live.get(), addr, bytes, set.get(), &policy, HWLOC_MEMBIND_BYNODESET) <
          0 ||
      policy != HWLOC_MEMBIND_BIND) {
    return {};
  }
  return bits(set.get());
}

std::vector<int> memory_location(const HwlocTopology& live, const void* addr, size_t bytes) {
  require_live(live);
  Bitmap set;
  if (hwloc_get_area_memlocation(live.get(), addr, bytes, set.get(), HWLOC_MEMBIND_BYNODESET) < 0) {
    return {};
  }
  return bits(set.get());
}

}  // namespace ferry
