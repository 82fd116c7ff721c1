// The planner's cost model and its simulator: step times from FLOPs and bytes, transfers that
// queue on one copy stream per direction at the link's bandwidth, and the stalls that result
// when compute must wait for a copy. The same code evaluates a plan for this machine or for a
// server described by a hardware profile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "prefetch/tape.h"

namespace ferry {

// Seconds each tape step took on a real device (Note [Measured step times] in cost_model.cc),
// keyed by measured_step_key(): what the planner uses in place of the FLOP model when present.
struct MeasuredSteps {
  std::map<std::string, double> seconds;
  std::string device;  // where they were measured: "cuda:0 (NVIDIA H100 80GB HBM3)"
  // What scales the FLOP model's time of a step that has no measurement (Note [Estimates scaled
  // to the measured steps] in cost_model.cc), by estimate_scale_key(); "" = over every measured
  // step. Empty: the FLOP model unscaled.
  std::map<std::string, double> estimate_scale;
};

// The identity of a step's work on one tape shape: phase (a recompute counts as its forward),
// name, FLOPs and the bytes it reads (and the load step's bytes written). Equal keys mean the
// same kernels on the same shapes.
std::string measured_step_key(const TapeStep& step, const Tape& tape);

// The kind of work a step's estimate is scaled as: its op and phase (a recompute counts as its
// forward) as "op|phase number": "conv2d|2" is a convolution's backward.
std::string estimate_scale_key(const TapeStep& step);

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
  // Bytes per second the host's optimizer update streams (weights, gradients, state; read and
  // written), in GB/s: memory.optimizer host (Note [Model state per rank] in
  // trainer/plan/model_state.h).
  double host_update_gbps = 10;

  // Measured link rates per direction (GB/s); 0 = link_gbps.
  double link_gbps_to_host = 0;
  double link_gbps_to_device = 0;
  // Measured per-step times; a step without one falls back to the FLOP model.
  std::shared_ptr<const MeasuredSteps> measured;

  // Predicted seconds of one tape step: its measured time when known, else the FLOP model's
  // time scaled as measured->estimate_scale says.
  double step_seconds(const TapeStep& step, const Tape& tape) const;
  // The FLOP model's time of a step, unscaled: the larger of its FLOPs and its bytes over their
  // rates, plus the launch cost.
  double flop_seconds(const TapeStep& step, const Tape& tape) const;
  // The measured time of `step`, or a negative number when there is none.
  double measured_seconds(const TapeStep& step, const Tape& tape) const;
  // Seconds to move `bytes` in one direction, and out and back again.
  double transfer_seconds(uint64_t bytes, bool to_host) const {
    const double rate = to_host ? link_gbps_to_host : link_gbps_to_device;
    return static_cast<double>(bytes) / ((rate > 0 ? rate : link_gbps) * 1e9);
  }
  // Seconds in the slower direction.
  double transfer_seconds(uint64_t bytes) const {
    return std::max(transfer_seconds(bytes, true), transfer_seconds(bytes, false));
  }
  double round_trip_seconds(uint64_t bytes) const {
    return transfer_seconds(bytes, true) + transfer_seconds(bytes, false);
  }
};

// Sets measured.estimate_scale from `tape`, the tape its times were measured on: per kind of
// step, the measured seconds over `cost`'s unscaled FLOP model of the same steps, and over all.
void calibrate_estimates(MeasuredSteps& measured, const Tape& tape, const CostModel& cost);

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
