// The planner's cost model and its simulator: step times from FLOPs and bytes, transfers that
// queue on one copy stream per direction at the link's bandwidth, and the stalls that result
// when compute must wait for a copy. The same code evaluates a plan for this machine or for a
// server described by a hardware profile.
#pragma once

#include <cstdint>
#include <vector>

#include "prefetch/tape.h"

namespace ferry {

struct CostModel {
  // Per op kind ("conv2d", "linear", "batchnorm2d"; recompute steps count as their op): FLOP/s
  // and memory GB/s replacing compute_flops and memory_gbps for that kind's steps (a hardware
  // profile's rates). Empty: compute_flops and memory_gbps for every step.
  std::vector<std::pair<std::string, double>> op_flops;
  std::vector<std::pair<std::string, double>> op_memory_gbps;
  double compute_flops = 1e11;    // sustained FLOP/s of the compute stream
  double memory_gbps = 20;        // device memory bandwidth for memory-bound steps (GB/s)
  double link_gbps = 12;          // host<->device bandwidth per direction (GB/s)
  double step_overhead_s = 5e-6;  // launch cost of one step

  // Predicted seconds of one tape step.
  double step_seconds(const TapeStep& step, const Tape& tape) const;
  double transfer_seconds(uint64_t bytes) const {
    return static_cast<double>(bytes) / (link_gbps * 1e9);
  }
};

// One copy the simulator schedules: issued when compute finishes step `issue_after` (or before
// step `issue_before` starts: the later of the two), and waited for by compute before step
// `wait_before`.
struct SimTransfer {
  bool to_host = true;
  uint64_t bytes = 0;
  int issue_after = -1;  // step whose end the copy waits for (-1: none)
  int wait_before = -1;  // step that waits for the copy
};

struct Prediction {
  double compute_seconds = 0;  // sum of step times
  double step_seconds = 0;     // with stalls
  double stall_seconds = 0;    // compute waiting for copies
};

// Runs the tape against a virtual clock: steps in order on the compute stream, copies FIFO on
// their direction's stream. Transfers are processed in the order given (per direction).
Prediction simulate(const Tape& tape, const CostModel& cost,
                    const std::vector<SimTransfer>& transfers);

}  // namespace ferry
