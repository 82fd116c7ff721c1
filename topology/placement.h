// Rank placement, pure over a Topology: for each local rank, the GPU it drives and the NUMA node
// (and CPUs) its pinned host pool and threads bind to; binding.h applies it on the live machine.
// Invariant: a binding's NUMA node always has CPUs (Note [No CPU-less node]), its cpus non-empty.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topology/model.h"

// Note [No CPU-less node]
// CPU-less memory nodes, such as GPU HBM exposed over NVLink, are never chosen.

namespace ferry {

// How ranks that share a NUMA node share its CPUs.
enum class CpuShare {
  kSplit,      // whole cores divided evenly between them (what mpirun --map-by numa does)
  kWholeNode,  // each may run on every CPU of the node
};

struct PlacementOptions {
  // false: place as CPU-backend ranks (spread over NUMA nodes) even when NVIDIA GPUs exist.
  bool use_gpus = true;
  // The GPU of each local rank (indices in PCI order); empty means rank i drives GPU i.
  std::vector<int> gpus;
  CpuShare cpu_share = CpuShare::kSplit;
};

struct RankBinding {
  int local_rank = 0;
  std::optional<int> gpu;  // GPU index in PCI order; nullopt when no NVIDIA GPU drives the rank
  std::optional<PciAddress> gpu_pci;  // its bus id, for cudaDeviceGetByPCIBusId
  int numa = 0;                       // NUMA os index for pinned host memory and threads
  std::vector<int> cpus;              // PU os indices the rank's threads bind to
  std::string reason;                 // "local to GPU3", "no NVIDIA GPU: spread over NUMA nodes"
};

// Places `local_ranks` ranks. With GPUs (and use_gpus): rank i drives gpus[i] (or GPU i) and binds
// to that GPU's local NUMA node; ranks sharing a GPU's locality spread over its CPU nodes. With
// no NVIDIA GPU, or use_gpus false: rank i goes to the i-th CPU-bearing NUMA node round-robin.
// Throws ConfigError when there are more ranks than GPUs, a GPU index is bad or repeated.
std::vector<RankBinding> place_ranks(const Topology& topology, int local_ranks,
                                     const PlacementOptions& options = {});

// The bindings table printed at start:
//   rank  gpu   pci           numa  cpus          why
//   0     GPU0  0000:34:00.0  0     0-19,40-59    local to GPU0
std::string format_bindings(const std::vector<RankBinding>& bindings);

}  // namespace ferry
