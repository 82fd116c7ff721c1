// Hardware profiles: what one GPU model computes and moves, for planning and simulating servers
// this machine is not (`--hardware NAME|FILE`). A profile gives the planner's CostModel (per-op
// rates) and the GPU's host-link rate per direction with its duplex factor. Invariant: every
// rate of a loaded profile is finite and > 0, and duplex_factor is in (0, 1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/precision.h"
#include "links/fair_rates.h"
#include "prefetch/cost_model.h"

namespace ferry {

struct HardwareProfile {
  std::string name;    // "h100-pcie5"
  std::string gpu;     // "NVIDIA H100 80GB HBM3"
  std::string source;  // the file it was read from
  uint64_t device_memory = 0;
  // link_gbps: the slower direction of the GPU's own link; host_update_gbps: host.update_gbps,
  // the bytes per second one GPU's share of the host's CPUs streams through the optimizer's
  // update under memory.optimizer host (CostModel's default when the file states none).
  CostModel cost;
  LinkCapacity gpu_link;      // the GPU's own host link as measured (GB/s per direction)
  bool duplex_given = false;  // the file states link.duplex_factor (else gpu_link has 1.0)
  double nominal_gbps = 0;    // that link's raw rate per direction
  double nic_gbps = 0;        // one network adapter's rate per direction (GB/s); 0: not stated
  // compute.bf16: the dense bf16 tensor-core peak (FLOP/s; 0: the GPU has no bf16, e.g. V100)
  // and the per-op rates that replace cost.op_flops under device.precision bf16.
  double bf16_peak_flops = 0;
  std::vector<std::pair<std::string, double>> bf16_op_flops;
  // The share of a PCIe link's raw rate copies reach, per direction (gpu_link / nominal).
  double efficiency(TransferDirection d) const;
};

// The cost model of `profile` for a run in `precision`: cost, with compute.bf16's per-op rates in
// place of the fp32 ones under bf16. A profile without compute.bf16 refuses bf16 (ConfigError
// naming the profile).
CostModel profile_cost(const HardwareProfile& profile, Precision precision);

// The shipped profiles' names (configs/hardware/*.yaml), sorted.
std::vector<std::string> hardware_profile_names();

// Loads `name_or_file`: a path ending in .yaml/.yml, or a shipped profile's name, looked up in
// configs/hardware/ under the working directory and then under the source tree. Throws
// ConfigError naming `key` (e.g. "--hardware") for an unknown name, or the file and key for a
// malformed profile.
HardwareProfile load_hardware_profile(const std::string& name_or_file,
                                      const std::string& key = "--hardware");

}  // namespace ferry
