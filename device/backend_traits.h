// What the layers above device/ need to know of a backend before (or without) creating a device
// (Note [What a backend's traits answer]). Invariant: every answer that depends on the backend
// comes from here (or the Device), so no caller tests the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "device/device.h"

// Note [What a backend's traits answer]
// How its copies are arbitrated, whether its devices are the machine's GPUs, what planning
// assumes of its speed, and the kernels planning sizes workspaces with.

namespace ferry {

// The FLOP model's rates for a device nobody measured (Note [Default device rates]).
struct DeviceRates {
  double compute_flops = 0;  // sustained FLOP/s of the compute stream
  double memory_gbps = 0;    // device memory bandwidth for memory-bound steps
  double link_gbps = 0;      // host<->device copies, per direction
};

struct BackendTraits {
  // How a link arbiter reaches this backend's copies (Note [One hook, two protocols] in
  // device/copy_arbiter.h).
  CopyArbitration arbitration = CopyArbitration::kPaced;
  // Its devices are the machine's GPUs (cuda): placement matches them by PCI bus id and their
  // links are real. Otherwise (cpu) a device drives no GPU on the live machine and, on a
  // described server, stands in for one, its copies emulating that GPU's link.
  bool real_gpus = false;
  // A device of this backend sharing its GPU with other jobs (memory.share,
  // DeviceOptions::map_on_use) holds its heap's memory in granules of this many bytes (Note
  // [Backing a heap on use] in device/heap.h): what it holds exceeds its heap's in_use by less
  // than one granule in the trainer's layout. 0: exactly its heap's in_use.
  uint64_t shared_granule = 0;
};

// The granule a device sharing its GPU holds memory in: the CUDA driver's allocation granularity
// must divide it (it is 2 MiB on every GPU since Pascal), and the CPU backend's emulated device
// takes the same, so that it holds what a GPU would.
inline constexpr uint64_t kSharedGranule = uint64_t{2} << 20;

BackendTraits backend_traits(Backend backend);

// Whether a device of options.backend at options.ordinal can be created here (built, and for
// cuda a GPU at that ordinal).
bool device_present(const DeviceOptions& options);

// Note [Default device rates]
// Planning without measurements assumes, for cuda, a V100/A100-class GPU at realistic
// utilisation (10 TFLOP/s, 700 GB/s) behind PCIe gen3 x16 as measured (12 GB/s per direction);
// for cpu, 50 GFLOP/s per kernel thread (options.cpu.threads, 0: every core), 10 GB/s and a
// memcpy on a copy thread (8 GB/s). An emulated link rate (options.cpu.link_gbps, from
// device.copy_gbps) replaces the link's.
DeviceRates default_device_rates(const DeviceOptions& options);

// Whether a device of these options keeps its timed algorithm choices in a file across
// processes (options.cuda.algorithm_file): a deterministic cuda run with timed search, whose
// choices must be the same in every process (Note [Timed choices across processes] in
// device/cuda/algorithm_cache.h).
bool keeps_algorithm_choices(const DeviceOptions& options);

// Whether the cuda backend runs kernel `kind` in `dtype` storage, from its kernel table (a pure
// function: no GPU needed); false in a build without the CUDA backend.
bool cuda_kernel_runs(KernelKind kind, DType dtype);

// Kernels for planning, which asks them for workspace sizes and which kernels run in bf16.
struct PlanningKernels {
  std::unique_ptr<Kernels> kernels;
  // Empty when the backend's own kernels answer; else what stands in for them, in words.
  std::string substitute;
};

// The kernels of options.backend without a device, with heuristic algorithm choice (a plan is
// asked for many batch sizes). When that backend cannot size its workspaces here (not built, no
// GPU), the CPU kernels stand in, and a cuda plan assumes cuDNN's zero-workspace algorithms and
// answers supports() from the CUDA kernel table where this build has it (Note [Workspaces
// without a GPU] in device/planning_kernels.cc).
PlanningKernels create_planning_kernels(DeviceOptions options);

}  // namespace ferry
