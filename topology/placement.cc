// Rank placement over the model: GPU choice, NUMA node choice among CPU-bearing nodes only, and
// the division of a node's cores between the ranks that share it.
#include "topology/placement.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

std::vector<int> cpu_nodes(const Topology& t) {
  std::vector<int> out;
  for (const auto& m : t.numa_nodes()) {
    if (m.has_cpus()) out.push_back(m.os_index);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Gives each rank on a NUMA node its CPUs.
void assign_cpus(const Topology& t, CpuShare share, std::vector<RankBinding>& bindings) {
  std::map<int, std::vector<int>> ranks_on;  // numa -> binding positions, in rank order
  for (size_t i = 0; i < bindings.size(); ++i)
    ranks_on[bindings[i].numa].push_back(static_cast<int>(i));
  for (const auto& [numa, ranks] : ranks_on) {
    const NumaNode& node = t.numa(numa);
    const size_t k = ranks.size();
    const auto& cores = node.cores;
    for (size_t j = 0; j < k; ++j) {
      std::vector<int> cpus;
      if (share == CpuShare::kWholeNode || k == 1) {
        cpus = node.cpus;
      } else if (cores.size() >= k) {
        // Contiguous runs of whole cores, sizes differing by at most one.
        const size_t begin = j * cores.size() / k;
        const size_t end = (j + 1) * cores.size() / k;
        for (size_t c = begin; c < end; ++c)
          cpus.insert(cpus.end(), cores[c].begin(), cores[c].end());
      } else {
        const auto& core = cores[j % cores.size()];
        cpus.assign(core.begin(), core.end());
      }
      std::sort(cpus.begin(), cpus.end());
      bindings[ranks[j]].cpus = std::move(cpus);
    }
  }
}

}  // namespace

std::vector<RankBinding> place_ranks(const Topology& t, int local_ranks,
                                     const PlacementOptions& options) {
  if (local_ranks < 1 || local_ranks > 4096) {
    throw ConfigError(fmt::format("{} local ranks cannot be placed", local_ranks),
                      "run between 1 and 4096 ranks per machine");
  }
  std::vector<RankBinding> bindings(local_ranks);
  const int ngpu = static_cast<int>(t.gpus().size());
  const bool gpu_mode = options.use_gpus && ngpu > 0;
  if (!options.gpus.empty() && !gpu_mode) {
    throw ConfigError(fmt::format("GPUs were assigned to ranks but topology '{}' has {}", t.name(),
                                  ngpu == 0 ? "no NVIDIA GPU" : "GPU placement switched off"),
                      "drop the GPU list to place CPU-backend ranks");
  }
  if (gpu_mode) {
    std::vector<int> gpu_of = options.gpus;
    if (gpu_of.empty()) {
      if (local_ranks > ngpu) {
        throw ConfigError(fmt::format("{} local ranks but topology '{}' has only {} NVIDIA GPUs",
                                      local_ranks, t.name(), ngpu),
                          fmt::format("run at most {} ranks per machine (one per GPU)", ngpu));
      }
      for (int i = 0; i < local_ranks; ++i) gpu_of.push_back(i);
    }
    if (static_cast<int>(gpu_of.size()) != local_ranks) {
      throw ConfigError(fmt::format("{} GPUs given for {} local ranks", gpu_of.size(), local_ranks),
                        "give exactly one GPU per local rank");
    }
    std::set<int> seen;
    std::map<int, int> load;  // numa -> ranks so far
    for (int r = 0; r < local_ranks; ++r) {
      const int g = gpu_of[r];
      if (g < 0 || g >= ngpu || !seen.insert(g).second) {
        throw ConfigError(fmt::format("rank {} is given GPU {}, which is {}", r, g,
                                      g < 0 || g >= ngpu ? "not a GPU index" : "already taken"),
                          fmt::format("use distinct GPU indices from 0 to {}", ngpu - 1));
      }
      const PciEndpoint& gpu = t.gpus()[g];
      int best = gpu.local_numa.front();
      for (int m : gpu.local_numa) {
        if (load[m] < load[best]) best = m;
      }
      ++load[best];
      auto& b = bindings[r];
      b.local_rank = r;
      b.gpu = g;
      b.gpu_pci = gpu.addr;
      b.numa = best;
      b.reason = fmt::format("local to {}", gpu.label);
    }
  } else {
    const std::vector<int> nodes = cpu_nodes(t);  // non-empty: Topology guarantees it
    for (int r = 0; r < local_ranks; ++r) {
      auto& b = bindings[r];
      b.local_rank = r;
      b.numa = nodes[r % nodes.size()];
      b.reason = ngpu == 0 ? "no NVIDIA GPU: spread over NUMA nodes"
                           : "CPU backend: spread over NUMA nodes";
    }
  }
  assign_cpus(t, options.cpu_share, bindings);
  return bindings;
}

std::string format_bindings(const std::vector<RankBinding>& bindings) {
  std::string out =
      fmt::format("{:<6}{:<7}{:<14}{:<6}{:<20}{}\n", "rank", "gpu", "pci", "numa", "cpus", "why");
  for (const auto& b : bindings) {
    const std::string cpus = format_index_list(b.cpus);
    out += fmt::format("{:<6}{:<7}{:<14}{:<6}{:<20}{}\n", b.local_rank,
                       b.gpu ? fmt::format("GPU{}", *b.gpu) : "none",
                       b.gpu_pci ? b.gpu_pci->str() : "-", b.numa, cpus, b.reason);
  }
  return out;
}

}  // namespace ferry
