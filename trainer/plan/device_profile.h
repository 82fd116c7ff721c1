// A cost model measured on the device itself: every distinct kernel launch of a model's tape
// timed once per (device, geometry), and the pinned link per direction, cached as JSON in the
// run directory so the next run on the same device reuses it.
// Invariant: a step gets a measured time only when every kernel it launches was measured;
// otherwise the planner costs it with the FLOP model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "device/device.h"
#include "prefetch/cost_model.h"
#include "trainer/config/config.h"
#include "trainer/exec/lower.h"
#include "trainer/model/graph.h"
#include "trainer/optim/optimizer.h"

namespace ferry {

struct ProfileOptions {
  std::string cache_path;   // JSON cache; "" = measure without caching
  std::string device_key;   // the device's identity in the cache (its name plus link emulation)
  bool write_cache = true;  // rank 0 writes; the others only read
  // memory.optimizer host or auto: the host update to time (Note [A timed host update] in
  // trainer/plan/host_update_timing.h); unset: not timed.
  std::optional<OptimizerOptions> host_update;
};

struct DeviceProfile {
  std::shared_ptr<const MeasuredSteps> steps;
  double link_gbps_to_host = 0, link_gbps_to_device = 0;  // 0 when not measured
  double host_update_gbps = 0;  // the host update's streams (ProfileOptions::host_update); 0: not
  int kernels = 0;              // distinct kernel launches of the tape
  int from_cache = 0;           // of which the cache had
  int failed = 0;  // could not be timed (no memory, no kernel): FLOP model for their steps
  std::string first_failure;  // why the first of them could not be timed
  int steps_measured = 0;     // tape steps with a measured time
  int steps_total = 0;
  double seconds = 0;              // wall time spent measuring
  double predicted_compute_s = 0;  // sum of measured step times (steps without one excluded)
  std::string cache_path;
};

// The optimizer's launch over `param_floats` parameters (pointers null), as Optimizer::step
// makes it: what the update step costs.
KernelArgs update_kernel(const Config& config, int64_t param_floats);

// The device's identity for the profile cache: its name without the ordinal, plus the emulated
// link rate (cpu).
std::string profile_device_key(const Device& device, double link_gbps);

// Times what `lowered` launches on `device` (reusing and extending the cache) and the link per
// direction. Leaves device memory as it was, with its peak statistic reset.
DeviceProfile measure_device(Device& device, const Graph& graph, const Lowered& lowered,
                             const std::optional<KernelArgs>& update,
                             const ProfileOptions& options);

// Puts a profile into a cost model: measured step times, the FLOP model's estimates of other
// steps scaled to them (calibrate_estimates; `tape` is the one measured), the host update's rate
// when timed, and the link rates unless `keep_link` (memory.link_gbps was set explicitly).
void apply_profile(const DeviceProfile& profile, const Tape& tape, CostModel& cost, bool keep_link);

// One line for logs: "measured on cpu:0 (...): 41 kernels (41 cached), 88/90 steps, link
// d2h 7.9 GB/s h2d 8.1 GB/s, 1.2 s".
std::string describe_profile(const DeviceProfile& profile);

}  // namespace ferry
