// A job mix: several configs sharing one GPU, each arriving at its own time for some steps, as
// `trainer simulate --mix FILE` reads it (Note [A mix file]). Invariant: a loaded mix has >= 1
// job, with distinct names, each with a config path, a finite arrival time >= 0 and steps >= 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jobs/share_controller.h"

namespace ferry {

// Note [A mix file]
// A YAML map:
//   memory: 80GiB            # the GPU's memory the jobs share; default: the first job's
//                            # device.memory (as the node's job ledger takes it)
//   objective: throughput    # memory.share_objective of the division; default: the first job's
//   jobs:                    # one entry per job, in any order
//     - config: configs/simulate/mix/resnet18.yaml   # relative to the working directory
//       set: [data.batch_size=512]                   # key=value overrides (optional)
//       name: resnet18       # optional; default: the config's file stem (made unique)
//       arrive_s: 0          # when it starts, seconds of simulated time (default 0)
//       steps: 2000          # how many steps it trains (default: its run.steps)
// Unknown keys, a repeated key, a missing config and values out of range are errors naming the
// file, its line and the key.
struct MixJobSpec {
  std::string name;
  std::string config;                  // a config file
  std::vector<std::string> overrides;  // key=value
  double arrive_s = 0;
  int64_t steps = 0;  // 0: the config's run.steps
};

struct MixSpec {
  std::string file;
  uint64_t memory = 0;  // 0: the first job's device.memory
  std::optional<ShareObjective> objective;
  std::vector<MixJobSpec> jobs;
};

// Reads a mix file. Throws ConfigError (FILE:LINE: KEY: what) on anything malformed; the jobs'
// configs are read by the simulation, not here.
MixSpec load_mix(const std::string& file);

}  // namespace ferry
